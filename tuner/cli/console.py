"""Where `tune`'s commands print and how they end: the rich console, the log, one clear line for a user's error."""

from __future__ import annotations

import logging
import sys

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from tuner.common.messages import UserError

PIPED_WIDTH = 160  # rich assumes 80 columns when not on a terminal, which truncates the result tables


def make_console(stderr: bool = False) -> Console:
    """A rich console; redirected output (a file, a CI log) gets PIPED_WIDTH columns so tables stay whole."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else PIPED_WIDTH)


console = make_console(stderr=True)


class friendly_errors:
    """posfair's own failures end with one clear line and a non-zero exit; anything else is a bug and keeps its
    traceback.

    Own failures: `UserError` (a model or benchmark to download, a store to start, a study stopped early), option
    values refused with ValueError, paths the user named that are missing or not writable, and no feasible trial.
    """

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: object) -> None:
        if isinstance(error, UserError):
            console.print(
                f"[red]{error.label}:[/red] {escape(str(error))}"
            )  # verbatim: markup would eat "[start, end]"
            raise typer.Exit(error.exit_code)
        if isinstance(error, KeyboardInterrupt):  # Ctrl-C or SIGTERM before the study's trials began
            from tuner.tuning.stops import Terminated

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


def setup_logging() -> None:
    """posfair's log lines through rich; the libraries are quietened by `quiet_libraries` once a command loads them."""
    handler = RichHandler(console=console, show_path=False)
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[handler], force=True)


def quiet_libraries() -> None:
    """After the option checks: quietening transformers and Optuna imports them (seconds), which an error need not
    wait for."""
    from tuner.tuning.library_logs import quiet_libraries

    quiet_libraries()
