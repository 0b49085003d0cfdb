"""`tune diagnose`: does a model favour the beginning of a passage on a dataset? Its bias, uncalibrated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tuner.cli.console import friendly_errors, make_console, quiet_libraries, setup_logging
from tuner.cli.options import (
    MAX_SEED,
    OUTPUT,
    SCORING,
    BatchSize,
    BatchTokens,
    Dataset,
    Force,
    Model,
    OptionsFile,
    PaddingSideOption,
    PoolingOption,
    Resamples,
    TrustRemoteCode,
)


def diagnose(
    model: Model = "minilm",
    pooling: PoolingOption = None,
    padding_side: PaddingSideOption = None,
    dataset: Dataset = "wikipos-dev",
    bootstrap: Resamples = 1000,
    seed: Annotated[int, typer.Option(min=0, max=MAX_SEED, help="Seed of the bootstrap.", rich_help_panel=SCORING)] = 0,
    json_output: Annotated[
        Path | None,
        typer.Option(
            "--json",
            help="Also write every figure (0–1 scale, with its interval) and the verdict as JSON.",
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    trust_remote_code: TrustRemoteCode = False,
    force: Force = False,
    batch_size: BatchSize = None,
    batch_tokens: BatchTokens = None,
    options: OptionsFile = None,
) -> None:
    """Before a study: does the model favour the beginning of a passage on this dataset? Encodes the dataset once,
    uncalibrated (or reads the vectors `tune evaluate` or a study cached), and prints nDCG@10 per position group,
    end − begin (the last group less the first), HM, PSI and the tilt with 95% bootstrap intervals, then a verdict:
    calibration is indicated only where the beginning is favoured beyond noise.

    Example: tune diagnose --model minilm --dataset jsonl:my-data"""
    setup_logging()
    with friendly_errors():
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

        quiet_libraries()
        diagnosis = run_diagnose(request)
        render(diagnosis, make_console())
        if json_output is not None:
            text = json.dumps(to_dict(diagnosis), indent=1)
            write_atomically(json_output, text, kind=DIAGNOSIS_JSON, force=force, flag="--json")
