"""benchmarks/search_cost.py: each arm is the `tune` run its name promises."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.search_cost import main, settings_for
from tuner.common.options import Budget


def test_each_arm_is_the_study_it_names(tmp_path: Path) -> None:
    args = type(
        "Args", (), {"model": "minilm", "dataset": "wikipos-dev", "heldout": "none", "trials": 16, "profile_docs": 8, "bootstrap": 10}
    )()
    grid, tpe, robust, third = (settings_for(arm, 1, tmp_path, args) for arm in ("grid", "tpe", "robust", "robust-third"))
    assert grid.grid == "paper" and not grid.prune and grid.trials == 25 and grid.budget is None
    assert not tpe.structures and not tpe.prune and tpe.max_reversal is None and tpe.max_drift is None
    assert robust.structures and robust.prune and robust.budget is None and robust.trials == 16 and robust.seed == 1
    assert third.budget == Budget(grid_share=1 / 3) and third.trials == 16 and third.prune  # the budget ends it, not --trials
    assert str(third.storage).endswith("optuna.db") and third.output == tmp_path / "winner.yaml"


def test_an_unknown_arm_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--arms", "random"])
    assert stop.value.code == 2
    assert "invalid choice: 'random'" in capsys.readouterr().err
