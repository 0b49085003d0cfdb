"""`tune export`: re-export a study's winner, or a trial named, with fresh held-out figures."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tuner.cli.console import console, friendly_errors, quiet_libraries, setup_logging
from tuner.cli.options import MODEL, OUTPUT, SELECTION, STORES, Force, OptionsFile, Storage


def export(
    study_name: Annotated[str, typer.Option(help="The study to export the winner of.", rich_help_panel=STORES)],
    storage: Storage = None,
    tracking_uri: Annotated[
        str | None,
        typer.Option(
            help="MLflow store to log the export to; default: the one the study logged to.", rich_help_panel=STORES
        ),
    ] = None,
    trust_remote_code: Annotated[
        bool,
        typer.Option(
            "--trust-remote-code",
            help="Allow the model's own code (restored anyway if the study was tuned with it).",
            rich_help_panel=MODEL,
        ),
    ] = False,
    selection: Annotated[
        str | None,
        typer.Option(
            help="'one-se', 'one-se-fairest', 'one-se-hm' or 'lowest' (see `tune run --help`); default: the rule the "
            "study was run with.",
            rich_help_panel=SELECTION,
        ),
    ] = None,
    trial: Annotated[
        int | None,
        typer.Option(min=0, help="Export this trial instead of the winner (as you chose).", rich_help_panel=SELECTION),
    ] = None,
    output: Annotated[
        Path | None, typer.Option(help="Default: mlruns/exports/STUDY.yaml.", rich_help_panel=OUTPUT)
    ] = None,
    force: Force = False,
    options: OptionsFile = None,
) -> None:
    """Re-export a study's current winner (e.g. after more trials), or a trial you name, with fresh held-out figures.

    The model is loaded at the revision the study tuned, with remote code if the study allowed it.

    Example: tune export --study-name minilm--wikipos-dev_titles--seed0 --output best.yaml"""
    setup_logging()
    with friendly_errors():
        from tuner.tuning.run import reexport
        from tuner.tuning.storage import default_storage

        quiet_libraries()
        store = storage or default_storage()
        path = reexport(study_name, store, output, tracking_uri, trust_remote_code, selection, trial, force=force)
    console.print(f"exported: [bold]{escape(str(path))}[/bold]")
