"""The help a user reads at 80 columns: every line fits, no word is cut (no '…', no flag split at a hyphen),
and boolean flags read as flags."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from tuner.cli.app import app


@pytest.mark.parametrize("command", [[], ["run"], ["evaluate"], ["export"], ["encode"], ["ui"]])
def test_help_fits_80_columns_without_cutting_words(command: list[str]) -> None:
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, [*command, "-h"], terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "…" not in result.output
    assert [line for line in lines if len(line) > 80] == []
    assert [line for line in lines if re.search(r"\w-$", line)] == [], "a word split at its hyphen"
    assert "<bool>" not in result.output and "--no-trust-remote-code" not in result.output
    assert not any(line.rstrip().endswith("...") and "[ARGS]" not in line for line in lines), "a command's summary cut short"
