"""The `tune` command line: run (the default), evaluate, diagnose, export, encode, ui."""

from __future__ import annotations

import json
import logging
import math
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table
from typer.core import TyperCommand, TyperGroup

from tuner.common.messages import UserError, shown
from tuner.common.options import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_MAX_DRIFT,
    DEFAULT_PROFILE_DOCS,
    DEFAULT_TRIALS,
    HEARTBEAT_SECONDS,
    Budget,
    EvaluateRequest,
    PaddingSide,
    Pooling,
    Scoring,
    parse_bytes,
    parse_limit,
)

if TYPE_CHECKING:
    import numpy as np
    from typer._click.core import Context as _ClickContext
    from typer._click.formatting import HelpFormatter as _ClickHelpFormatter

    from tuner.tuning.run import TuneOutcome
    from tuner.tuning.search_space import SearchSpace
    from tuner.tuning.settings import TuneSettings

# Only the standard library, typer, rich and tuner.common load with this module: `tune -h` and option errors
# answer without torch, transformers, MLflow or Optuna (tests/test_cli_speed.py). Commands import their work.

PIPED_WIDTH = 160  # rich assumes 80 columns when not on a terminal, which truncates the result tables


def _console(stderr: bool = False) -> Console:
    """A rich console; redirected output (a file, a CI log) gets PIPED_WIDTH columns so tables stay whole."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else PIPED_WIDTH)


console = _console(stderr=True)
log = logging.getLogger("tuner")

if not TYPE_CHECKING:  # typer's own copy of click's classes; mypy takes no base class from an attribute, so is told their names above
    _ClickContext = TyperCommand.context_class
    _ClickHelpFormatter = _ClickContext.formatter_class


class _HelpFormatter(_ClickHelpFormatter):
    """click's help, wrapped between words only: a flag such as --max-general-drop or a name such as
    FineWeb-PosQ is never split at its hyphens (click's wrapper breaks on them)."""

    def _wrap(self, text: str, width: int, indent: str = "") -> list[str]:
        wrapper = textwrap.TextWrapper(
            width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False
        )
        return [line for paragraph in text.split("\n\n") for line in [*wrapper.wrap(" ".join(paragraph.split())), ""]][:-1]

    def write_text(self, text: str) -> None:
        self.write("\n".join(self._wrap(text, self.width, " " * self.current_indent)) + "\n")

    def write_dl(self, rows: Iterable[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
        rows = list(rows)
        first_col = min(max((len(first) for first, _ in rows), default=0), col_max) + col_spacing
        for first, second in rows:
            self.write(f"{'':>{self.current_indent}}{first}")
            lines = self._wrap(second, max(self.width - first_col - self.current_indent, 10)) if second else []
            if not lines:
                self.write("\n")
                continue
            pad = " " * (first_col + self.current_indent)
            self.write(" " * (first_col - len(first)) if len(first) <= first_col - col_spacing else "\n" + pad)
            self.write(lines[0] + "\n" + "".join(f"{pad}{line}\n" if line else "\n" for line in lines[1:]))


class _Context(_ClickContext):
    formatter_class = _HelpFormatter


class _Command(TyperCommand):
    context_class = _Context


class _RunByDefault(TyperGroup):
    """`tune --model x` means `tune run --model x`: run is the default subcommand."""

    context_class = _Context

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h", "--version")):
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_RunByDefault,
    help="Tune attention calibration per model for position-fair dense retrieval (posfair). "
    "`tune` alone is `tune run`: it tunes all-MiniLM-L6-v2 on the embedded WikiPos.",
    epilog="Examples: tune --trials 4 · tune --model bge-m3 · tune ui · tune encode --config best.yaml --input docs.jsonl --output emb.npy",
    no_args_is_help=False,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,  # click's help: wraps at the terminal's width between words; flags without a metavar
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from tuner import __version__

        typer.echo(f"posfair {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print posfair's version and exit.")] = False,
) -> None:
    """Tune attention calibration per model for position-fair dense retrieval (posfair)."""


def _options_file(ctx: typer.Context, value: Path | None) -> Path | None:
    """Values from a YAML options file become the defaults; flags still win."""
    if value is None:
        return None
    from tuner.common.safe_yaml import YamlError, load_file

    try:
        data = load_file(value) or {}
    except YamlError as error:
        raise typer.BadParameter(str(error)) from None
    if not isinstance(data, dict):
        raise typer.BadParameter(f"{value}: expected a mapping of option: value")
    params = {p.name: p for p in ctx.command.params}
    normalised: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, option in data.items():
        name = str(key).replace("-", "_")
        if name in spelled:
            raise typer.BadParameter(
                f"{value}: {shown(spelled[name])} and {shown(str(key))} are one option (--{name.replace('_', '-')}); keep one"
            )
        normalised[name], spelled[name] = option, str(key)
    unknown = sorted(set(normalised) - set(params))
    if unknown:
        raise typer.BadParameter(f"{value}: unknown option(s) {shown(unknown)}; known: {sorted(set(params) - {'options'})}")
    for key, option in normalised.items():  # click would read `true` as 1 for a number
        if isinstance(option, bool) and not getattr(params[key], "is_flag", False):
            raise typer.BadParameter(f"{value}: {key} is {option!r}, a boolean; write a value (see --{key.replace('_', '-')} in --help)")
    ctx.default_map = {**(ctx.default_map or {}), **normalised}
    return value


OptionsFile = Annotated[
    Path | None,
    typer.Option(
        "--options",
        help="YAML file of options (keys as the long flags); flags override it.",
        is_eager=True,
        callback=_options_file,
        exists=True,
        dir_okay=False,
    ),
]
Model = Annotated[str, typer.Option(help="Registry alias (minilm, bge-m3, qwen3-embedding-0.6b, ...) or a local folder.")]
Dataset = Annotated[
    str,
    typer.Option(
        help="wikipos-dev, wikipos-test, wikipos-general, squad-tune, squad-test, fineweb-posq, or posir:PATH, jsonl:PATH, "
        "beir:PATH, squad:PATH (a file in SQuAD's format), probe:PATH (a probe built from a JSONL or BEIR folder)."
    ),
]
TrackingUri = Annotated[str | None, typer.Option(help="MLflow tracking server; default: a SQLite store under ./mlruns.")]
Storage = Annotated[
    str | None,
    typer.Option(
        help="Optuna storage: a database URL (postgresql://USER:PASS@HOST/DB, mysql+pymysql://..., sqlite:///PATH) or journal:PATH "
        "(a journal file, for workers on a shared file system without a database server); default: sqlite:///mlruns/optuna.db."
    ),
]
BatchSize = Annotated[int | None, typer.Option(min=1, help="Documents per forward pass; default: chosen from the device's free memory.")]
BatchTokens = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Padded tokens per forward pass (rows × longest text); default for long-passage models: chosen from the device's free memory.",
    ),
]
MAX_SEED = 2**32 - 1
Resamples = Annotated[int, typer.Option(min=1, help="Bootstrap resamples for the intervals.")]
TrustRemoteCode = Annotated[bool, typer.Option("--trust-remote-code", help="Allow a model's own code from its hub repository to run.")]
# What loads any model, on every command that takes --model (a registry alias knows its own).
PoolingOption = Annotated[Pooling | None, typer.Option("--pooling", help="How a model outside the registry pools its vectors.")]
PaddingSideOption = Annotated[
    PaddingSide | None,
    typer.Option("--padding-side", help="Where its tokenizer pads; default: the registry's, else left for last pooling, right otherwise."),
]
Force = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Replace an existing output that posfair did not write, or a read-only one (never an input, a store, a database, a folder or a device).",
    ),
]
AllowModelMismatch = Annotated[
    bool,
    typer.Option(
        "--allow-model-mismatch",
        help="Use a config even where its pooling, padding or weights differ from the model it names (refused by default).",
    ),
]


