"""The `tune` command line: run (the default), evaluate, diagnose, export, encode, ui."""

from __future__ import annotations

from typing import Annotated

import typer

from tuner.cli.diagnose import diagnose
from tuner.cli.encode import encode
from tuner.cli.evaluate import evaluate
from tuner.cli.export import export
from tuner.cli.help import Command, RunByDefault
from tuner.cli.run import run
from tuner.cli.ui import ui

# Only the standard library, typer, rich and tuner.common load with this module: `tune -h` and option errors
# answer without torch, transformers, MLflow or Optuna (tests/test_cli_speed.py). Commands import their work.

app = typer.Typer(
    cls=RunByDefault,
    help="Tune attention calibration per model for position-fair dense retrieval (posfair). "
    "`tune` alone is `tune run`: it tunes all-MiniLM-L6-v2 on the embedded WikiPos.",
    epilog="Examples: tune --trials 4 · tune --model bge-m3 · tune ui · "
    "tune encode --config best.yaml --input docs.jsonl --output emb.npy",
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
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print posfair's version and exit."),
    ] = False,
) -> None:
    """Tune attention calibration per model for position-fair dense retrieval (posfair)."""


app.command(cls=Command, short_help="Tune one model (the default command).")(run)
app.command(cls=Command, short_help="The paper's tables for a model, with intervals.")(evaluate)
app.command(cls=Command, short_help="Does a model need calibration on a dataset? Its bias, uncalibrated.")(diagnose)
app.command(cls=Command, short_help="Re-export a study's winner, or a trial you name.")(export)
app.command(cls=Command, short_help="Encode texts with an exported config.")(encode)
app.command(cls=Command, short_help="Open the MLflow UI on the project's store.")(ui)

if __name__ == "__main__":
    app()
