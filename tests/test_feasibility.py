"""One truth for feasibility: the sentence, the console line and the PSI–HM scatter all state the rule the
constraint applied, for a trial that clears the HM floor by its point HM but not by its lower bound."""

from __future__ import annotations

import logging

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from objectives import Constraints
from tuner.tracking.plots import scatter_points
from tuner.tracking.progress import StudyProgress
from tuner.tracking.runs import describe_feasibility, describe_outcome
from tuner.tuning.worker import _log_trial

FLOOR, HM, HM_LOW = 0.5531, 0.5552, 0.5395  # issue 25's trial 3: point HM above the floor, lower bound below


def trial_metrics(constraints: Constraints, hm: float, hm_low: float, ndcg_delta: float) -> dict[str, float]:
    """A trial's metrics as TrialObjective records them."""
    values = constraints.values(hm, hm_low, ndcg_delta)
    return {
        "psi": 0.063,
        "hm": hm,
        "hm_low": hm_low,
        "hm_floor": constraints.hm_floor,
        "ndcg10_delta": ndcg_delta,
        **{f"constraint_{k}": v for k, v in values.items()},
        "feasible": float(all(v <= 0 for v in values.values())),
    }


def study_with(metrics: dict[str, float], conservative: bool) -> optuna.Study:
    study = optuna.create_study()
    names = [k.removeprefix("constraint_") for k in metrics if k.startswith("constraint_")]
    system = {f"constraints:{n}": metrics[f"constraint_{n}"] for n in names} | {"constraints": [metrics[f"constraint_{n}"] for n in names]}
    feasible = "yes" if metrics["feasible"] else "NO"
    study.add_trial(
        optuna.trial.create_trial(
            params={"strength": 0.5},
            distributions={"strength": FloatDistribution(0, 1)},
            value=metrics["psi"],
            system_attrs=system,
            user_attrs={
                "psi": metrics["psi"],
                "hm": metrics["hm"],
                "metrics": metrics,
                "feasible": f"{feasible}: {describe_feasibility(metrics, conservative)}",
            },
            state=TrialState.COMPLETE,
        )
    )
    return study


def test_a_trial_above_the_floor_by_its_point_hm_but_not_its_lower_bound_is_said_and_drawn_to_miss_it(caplog) -> None:
    metrics = trial_metrics(Constraints(FLOOR), HM, HM_LOW, 0.001)
    assert metrics["feasible"] == 0.0, "the default rule compares the lower bound"

    assert describe_feasibility(metrics, conservative=True) == "HM 55.52, lower bound 53.95 < floor 55.31: misses the HM floor"
    outcome = describe_outcome(metrics, conservative=True)
    assert "HM 55.52, lower bound 53.95 < floor 55.31" in outcome and outcome.endswith(": misses the HM floor")
    assert "HM 55.52 <" not in outcome and "≥" not in outcome

    study = study_with(metrics, conservative=True)
    (point,) = scatter_points(study, FLOOR)
    assert point.hm > FLOOR, "the point HM is drawn above the floor line"
    assert point.compared == pytest.approx(HM_LOW) and point.compared < FLOOR, "what is compared is drawn below it"
    assert point.missed == ("hm_floor",)

    with caplog.at_level(logging.INFO):
        _log_trial(study, study.trials[0], StudyProgress(4, 0, bar=False))
    line = next(r.getMessage() for r in caplog.records if r.name == "tuner.tuning.worker")
    assert "lower bound 53.95 < floor 55.31: misses the HM floor" in line


def test_the_point_rule_compares_the_point_hm_and_the_ndcg_limit_is_named() -> None:
    metrics = trial_metrics(Constraints(FLOOR, conservative=False, max_ndcg_drop=0.0), HM, HM_LOW, -0.004)
    assert describe_feasibility(metrics, conservative=False) == "HM 55.52 ≥ floor 55.31: misses the nDCG@10 limit"
    assert "nDCG@10 -0.40 vs uncalibrated < +0.00 allowed: misses the nDCG@10 limit" in describe_outcome(metrics, False)
    (point,) = scatter_points(study_with(metrics, conservative=False), FLOOR)
    assert point.compared == pytest.approx(HM) and point.missed == ("ndcg_drop",)
