"""How `tune` prints its help: click's plain layout, wrapped between words, the options under titled panels."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from typer.core import TyperCommand, TyperGroup

if TYPE_CHECKING:
    from typer._click.core import Context as _ClickContext
    from typer._click.formatting import HelpFormatter as _ClickHelpFormatter
else:  # typer's own copy of click's classes; mypy takes no base class from an attribute, so is told their names above
    _ClickContext = TyperCommand.context_class
    _ClickHelpFormatter = _ClickContext.formatter_class

OTHER_OPTIONS = "Options"  # the panel of options that name none (-h, --options), first as in typer's rich help


class HelpFormatter(_ClickHelpFormatter):
    """click's help, wrapped between words only: a flag such as --max-general-drop or a name such as
    FineWeb-PosQ is never split at its hyphens (click's wrapper breaks on them)."""

    first_column = 0  # the widest option name of every panel: the panels' help texts start in one column

    def _wrap(self, text: str, width: int, indent: str = "") -> list[str]:
        wrapper = textwrap.TextWrapper(
            width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False
        )
        paragraphs = [[*wrapper.wrap(" ".join(paragraph.split())), ""] for paragraph in text.split("\n\n")]
        return [line for lines in paragraphs for line in lines][:-1]

    def write_text(self, text: str) -> None:
        self.write("\n".join(self._wrap(text, self.width, " " * self.current_indent)) + "\n")

    def write_dl(self, rows: Iterable[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
        rows = list(rows)
        widest = max([self.first_column, *(len(first) for first, _ in rows)])
        first_col = min(widest, col_max) + col_spacing
        for first, second in rows:
            self.write(f"{'':>{self.current_indent}}{first}")
            lines = self._wrap(second, max(self.width - first_col - self.current_indent, 10)) if second else []
            if not lines:
                self.write("\n")
                continue
            pad = " " * (first_col + self.current_indent)
            self.write(" " * (first_col - len(first)) if len(first) <= first_col - col_spacing else "\n" + pad)
            self.write(lines[0] + "\n" + "".join(f"{pad}{line}\n" if line else "\n" for line in lines[1:]))


class Context(_ClickContext):
    formatter_class = HelpFormatter


class Command(TyperCommand):
    """A `tune` command whose options are listed under the panel each names (typer's `rich_help_panel`), in the
    order the panels first appear: typer groups them so only in its rich help, which this CLI does not use
    (click's plain help wraps at the terminal's width between words)."""

    context_class = Context

    def format_options(self, ctx: Any, formatter: Any) -> None:
        panels = option_panels(self, ctx)
        if isinstance(formatter, HelpFormatter):
            formatter.first_column = max(len(first) for rows in panels.values() for first, _ in rows)
        for title, rows in panels.items():
            with formatter.section(title):
                formatter.write_dl(rows)


def option_panels(command: Any, ctx: Any) -> dict[str, list[tuple[str, str]]]:
    """A command's (option, help) rows by the panel each option names, the panels in the order they first appear,
    those naming none first (`OTHER_OPTIONS`); an empty panel is left out."""
    panels: dict[str, list[tuple[str, str]]] = {OTHER_OPTIONS: []}
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is not None:
            panels.setdefault(getattr(param, "rich_help_panel", None) or OTHER_OPTIONS, []).append(record)
    return {title: rows for title, rows in panels.items() if rows}


class RunByDefault(TyperGroup):
    """`tune --model x` means `tune run --model x`: run is the default subcommand."""

    context_class = Context

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h", "--version")):
            args = ["run", *args]
        return super().parse_args(ctx, args)
