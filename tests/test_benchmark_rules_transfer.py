"""benchmarks/rules_transfer.py: what a model's stored studies say of each rule, counted from the trials."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from benchmarks.rules_transfer import rules
from tuner.common.trials import PRUNED_ATTR

DISTRIBUTIONS = {"strength": FloatDistribution(0, 1), "depth": CategoricalDistribution(["last", "25%"])}


def trial(
    strength: float,
    value: float | None,
    structures: dict[str, tuple[float, float]],
    state=TrialState.COMPLETE,
    depth: str = "last",
    **constraints: float,
):
    rows = {name: {"psi": psi, "drift": drift} for name, (psi, drift) in structures.items()}
    attrs = {"structures": rows} | (
        {PRUNED_ATTR: {"rung": 1, "of": 4, "reason": "worse", "scored": list(rows)}}
        if state == TrialState.PRUNED
        else {}
    )
    return create_trial(
        state=state,
        value=value,
        params={"strength": strength, "depth": depth},
        distributions=DISTRIBUTIONS,
        user_attrs=attrs,
        constraints={"hm_floor": -0.01, **constraints},
    )


def test_each_rule_is_counted_from_the_trials_that_met_or_missed_it() -> None:
    study = optuna.create_study()
    study.set_user_attr(
        "winner", "Winner: trial 2, CLS-Soft, λ 0.25 on layers [5] of 6, baskets of 128 tokens: worst-case PSI 0.09"
    )
    for t in [
        trial(0.0, 0.10, {"openings": (0.05, 0.0), "dev": (0.10, 0.0)}),  # the uncalibrated reference
        # the paper default, over the drift limit
        trial(0.5, 0.15, {"openings": (0.08, 0.02), "dev": (0.15, 0.04)}, drift=0.5),
        # its family at half λ: p = log 4 / log 2 = 2
        trial(0.25, 0.09, {"openings": (0.09, 0.005), "dev": (0.07, 0.01)}),
        trial(0.8, None, {"openings": (0.2, 0.1)}, TrialState.PRUNED, reversal=0.03),
        trial(0.3, None, {"openings": (0.2, 0.1)}, TrialState.PRUNED),  # pruned as worse: no constraint missed
    ]:
        study.add_trial(t)
    found = rules("m", [study])
    assert (found.trials, found.complete, found.pruned) == (4, 2, 2)
    assert found.missed == {"drift": 1, "reversal": 1} and found.pruned_as_worse == 1
    assert found.feasible == 1, "trial 2 met every constraint; the paper default missed the drift limit"
    assert found.worst_structure == {"dev": 1, "openings": 1} and found.rung_order == ["openings", "dev"]
    assert found.paper_default_feasible == 0 and found.paper_default_psi_ratio == [pytest.approx(1.5)]
    assert found.winners == ["trial 2, CLS-Soft, λ 0.25 on layers [5] of 6, baskets of 128 tokens"]
    # one family; openings has drift at λ .25 .3 .5 .8 (6 pairs), dev at .25 .5 (p = log 4 / log 2 = 2)
    e = found.exponents
    assert e.pairs == 7 and e.median == pytest.approx(2.0)
    exponents = [
        math.log(b / a) / math.log(y / x)
        for (x, a), (y, b) in [
            ((0.25, 0.005), (0.3, 0.1)),
            ((0.3, 0.1), (0.5, 0.02)),
            ((0.3, 0.1), (0.8, 0.1)),
            ((0.5, 0.02), (0.8, 0.1)),
        ]
    ]
    assert e.outside == sum(not 1.75 <= p <= 3.25 for p in exponents) == 4
    assert e.outside_where_feasible == 4, "trial 2 (λ 0.25) is feasible in the one family"


def test_pairs_outside_the_bounds_are_told_apart_by_whether_their_family_has_a_feasible_strength() -> None:
    # drift doubling from λ 0.25 to 0.5, and × 1.6 from 0.5 to 0.8: p = 1 in both families, below the bound 1.75
    study = optuna.create_study()
    for t in [
        trial(0.0, 0.10, {"dev": (0.10, 0.0)}),
        trial(0.25, 0.08, {"dev": (0.08, 0.01)}),  # feasible: its family can be cut by a ceiling drawn up from it
        trial(0.5, 0.09, {"dev": (0.09, 0.02)}, drift=0.01),
        trial(0.5, 0.09, {"dev": (0.09, 0.02)}, depth="25%", drift=0.01),  # a family whose every λ is too strong
        trial(0.8, 0.12, {"dev": (0.12, 0.032)}, depth="25%", drift=0.02),
    ]:
        study.add_trial(t)
    e = rules("m", [study]).exponents
    assert (e.pairs, e.outside, e.outside_where_feasible) == (2, 2, 1)
    assert e.low == pytest.approx(1.0) and e.high == pytest.approx(1.0)
