"""The study's figures say what the study holds: pareto.png names each point by its trial, history.png's axis ends at
the last trial that ran."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

import tuner.tracking.plots
from objectives.selection import Candidate, select
from tuner.common.trials import NOT_RUN_ATTR
from tuner.tracking.plots import history, pareto_scatter


def add(
    study: optuna.Study,
    psi: float,
    hm: float,
    floor_gap: float,
    state: TrialState = TrialState.COMPLETE,
    **attrs: float,
) -> None:
    complete = state == TrialState.COMPLETE
    study.add_trial(
        optuna.trial.create_trial(
            params={"strength": 0.5},
            distributions={"strength": FloatDistribution(0, 1)},
            value=psi if complete else None,
            state=state,
            user_attrs={"psi": psi, "hm": hm, **attrs} if complete else {NOT_RUN_ATTR: "the budget is spent"},
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
    """Trials 0-2 ran; 3 and 4 are draws the budget had no room for (not run)."""
    study = optuna.create_study()
    for psi in (0.3, 0.2, 0.25):
        add(study, psi, 0.5, -0.01)
    for _ in range(2):
        add(study, 0.0, 0.0, 0.0, state=TrialState.FAIL)
    assert history(study).get_xlim() == (-0.5, 2.5)


def test_the_scatter_shows_why_a_milder_trial_won_over_the_lowest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-SE rule can choose a trial that another beats on both axes (trial 3 fairer and more accurate than the
    winner, trial 2): the x axis is the objective the rule reads, the band of the rule is shaded, and each trial in it
    carries its drift, the rule's tie-break; the title names the winner and the reason."""
    study = optuna.create_study()
    trials = ((0.30, 0.50, 0.0), (0.20, 0.52, 0.02), (0.17, 0.53, 0.006), (0.16, 0.55, 0.03))  # objective, HM, drift
    for objective, hm, drift in trials:  # the tuning passages' PSI (objective + 0.1) is what the old x axis drew
        add(study, objective + 0.1, hm, -0.01, robust_psi=objective, drift=drift)
    candidates = [Candidate(n, objective, 0.02, drift, (-0.01,), hm) for n, (objective, hm, drift) in enumerate(trials)]
    selection = select(candidates, "one-se")
    assert selection is not None and selection.winner.trial_number == 2 and selection.eligible == (2, 3)
    drawn: list[object] = []
    monkeypatch.setattr(tuner.tracking.plots.plt, "close", drawn.append)
    pareto_scatter(study, 0.5, study.trials[0], study.trials[2], tmp_path / "pareto.png", selection=selection)
    (figure,) = drawn
    (axis,) = figure.axes  # type: ignore[attr-defined]
    labels = {text.get_text(): text.xy for text in axis.texts}
    expected = {
        "0": (0.30, 50.0),
        "1": (0.20, 52.0),
        "2 · drift 0.0060": (0.17, 53.0),
        "3 · drift 0.0300": (0.16, 55.0),
    }
    assert labels.keys() == expected.keys() and all(labels[k] == pytest.approx(v) for k, v in expected.items())
    (band,) = [p for p in axis.patches if "within one SE of the lowest" in p.get_label()]
    left, right = band.get_x(), band.get_x() + band.get_width()
    assert left == pytest.approx(0.16) and right == pytest.approx(0.18) and "takes the mildest" in band.get_label()
    assert "winner: trial 2: the mildest (drift 0.0060)" in axis.get_title().replace("\n", " ")
    assert axis.get_xlabel().startswith("worst-case PSI over the tuning structures")