@app.command(cls=_Command, short_help="Tune one model (the default command).")
def run(
    model: Model = "minilm",
    pooling: PoolingOption = None,
    padding_side: PaddingSideOption = None,
    dataset: Annotated[
        str | None,
        typer.Option(
            help="Benchmark to tune on (see `tune evaluate --help`); default: fineweb-posq for bge-m3, qwen3-embedding-* and gte-multilingual-base, wikipos-dev otherwise."
        ),
    ] = None,
    trials: Annotated[
        int,
        typer.Option(
            help="Trials to run, complete or pruned (failed and repeated ones do not count), unless --budget ends the study first."
        ),
    ] = DEFAULT_TRIALS,
    hm_floor: Annotated[
        str,
        typer.Option(
            help="'significant' (the lower end of HM's 95% interval reaches the uncalibrated HM: a gain beyond noise), 'baseline' (HM at least the uncalibrated HM), a value like 0.52, or relative like -1%."
        ),
    ] = "significant",
    max_ndcg_drop: Annotated[
        str,
        typer.Option(
            help="How far aggregate nDCG@10 may fall below the uncalibrated model's (0–1 scale, e.g. 0.005): on the tuning "
            "split, and significantly on each other tuning structure; 'none' lifts the constraint."
        ),
    ] = "0",
    max_crops_psi: Annotated[
        str,
        typer.Option(
            help="PSI on the tuning passages re-cut shorter (WikiPos sets) may be at most this multiple of the uncalibrated PSI there, e.g. 1 (no less fair than no calibration); 'none' (the default): not constrained (the crops are still scored as a structure)."
        ),
    ] = "none",
    max_reversal: Annotated[
        str,
        typer.Option(
            help="How far a trial may turn the bias round on a tuning structure (tilt against the uncalibrated direction, where that direction is beyond noise); 'none' lifts it."
        ),
    ] = "0",
    max_drift: Annotated[
        str,
        typer.Option(
            help="How far a trial may move the document vectors from the uncalibrated ones, as a multiple of the paper "
            "default's drift on the same structure (e.g. 2: twice as far); 'none' lifts it."
        ),
    ] = f"{DEFAULT_MAX_DRIFT:g}",
    structures: Annotated[
        bool,
        typer.Option(
            help="Score trials on the tuning passages' other structures too (WikiPos: crops, openings, packed; other sets: their shorter and longer half)."
        ),
    ] = True,
    prune: Annotated[bool, typer.Option(help="Stop a trial between structures once it cannot win.")] = True,
    bisect: Annotated[
        bool,
        typer.Option(
            help="After a trial too strong for its config (it reverses the bias, loses nDCG@10 or is over the drift limit), try the same config at a weaker λ."
        ),
    ] = True,
    paper_siblings: Annotated[
        bool,
        typer.Option(
            help="Run the paper's default at its cheaper depths (the last layer, the last 25%) right after it, before the sampler draws."
        ),
    ] = True,
    grid: Annotated[str | None, typer.Option(help="'paper': run exactly the paper's 24 configs (its grid), unpruned.")] = None,
    sampler: Annotated[
        str,
        typer.Option(
            help="How the search draws trials: 'cost-tpe' (TPE that weighs each config by its cost under --budget), "
            "'tpe' (the same without the cost) or 'gp' (Optuna's GPSampler); all three respect the constraints."
        ),
    ] = "cost-tpe",
    budget: Annotated[
        str,
        typer.Option(
            help="Layer-tokens (padded tokens × layers run) the study may spend, baselines included, held-out scoring apart: "
            "'grid/3' (a third of what the paper's grid costs on this model and data), a number like 5M, or 'none' (--trials alone); "
            "--grid paper runs all its configs whatever this says."
        ),
    ] = "grid/3",
    selection: Annotated[
        str,
        typer.Option(
            help="How the winner is named among the feasible trials within one standard error of the lowest PSI: 'one-se' (the "
            "mildest), 'one-se-fairest' (the lowest mean PSI over the structures), 'one-se-hm' (the highest HM); or 'lowest' "
            "(the lowest PSI)."
        ),
    ] = "one-se",
    heldout: Annotated[
        str | None,
        typer.Option(
            help="Held-out benchmark(s) for the final report, comma-separated; 'auto': WikiPos-test and the WikiPos transfer sets for WikiPos-dev, squad-test for squad-tune, FineWeb-PosQ's held-out part for FineWeb-PosQ, none for other sets; 'none' for none."
        ),
    ] = "auto",
    general: Annotated[
        str | None,
        typer.Option(
            help="General-retrieval check, e.g. wikipos-general: its nDCG@10 change is logged every trial; a constraint only with --max-general-drop."
        ),
    ] = None,
    max_general_drop: Annotated[
        float | None,
        typer.Option(
            help="Make --general a constraint: its nDCG@10 may fall at most this much below the uncalibrated model's (0–1 scale, e.g. 0.005)."
        ),
    ] = None,
    pareto: Annotated[bool, typer.Option("--pareto", help="Two-objective search (PSI down, HM up); reports the front.")] = False,
    seed: Annotated[int, typer.Option(min=0, max=MAX_SEED, help="Seed of the sampler and the held-out bootstrap.")] = 0,
    study_name: Annotated[str | None, typer.Option(help="Default: model--dataset--seedN.")] = None,
    storage: Storage = None,
    tracking_uri: TrackingUri = None,
    output: Annotated[Path | None, typer.Option(help="Where to write the winner's YAML; default mlruns/exports/STUDY.yaml.")] = None,
    force: Force = False,
    space: Annotated[
        Path | None, typer.Option(help="YAML search space (strength_step, depths, basket_sizes, variants, weight_low/high).")
    ] = None,
    batch_size: BatchSize = None,
    batch_tokens: BatchTokens = None,
    profile_docs: Annotated[int, typer.Option(help="Documents in each trial's attention profile.")] = DEFAULT_PROFILE_DOCS,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples for the held-out intervals.")] = 1000,
    revision: Annotated[str | None, typer.Option(help="Hub revision of the model.")] = None,
    trust_remote_code: TrustRemoteCode = False,
    cache_budget: Annotated[
        str | None,
        typer.Option(
            help=f"Disk for cached layer inputs (what trials resume from; read into memory while it fits), e.g. 4GB or 0 (none); default: {DEFAULT_CACHE_BYTES // 2**30} GiB, less where the disk has less free."
        ),
    ] = None,
    workers: Annotated[int, typer.Option(help="Local worker processes on this study (each loads the model).")] = 1,
    worker: Annotated[
        bool, typer.Option("--worker", help="Only run trials of a study another `tune` coordinates (other machines).")
    ] = False,
    job_array: Annotated[
        bool,
        typer.Option(
            "--job-array",
            help="Run as one task of a job array (sbatch --array, a Kubernetes Indexed Job), every task with the same command: "
            "the first task coordinates, the others run trials as --worker (index from SLURM_ARRAY_TASK_ID or JOB_COMPLETION_INDEX).",
        ),
    ] = False,
    heartbeat: Annotated[
        int,
        typer.Option(
            help="Seconds between worker heartbeats; a trial silent for 3 of them (on a journal: and for 30 s plus one) is failed and re-run."
        ),
    ] = HEARTBEAT_SECONDS,
    options: OptionsFile = None,
) -> None:
    """Tune one model (the default command): Optuna search, MLflow tracking, exported YAML, registered model.

    Example: tune --model minilm --trials 8 --output best.yaml"""
    _setup_logging()
    with _friendly_errors():
        from tuner.tuning.settings import TuneSettings, job_array_task

        settings = TuneSettings(
            model=model,
            pooling=pooling,
            padding_side=padding_side,
            dataset=dataset,
            heldout=heldout,
            general=general,
            max_general_drop=max_general_drop,
            trials=trials,
            seed=seed,
            hm_floor=hm_floor,
            max_ndcg_drop=parse_limit(max_ndcg_drop, "--max-ndcg-drop", 1, "0.005, half a point of nDCG@10"),
            max_crops_psi=parse_limit(max_crops_psi, "--max-crops-psi", math.inf, "1, no less fair than uncalibrated"),
            max_reversal=parse_limit(max_reversal, "--max-reversal", math.inf, "0, the end never favoured where the beginning was"),
            max_drift=parse_limit(max_drift, "--max-drift", math.inf, "2, twice as far as the paper default"),
            structures=structures,
            prune=prune,
            bisect=bisect,
            paper_siblings=paper_siblings,
            grid=grid,
            sampler=sampler,
            budget=Budget.parse(budget),
            selection=selection,
            pareto=pareto,
            storage=storage,
            study_name=study_name,
            tracking_uri=tracking_uri,
            output=output,
            force=force,
            inputs=tuple(path for path in (space, options) if path is not None),
            batch_size=batch_size,
            batch_tokens=batch_tokens,
            profile_docs=profile_docs,
            bootstrap=bootstrap,
            trust_remote_code=trust_remote_code,
            revision=revision,
            workers=workers,
            worker=worker,
            array_task=job_array_task(job_array, worker),
            heartbeat=heartbeat,
            cache_budget=parse_bytes(cache_budget),
            space=_space_from(space),  # type: ignore[arg-type]  # None: TuneSettings makes the default after its checks
        )
        _quiet_libraries()
        _stop_on_sigterm()
        _print_settings(settings)
        from tuner.tuning.run import tune

        outcome = tune(settings)
    if outcome is not None:
        _print_outcome(outcome)


