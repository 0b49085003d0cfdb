"""benchmarks/rung_order.py replays stored trials with the study's own pruning rule under other rung orders."""

from __future__ import annotations

from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from benchmarks.rung_order import replay

COSTS = {"dev": 100, "openings": 30, "crops": 60}  # padded tokens per layer
DISTRIBUTIONS = {"strength": FloatDistribution(0.0, 1.0), "depth": CategoricalDistribution(["last", "50%"])}


def row(psi: float, reversal: float = -0.1, ndcg_high: float = 0.01) -> dict[str, float]:
    """A structure as a study stores it; the uncalibrated model favours the beginning (tilt < 0: reversal = tilt)."""
    return {
        "psi": psi,
        "psi_se": 0.02,
        "hm": 0.5,
        "ndcg10_delta": 0.0,
        "ndcg10_delta_high": ndcg_high,
        "tilt": reversal,
        "reversal": reversal,
    }


def trial(number: int, strength: float, depth: str, rows: dict[str, dict[str, float]], feasible: bool = True):
    made = create_trial(
        state=TrialState.COMPLETE,
        value=max(r["psi"] for r in rows.values()),
        params={"strength": strength, "depth": depth},
        distributions=DISTRIBUTIONS,
        user_attrs={"structures": rows},
        constraints={"hm_floor": -0.01 if feasible else 0.01, "ndcg_drop": -0.01},
    )
    made.number = number
    return made


def test_a_reversal_on_the_first_rung_stops_the_trial_there_and_dev_first_pays_for_dev_too() -> None:
    trials = [
        trial(0, 0.0, "last", {"dev": row(0.30), "openings": row(0.19), "crops": row(0.16)}),  # the baseline: no passes
        trial(1, 0.5, "50%", {"dev": row(0.20), "openings": row(0.10), "crops": row(0.10)}),  # the paper default
        trial(2, 1.0, "last", {"dev": row(0.05), "openings": row(0.08, reversal=0.2), "crops": row(0.2, reversal=0.1)}),
    ]
    # MiniLM's 6 layers: "last" runs 1, "50%" runs 3; complete trials also encode their profile (10)
    total, stopped, eligible = replay(trials, ["openings", "dev", "crops"], "dev", COSTS, 6, 10, 1.0)
    assert stopped == [2] and total == 10 + (3 * 190 + 10) + 1 * 30  # trial 2: the openings only
    total, stopped, _ = replay(trials, ["dev", "openings", "crops"], "dev", COSTS, 6, 10, 1.0)
    assert stopped == [2] and total == 10 + (3 * 190 + 10) + 1 * (100 + 30)  # dev, then the openings show it
    assert eligible == [1], "the references are never stopped; the trial that reverses the bias never completes"


def test_a_trial_above_the_threshold_on_the_most_biased_rung_stops_there() -> None:
    trials = [
        trial(0, 0.0, "last", {"dev": row(0.30), "openings": row(0.19), "crops": row(0.16)}),
        trial(1, 0.5, "last", {"dev": row(0.10), "openings": row(0.05), "crops": row(0.05)}),
        trial(2, 0.1, "last", {"dev": row(0.28), "openings": row(0.12), "crops": row(0.10)}),  # mild: dev shows it
    ]
    # threshold after trial 1 (the best feasible): 0.10 + 0.02; trial 2's dev PSI 0.28 − 0.02 is above it
    _, stopped, _ = replay(trials, ["openings", "dev", "crops"], "dev", COSTS, 6, 0, 1.0)
    assert stopped == [2]
    total, stopped, _ = replay(trials, ["openings", "crops", "dev"], "dev", COSTS, 6, 0, 1.0)
    assert stopped == [] and total == 2 * 190, "dev last: the mild trial pays every rung and completes"
