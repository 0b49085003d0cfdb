"""`tune evaluate`: the paper's tables for a model and the configs given, with bootstrap intervals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tuner.cli.console import friendly_errors, make_console, quiet_libraries, setup_logging
from tuner.cli.options import (
    CONFIGS,
    DATA,
    MAX_SEED,
    OUTPUT,
    SCORING,
    AllowModelMismatch,
    BatchSize,
    Dataset,
    Force,
    Model,
    OptionsFile,
    PaddingSideOption,
    PoolingOption,
    Resamples,
    TrustRemoteCode,
)
from tuner.common.messages import shown
from tuner.common.options import EvaluateRequest, Scoring


def evaluate(
    model: Model = "minilm",
    pooling: PoolingOption = None,
    padding_side: PaddingSideOption = None,
    dataset: Dataset = "wikipos-test",
    config: Annotated[
        list[Path] | None,
        typer.Option(metavar="YAML", help="Exported YAML config(s) to compare; repeatable.", rich_help_panel=CONFIGS),
    ] = None,
    calibration: Annotated[
        list[str] | None,
        typer.Option(
            metavar="FIELD=VALUE,...",
            help="An inline config row, e.g. strength=0.5,layers=last (over the paper default); repeatable.",
            rich_help_panel=CONFIGS,
        ),
    ] = None,
    paper_default: Annotated[
        bool, typer.Option(help="Add the paper's default config row.", rich_help_panel=CONFIGS)
    ] = True,
    sea: Annotated[bool, typer.Option(help="Add the Segment Embed Average baseline.", rich_help_panel=CONFIGS)] = True,
    general: Annotated[
        str | None,
        typer.Option(help="General-retrieval set for the original/shuffled table.", rich_help_panel=DATA),
    ] = "wikipos-general",
    shuffled: Annotated[bool, typer.Option(help="Shuffled-sentence robustness check.", rich_help_panel=DATA)] = True,
    bootstrap: Resamples = 1000,
    seed: Annotated[
        int,
        typer.Option(
            min=0, max=MAX_SEED, help="Seed of the bootstrap and of the sentence shuffling.", rich_help_panel=SCORING
        ),
    ] = 0,
    markdown: Annotated[
        Path | None, typer.Option(help="Also write the tables as Markdown here.", rich_help_panel=OUTPUT)
    ] = None,
    json_output: Annotated[
        Path | None,
        typer.Option(
            "--json",
            help="Also write every figure (0–1 scale; per group and stratum, or per PosIR bucket; with counts) as "
            "JSON here.",
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    trust_remote_code: TrustRemoteCode = False,
    scoring: Annotated[
        Scoring,
        typer.Option(
            help="'posfair': the thirds within strata, HM, PSI (Table 1); 'posir': PosIR's own figures (nDCG@10 and "
            "PSI over 20 position bins, overall and per token-length bucket Q1–Q4, a <language> folder's domains "
            "pooled) on a posir:PATH dataset.",
            rich_help_panel=SCORING,
        ),
    ] = "posfair",
    posir_instruction: Annotated[
        bool | None,
        typer.Option(
            "--posir-instruction/--no-posir-instruction",
            help="Prefix every query with PosIR's instruction instead of the model's own prompt, as PosIR's "
            "evaluation does for every model; default: on with --scoring posir, so its figures compare with the "
            "published ones.",
            show_default=False,
            rich_help_panel=SCORING,
        ),
    ] = None,
    allow_model_mismatch: AllowModelMismatch = False,
    force: Force = False,
    batch_size: BatchSize = None,
    options: OptionsFile = None,
) -> None:
    """Print the paper's Table 1 (and Table 3) for a model: baseline, configs, SEA, with bootstrap intervals; or, with
    --scoring posir, PosIR's own figures.

    Example: tune evaluate --model minilm --dataset wikipos-test --config best.yaml"""
    setup_logging()
    with friendly_errors():
        from tuner.common.files import (
            EVALUATION_JSON,
            EVALUATION_MARKDOWN,
            Protected,
            check_output,
            stores,
            write_atomically,
        )
        from tuner.data import check_name, dataset_files
        from tuner.engine.specs import check_model_name, model_files

        spec = check_model_name(model, pooling)
        for name, flag in ((dataset, "--dataset"), (general, "--general")):
            if name:
                check_name(name, flag)
        read = [
            Protected(model_files(spec), f"--model {model}"),
            *(Protected(path, "--config") for path in config or []),
            *(Protected(path, f"--dataset {dataset}") for path in dataset_files(dataset)),
            *(Protected(path, f"--general {general}") for path in (dataset_files(general) if general else [])),
            *stores(None, None),
        ]
        asked = ((markdown, "--markdown", EVALUATION_MARKDOWN), (json_output, "--json", EVALUATION_JSON))
        outputs = [(path, flag, kind) for path, flag, kind in asked if path]
        for path, flag, kind in outputs:
            check_output(path, flag, kind, protected=read, force=force)
        request = EvaluateRequest(
            model=model,
            pooling=pooling,
            padding_side=padding_side,
            trust_remote_code=trust_remote_code,
            allow_model_mismatch=allow_model_mismatch,
            dataset=dataset,
            configs=tuple(config or ()),
            inline=tuple((inline, parse_inline(inline)) for inline in calibration or []),
            paper_default=paper_default,
            sea=sea,
            general=general,
            shuffled=shuffled,
            bootstrap=bootstrap,
            seed=seed,
            batch_size=batch_size,
            scoring=scoring,
            posir_instruction=posir_instruction,
        )
        request.check()
        from tuner.report.evaluate import evaluate as run_evaluate
        from tuner.report.evaluate import render, to_dict, to_markdown

        quiet_libraries()
        table = run_evaluate(request)
        render(table, make_console())
        for path, flag, kind in outputs:
            text = to_markdown(table) if kind is EVALUATION_MARKDOWN else json.dumps(to_dict(table), indent=1)
            write_atomically(path, text, kind=kind, force=force, flag=flag)


def parse_inline(text: str) -> dict[str, object]:
    """'strength=0.5,layers=[4,5]' → {'strength': 0.5, 'layers': [4, 5]}; values read as YAML
    (`tuner.common.safe_yaml`); commas inside brackets belong to the value."""
    from tuner.common.safe_yaml import YamlError, loads

    parts, depth, start = [], 0, 0
    for index, char in enumerate(text + ","):
        depth += (char in "[{") - (char in "]}")
        if char == "," and depth <= 0:
            parts.append(text[start:index])
            start = index + 1
    pairs = [part.partition("=") for part in parts if part.strip()]
    if not pairs or depth != 0 or any(not sep or not key.strip() for key, sep, _ in pairs):
        raise ValueError(
            f"--calibration {shown(text)}: write field=value pairs, e.g. strength=0.5,layers=last or layers=[4,5]"
        )
    values = {}
    for key, _, value in pairs:
        try:
            values[key.strip()] = loads(value, f"--calibration {key.strip()}")
        except YamlError as error:
            raise ValueError(str(error)) from None
    return values