@app.command(cls=_Command, short_help="The paper's tables for a model, with intervals.")
def evaluate(
    model: Model = "minilm",
    pooling: PoolingOption = None,
    padding_side: PaddingSideOption = None,
    dataset: Dataset = "wikipos-test",
    config: Annotated[list[Path] | None, typer.Option(metavar="YAML", help="Exported YAML config(s) to compare; repeatable.")] = None,
    calibration: Annotated[
        list[str] | None,
        typer.Option(
            metavar="FIELD=VALUE,...", help="An inline config row, e.g. strength=0.5,layers=last (over the paper default); repeatable."
        ),
    ] = None,
    paper_default: Annotated[bool, typer.Option(help="Add the paper's default config row.")] = True,
    sea: Annotated[bool, typer.Option(help="Add the Segment Embed Average baseline.")] = True,
    general: Annotated[str | None, typer.Option(help="General-retrieval set for the original/shuffled table.")] = "wikipos-general",
    shuffled: Annotated[bool, typer.Option(help="Shuffled-sentence robustness check.")] = True,
    bootstrap: Resamples = 1000,
    seed: Annotated[int, typer.Option(min=0, max=MAX_SEED, help="Seed of the bootstrap and of the sentence shuffling.")] = 0,
    batch_size: BatchSize = None,
    markdown: Annotated[Path | None, typer.Option(help="Also write the tables as Markdown here.")] = None,
    json_output: Annotated[
        Path | None,
        typer.Option(
            "--json", help="Also write every figure (0–1 scale; per group and stratum, or per PosIR bucket; with counts) as JSON here."
        ),
    ] = None,
    trust_remote_code: TrustRemoteCode = False,
    scoring: Annotated[
        Scoring,
        typer.Option(
            help="'posfair': the thirds within strata, HM, PSI (Table 1); 'posir': PosIR's own figures (nDCG@10 and PSI over 20 "
            "position bins, overall and per token-length bucket Q1–Q4, a <language> folder's domains pooled) on a posir:PATH dataset."
        ),
    ] = "posfair",
    posir_instruction: Annotated[
        bool | None,
        typer.Option(
            "--posir-instruction/--no-posir-instruction",
            help="Prefix every query with PosIR's instruction instead of the model's own prompt, as PosIR's evaluation does for "
            "every model; default: on with --scoring posir, so its figures compare with the published ones.",
            show_default=False,
        ),
    ] = None,
    allow_model_mismatch: AllowModelMismatch = False,
    force: Force = False,
    options: OptionsFile = None,
) -> None:
    """Print the paper's Table 1 (and Table 3) for a model: baseline, configs, SEA, with bootstrap intervals; or, with
    --scoring posir, PosIR's own figures.

    Example: tune evaluate --model minilm --dataset wikipos-test --config best.yaml"""
    _setup_logging()
    with _friendly_errors():
        from tuner.common.files import EVALUATION_JSON, EVALUATION_MARKDOWN, Protected, check_output, stores, write_atomically
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
        outputs = [
            (path, flag, kind)
            for path, flag, kind in ((markdown, "--markdown", EVALUATION_MARKDOWN), (json_output, "--json", EVALUATION_JSON))
            if path
        ]
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

        _quiet_libraries()
        table = run_evaluate(request)
        render(table, _console())
        for path, flag, kind in outputs:
            text = to_markdown(table) if kind is EVALUATION_MARKDOWN else json.dumps(to_dict(table), indent=1)
            write_atomically(path, text, kind=kind, force=force, flag=flag)


