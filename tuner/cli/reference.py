"""The command line's reference page, rendered from the `tune` app itself (the documentation's Command line page)."""

from __future__ import annotations

import typer
from typer.cli import get_docs_for_click

from tuner.cli.app import app


def reference() -> str:
    """Markdown of every command and option with its help text, as `tune CMD -h` says it; headings start at level 2."""
    command = typer.main.get_command(app)
    return get_docs_for_click(obj=command, ctx=typer.Context(command), name="tune", indent=1)
