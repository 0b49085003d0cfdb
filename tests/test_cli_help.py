"""The help a user reads at 80 columns: every line fits, no word is cut (no '…', no flag split at a hyphen),
and boolean flags read as flags."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from tuner.cli.app import app


@pytest.mark.parametrize("command", [[], ["run"], ["evaluate"], ["diagnose"], ["export"], ["encode"], ["ui"]])
def test_help_fits_80_columns_without_cutting_words(command: list[str]) -> None:
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, [*command, "-h"], terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "…" not in result.output
    assert [line for line in lines if len(line) > 80] == []
    assert [line for line in lines if re.search(r"\w-$", line)] == [], "a word split at its hyphen"
    assert "<bool>" not in result.output and "--no-trust-remote-code" not in result.output
    assert not any(line.rstrip().endswith("...") and "[ARGS]" not in line for line in lines), (
        "a command's summary cut short"
    )


def test_the_cache_budget_s_default_is_told_as_a_size_in_the_help_and_the_settings_table() -> None:
    """A user reads how much disk the cache may take, not the name of the module that holds the constant."""
    from tuner.common.options import DEFAULT_CACHE_BYTES
    from tuner.evaluation.layer_inputs import DEFAULT_BUDGET
    from tuner.tuning.settings import TuneSettings, settings_in_force

    assert DEFAULT_BUDGET == DEFAULT_CACHE_BYTES == 8 * 2**30  # the size the words below state
    help_text = " ".join(CliRunner(env={"COLUMNS": "80"}).invoke(app, ["run", "-h"], terminal_width=80).output.split())
    said = help_text.split("--cache-budget", 1)[1].split(" --", 1)[0]
    assert "default: 8 GiB" in said and "tuner." not in said, said
    assert settings_in_force(TuneSettings())["cache_budget"].startswith("8 GiB at most")


def test_run_s_help_lists_every_option_once_under_the_panel_it_belongs_to() -> None:
    """Some forty options in one list were hard to scan: `tune run -h` lists them under titled panels, as typer's
    rich help groups them, each option once."""
    output = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["run", "-h"], terminal_width=80).output
    parts = re.split(r"^(\S[^\n]*):\n", output, flags=re.MULTILINE)
    panels = dict(zip(parts[1::2], parts[2::2], strict=True))
    assert list(panels) == [
        "Options",
        "Model",
        "Data",
        "Search",
        "Constraints",
        "Selection and report",
        "Stores",
        "Output",
        "Resources",
        "Workers",
    ], list(panels)
    where = {
        "--options": "Options",
        "--pooling": "Model",
        "--heldout": "Data",
        "--budget": "Search",
        "--max-drift": "Constraints",
        "--selection": "Selection and report",
        "--storage": "Stores",
        "--force": "Output",
        "--cache-budget": "Resources",
        "--job-array": "Workers",
    }
    for flag, panel in where.items():
        assert re.search(rf"^  {flag}\b", panels[panel], flags=re.MULTILINE), (flag, panel)
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    for param in command.params:
        flag = next(opt for opt in param.opts if opt.startswith("--"))
        listed = [name for name, text in panels.items() if re.search(rf"^  {flag}\b", text, flags=re.MULTILINE)]
        assert len(listed) == 1, (flag, listed)