@app.command(cls=_Command, short_help="Does a model need calibration on a dataset? Its bias, uncalibrated.")
def diagnose(
    model: Model = "minilm",
    pooling: PoolingOption = None,
    padding_side: PaddingSideOption = None,
    dataset: Dataset = "wikipos-dev",
    bootstrap: Resamples = 1000,
    seed: Annotated[int, typer.Option(min=0, max=MAX_SEED, help="Seed of the bootstrap.")] = 0,
    batch_size: BatchSize = None,
    batch_tokens: BatchTokens = None,
    json_output: Annotated[
        Path | None,
        typer.Option("--json", help="Also write every figure (0–1 scale, with its interval) and the verdict as JSON."),
    ] = None,
    trust_remote_code: TrustRemoteCode = False,
    force: Force = False,
    options: OptionsFile = None,
) -> None:
    """Before a study: does the model favour the beginning of a passage on this dataset? Encodes the dataset once,
    uncalibrated (or reads the vectors `tune evaluate` or a study cached), and prints nDCG@10 per position group,
    end − begin (the last group less the first), HM, PSI and the tilt with 95% bootstrap intervals, then a verdict:
    calibration is indicated only where the beginning is favoured beyond noise.

    Example: tune diagnose --model minilm --dataset jsonl:my-data"""
    _setup_logging()
    with _friendly_errors():
        from tuner.common.files import DIAGNOSIS_JSON, Protected, check_output, stores, write_atomically
        from tuner.common.options import DiagnoseRequest
        from tuner.data import check_name, dataset_files
        from tuner.engine.specs import check_model_name, model_files

        spec = check_model_name(model, pooling)
        check_name(dataset, "--dataset")
        if json_output is not None:
            read = [
                Protected(model_files(spec), f"--model {model}"),
                *(Protected(path, f"--dataset {dataset}") for path in dataset_files(dataset)),
                *stores(None, None),
            ]
            check_output(json_output, "--json", DIAGNOSIS_JSON, protected=read, force=force)
        request = DiagnoseRequest(
            model=model,
            pooling=pooling,
            padding_side=padding_side,
            trust_remote_code=trust_remote_code,
            dataset=dataset,
            bootstrap=bootstrap,
            seed=seed,
            batch_size=batch_size,
            batch_tokens=batch_tokens,
        )
        from tuner.report.diagnose import diagnose as run_diagnose
        from tuner.report.diagnose import render, to_dict

        _quiet_libraries()
        diagnosis = run_diagnose(request)
        render(diagnosis, _console())
        if json_output is not None:
            text = json.dumps(to_dict(diagnosis), indent=1)
            write_atomically(json_output, text, kind=DIAGNOSIS_JSON, force=force, flag="--json")


