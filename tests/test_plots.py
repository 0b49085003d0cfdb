"""The study's figures say what the study holds: pareto.png names each point by its trial, history.png's axis ends at
the last trial that ran."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

import tuner.tracking.plots
from tuner.common.trials import SURPLUS_ATTR
from tuner.tracking.plots import history, pareto_scatter


def add(study: optuna.Study, psi: float, hm: float, floor_gap: float, state: TrialState = TrialState.COMPLETE) -> None:
    complete = state == TrialState.COMPLETE
    study.add_trial(
        optuna.trial.create_trial(
            params={"strength": 0.5},
            distributions={"strength": FloatDistribution(0, 1)},
            value=psi if complete else None,
            state=state,
            user_attrs={"psi": psi, "hm": hm} if complete else {SURPLUS_ATTR: True},
            system_attrs={"constraints:hm_floor": floor_gap} if complete else {},
        )
    )


def test_the_psi_hm_scatter_names_each_trial_by_its_number(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    study = optuna.create_study()
    for psi, hm, gap in ((0.30, 0.50, -0.01), (0.20, 0.52, -0.02), (0.10, 0.49, 0.01)):
        add(study, psi, hm, gap)
    drawn: list[object] = []
    monkeypatch.setattr(tuner.tracking.plots.plt, "close", drawn.append)  # keep the figure to read it
    pareto_scatter(study, 0.5, study.trials[0], study.trials[1], tmp_path / "pareto.png")
    (figure,) = drawn
    labels = {(text.get_text(), text.xy) for axis in figure.axes for text in axis.texts}  # type: ignore[attr-defined]
    assert labels == {("0", (0.30, 50.0)), ("1", (0.20, 52.0)), ("2", (0.10, 49.0))}


def test_the_history_axis_ends_at_the_last_trial_that_ran() -> None:
    """Trials 0-2 ran; 3 and 4 are draws the budget had no room for (pruned unrun as surplus)."""
    study = optuna.create_study()
    for psi in (0.3, 0.2, 0.25):
        add(study, psi, 0.5, -0.01)
    for _ in range(2):
        add(study, 0.0, 0.0, 0.0, state=TrialState.PRUNED)
    assert history(study).get_xlim() == (-0.5, 2.5)
