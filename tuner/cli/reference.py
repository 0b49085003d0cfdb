"""The command line's reference page, rendered from the `tune` app itself (the documentation's Command line page)."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from tuner.cli.app import app
from tuner.cli.help import option_panels


def reference() -> str:
    """Markdown of every command and option with its help text, as `tune CMD -h` says it, the options under the
    panels the help lists them under; headings start at level 2."""
    command = typer.main.get_command(app)
    return _section(command, typer.Context(command), "tune", 2)


def _section(command: Any, ctx: typer.Context, name: str, level: int) -> str:
    """One command's part of the page: its help, usage and options by panel, then its subcommands'."""
    usage = f"```console\n$ {name} {' '.join(command.collect_usage_pieces(ctx))}\n```"
    parts = [f"{'#' * level} `{name}`", command.help or "", "**Usage**:", usage]
    for title, rows in option_panels(command, ctx).items():
        parts += [f"**{title}**:", "\n".join(f"* `{first}`" + (f": {text}" if text else "") for first, text in rows)]
    parts.append(command.epilog or "")
    if isinstance(command, TyperGroup):
        found_by_name = {sub: command.get_command(ctx, sub) for sub in command.list_commands(ctx)}
        subcommands = {sub: found for sub, found in found_by_name.items() if found is not None}
        listed = "\n".join(f"* `{sub}`: {found.get_short_help_str()}" for sub, found in subcommands.items())
        parts += ["**Commands**:", listed]
        parts += [_section(found, ctx, f"{name} {sub}", level + 1) for sub, found in subcommands.items()]
    return "\n\n".join(part.strip("\n") for part in parts if part) + "\n"