@app.command(cls=_Command, short_help="Re-export a study's winner, or a trial you name.")
def export(
    study_name: Annotated[str, typer.Option(help="The study to export the winner of.")],
    storage: Storage = None,
    output: Annotated[Path | None, typer.Option(help="Default: mlruns/exports/STUDY.yaml.")] = None,
    tracking_uri: Annotated[
        str | None, typer.Option(help="MLflow store to log the export to; default: the one the study logged to.")
    ] = None,
    trust_remote_code: Annotated[
        bool, typer.Option("--trust-remote-code", help="Allow the model's own code (restored anyway if the study was tuned with it).")
    ] = False,
    selection: Annotated[
        str | None,
        typer.Option(
            help="'one-se', 'one-se-fairest', 'one-se-hm' or 'lowest' (see `tune run --help`); default: the rule the study was run with."
        ),
    ] = None,
    trial: Annotated[int | None, typer.Option(min=0, help="Export this trial instead of the winner (as you chose).")] = None,
    force: Force = False,
    options: OptionsFile = None,
) -> None:
    """Re-export a study's current winner (e.g. after more trials), or a trial you name, with fresh held-out figures.

    The model is loaded at the revision the study tuned, with remote code if the study allowed it.

    Example: tune export --study-name minilm--wikipos-dev--seed0 --output best.yaml"""
    _setup_logging()
    with _friendly_errors():
        from tuner.tuning.run import reexport
        from tuner.tuning.storage import default_storage

        _quiet_libraries()
        path = reexport(study_name, storage or default_storage(), output, tracking_uri, trust_remote_code, selection, trial, force=force)
    console.print(f"exported: [bold]{escape(str(path))}[/bold]")


@app.command(cls=_Command, short_help="Encode texts with an exported config.")
def encode(
    config: Annotated[Path, typer.Option(help="Exported YAML config.")],
    input: Annotated[
        Path,
        typer.Option(
            help="JSONL with a 'text' field per line, or a text file with one text per line; '-' for standard input. A named pipe works too."
        ),
    ],
    output: Annotated[Path, typer.Option(help="Where to write the float32 .npy matrix (one row per input line).")],
    input_format: Annotated[
        str, typer.Option(help="'jsonl' or 'text'; default 'auto': by the name (.jsonl, .ndjson: JSON Lines; standard input: text).")
    ] = "auto",
    queries: Annotated[bool, typer.Option("--queries", help="Encode as queries (never calibrated).")] = False,
    batch_size: BatchSize = None,
    trust_remote_code: TrustRemoteCode = False,
    allow_model_mismatch: AllowModelMismatch = False,
    force: Force = False,
) -> None:
    """Encode documents (calibrated) or queries (plain) with an exported config.

    Example: tune encode --config best.yaml --input docs.jsonl --output emb.npy"""
    _setup_logging()
    with _friendly_errors():
        from tuner.common.files import VECTORS, Protected, check_output, stores
        from tuner.data.texts import STDIN, read_texts
        from tuner.engine.exported import check_model_files, load_exported

        exported = load_exported(config)  # a broken config fails before the model loads, and so does one that does not fit it
        check_model_files(exported, config, allow_mismatch=allow_model_mismatch)
        read = [Protected(config, "--config"), Protected(exported.model.files(), "the model --config names"), *stores(None, None)]
        if input != STDIN:
            read.append(Protected(input, "--input"))
        check_output(output, "--output", VECTORS, protected=read, force=force)
        texts = read_texts(input, input_format)
        import warnings

        from tuner.engine.encoder import CalibratedEncoder, ShortDocumentsWarning

        _quiet_libraries()
        encoder = CalibratedEncoder.from_exported(exported, trust_remote_code=trust_remote_code)
        method = encoder.encode_query if queries else encoder.encode_document
        with warnings.catch_warnings():  # the line printed below counts them
            warnings.simplefilter("ignore", ShortDocumentsWarning)
            vectors = method(texts, batch_size=batch_size, show_progress_bar=True)
        _save_atomically(vectors, output, force=force)
    short = (
        f"; {encoder.too_short} shorter than one basket ({encoder.config.basket_size} tokens of content), left uncalibrated"
        if encoder.too_short and encoder.config is not None and encoder.config.strength > 0
        else ""
    )
    console.print(
        f"{len(texts)} {'queries' if queries else 'documents'} → {escape(str(output))} {vectors.shape}"
        + (f"; {encoder.truncated} truncated at {encoder.model.max_length} tokens" if encoder.truncated else "")
        + short
    )


@app.command(cls=_Command, short_help="Open the MLflow UI on the project's store.")
def ui(
    tracking_uri: Annotated[
        str | None, typer.Option(help="MLflow store to browse; default: ./mlruns/mlflow.db (the store `tune` writes here).")
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 5000,
) -> None:
    """Open the MLflow UI on the project's store (compare trials, profiles, the registered winner).

    Refuses to start on a store that does not exist (it would serve an empty one).

    Example: cd my-project && tune ui --port 5001"""
    from tuner.tracking.runs import (
        check_store_schema,
        check_tracking_uri,
        describe_store,
        local_store,
        serve_ui,
        training_view_url,
        ui_command,
    )

    with _friendly_errors():
        if tracking_uri is not None:
            check_tracking_uri(tracking_uri)
    uri = tracking_uri or _default_tracking_uri()
    store = local_store(uri)
    if store is not None and not store.exists():
        console.print(
            f"[red]error:[/red] no MLflow store at {escape(str(store.resolve()))}: run `tune` here first, change to the folder "
            "that holds mlruns/, or pass --tracking-uri sqlite:///PATH/mlruns/mlflow.db"
        )
        raise typer.Exit(2)
    with _friendly_errors():
        check_store_schema(uri)
    console.print(
        f"MLflow UI: {training_view_url(uri, host, port)}  (this link opens the model-training view; "
        "without it a browser opens the view it last used, GenAI at first: switch with the sidebar's "
        "GenAI / Model training toggle)",
        markup=False,
    )
    console.print(f"store: {describe_store(uri)}", markup=False)
    raise typer.Exit(serve_ui(ui_command(uri, host, port)))


def _default_tracking_uri() -> str:
    from tuner.tracking.runs import default_tracking_uri

    return default_tracking_uri()


def parse_inline(text: str) -> dict[str, object]:
    """'strength=0.5,layers=[4,5]' → {'strength': 0.5, 'layers': [4, 5]}; values read as YAML (`tuner.common.safe_yaml`);
    commas inside brackets belong to the value."""
    from tuner.common.safe_yaml import YamlError, loads

    parts, depth, start = [], 0, 0
    for index, char in enumerate(text + ","):
        depth += (char in "[{") - (char in "]}")
        if char == "," and depth <= 0:
            parts.append(text[start:index])
            start = index + 1
    pairs = [part.partition("=") for part in parts if part.strip()]
    if not pairs or depth != 0 or any(not sep or not key.strip() for key, sep, _ in pairs):
        raise ValueError(f"--calibration {shown(text)}: write field=value pairs, e.g. strength=0.5,layers=last or layers=[4,5]")
    values = {}
    for key, _, value in pairs:
        try:
            values[key.strip()] = loads(value, f"--calibration {key.strip()}")
        except YamlError as error:
            raise ValueError(str(error)) from None
    return values


def _space_from(path: Path | None) -> SearchSpace | None:
    """The search space of a YAML file; None (no file) lets TuneSettings make the default after its checks. A file
    that is missing or no YAML is said before the search space's heavy imports (Optuna, torch)."""
    if path is None:
        return None
    from tuner.common.safe_yaml import YamlError, load_file

    try:
        load_file(path)
    except YamlError as error:
        raise ValueError(f"--space {error}") from None
    from tuner.tuning.search_space import SearchSpace

    return SearchSpace.from_yaml(path)


def _save_atomically(vectors: np.ndarray, path: Path, force: bool = False) -> None:
    import numpy as np

    from tuner.common.files import VECTORS, replacing

    with replacing(path, kind=VECTORS, force=force, flag="--output") as temporary, temporary.open("wb") as stream:
        np.save(stream, vectors)


class _friendly_errors:
    """posfair's own failures end with one clear line and a non-zero exit; anything else is a bug and keeps its traceback.

    Own failures: `UserError` (a model or benchmark to download, a store to start, a study stopped early), option
    values refused with ValueError, paths the user named that are missing or not writable, and no feasible trial.
    """

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: object) -> None:
        if isinstance(error, UserError):
            console.print(f"[red]{error.label}:[/red] {escape(str(error))}")  # verbatim: markup would eat "[start, end]"
            raise typer.Exit(error.exit_code)
        if isinstance(error, KeyboardInterrupt):  # Ctrl-C or SIGTERM before the study's trials began
            from tuner.tuning.study import Terminated

            terminated = isinstance(error, Terminated)
            console.print(
                f"[red]stopped early:[/red] {'terminated by SIGTERM' if terminated else 'interrupted'} before "
                "any trial ran here; nothing exported. Run the same command again to start or resume"
            )
            raise typer.Exit(143 if terminated else 130)
        if isinstance(error, (ValueError, FileNotFoundError, PermissionError, IsADirectoryError)):
            console.print(f"[red]error:[/red] {escape(str(error))}")
            raise typer.Exit(2)
        if isinstance(error, RuntimeError):  # imported only here: a run's or export's end, which loaded it already
            from tuner.tuning.run import NoFeasibleTrialError

            if isinstance(error, NoFeasibleTrialError):
                console.print(f"[red]no feasible trial:[/red] {escape(str(error))}")
                raise typer.Exit(3)


def _stop_on_sigterm() -> None:
    """SIGTERM (a scheduler's stop) unwinds a run as Ctrl-C does: trial loop, parent run, temp folders, exit code."""
    import signal

    from tuner.tuning.study import raise_terminated

    signal.signal(signal.SIGTERM, raise_terminated)


def _setup_logging() -> None:
    """posfair's log lines through rich; the libraries are quietened by `_quiet_libraries` once a command loads them."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[RichHandler(console=console, show_path=False)], force=True)


def _quiet_libraries() -> None:
    """After the option checks: quietening transformers and Optuna imports them (seconds), which an error need not wait for."""
    from tuner.tuning.worker import quiet_libraries

    quiet_libraries()


def _print_settings(settings: TuneSettings) -> None:
    """Every setting with the value in force: defaults are resolved (storage, tracking URI, study name, output)."""
    from tuner.tuning.settings import dataset_reason, settings_in_force

    table = Table(title="tune: settings", show_header=False, box=None)
    for name, value in settings_in_force(settings).items():
        if name in ("dataset_defaulted", "worker_id"):
            continue
        shown = f"{value}  ({dataset_reason(settings)})" if name == "dataset" else str(value)
        table.add_row(name.replace("_", "-"), shown)
    console.print(table)


def _print_outcome(outcome: TuneOutcome) -> None:
    """Two tables: every row on the tuning split, then held-out deltas against no calibration."""
    out = _console()
    groups = list(outcome.rows[0].tuning.group_ndcg10)
    tuning = Table(title=f"{outcome.study}: tuning split (HM floor {100 * outcome.floor:.2f})")
    for column in ["", *groups, "HM", "PSI", "nDCG@10", "R@10"]:
        tuning.add_column(column, justify="right" if column else "left")
    for row in outcome.rows:
        r = row.tuning
        tuning.add_row(
            row.label,
            *(f"{100 * r.group_ndcg10[g]:.2f}" for g in groups),
            f"{100 * r.hm:.2f}" if r.hm is not None else "–",
            f"{r.psi:.3f}",
            f"{100 * r.ndcg10:.2f}",
            f"{100 * r.recall10:.2f}",
        )
    out.print(tuning)
    for name in outcome.rows[0].heldout:
        held = Table(title=f"held out, {name}: Δ vs no calibration, 95% paired-bootstrap intervals")
        for column in ["", "HM", "PSI", "nDCG@10", "ΔHM", "ΔPSI", "ΔnDCG@10"]:
            held.add_column(column, justify="right" if column else "left")
        for row in outcome.rows:
            r, d = row.heldout[name].report, row.heldout[name].delta
            held.add_row(
                row.label,
                f"{100 * r.hm:.2f}" if r.hm is not None else "–",
                f"{r.psi:.3f}",
                f"{100 * r.ndcg10:.2f}",
                d.hm.format() if d and d.hm else "–",
                d.psi.format(scale=1, digits=3) if d and d.psi else "–",
                d.ndcg10.format() if d else "–",
            )
        out.print(held)
    winner = outcome.config
    console.print(
        f"winner: trial {outcome.winner_trial}: {winner.variant}, λ {winner.strength}, layers {winner.layers}, "
        f"basket {winner.basket_size}" + (f", w {winner.weight}" if winner.variant == "cls_hard" else "")
    )
    console.print(f"chosen by the {outcome.selection.rule} rule: {outcome.selection.describe()}", markup=False)
    if outcome.pareto:
        console.print(f"feasible Pareto front (PSI↓, HM↑): trials {outcome.pareto}")
    console.print(f"exported config: [bold]{escape(str(outcome.export_path))}[/bold]")
    console.print(f"MLflow: {outcome.tracking_uri}  (browse with `tune ui`)", markup=False)
    if outcome.registered:
        console.print(
            f"registered model: {outcome.registered}  (mlflow.pyfunc.load_model or `mlflow models serve -m ... --env-manager local`)",
            markup=False,
        )


if __name__ == "__main__":
    app()
