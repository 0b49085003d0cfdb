"""benchmarks/drift_law.py fits drift ∝ λ^p within each family and structure of stored trials."""

from __future__ import annotations

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from benchmarks.drift_law import pairs, report

DISTRIBUTIONS = {"strength": FloatDistribution(0.0, 1.0), "depth": CategoricalDistribution(["last", "50%"])}


def trial(strength: float, depth: str, drift: dict[str, float], state: TrialState = TrialState.COMPLETE):
    rows = {name: {"psi": 0.1, "drift": value} for name, value in drift.items()}
    return create_trial(
        state=state,
        value=0.1 if state == TrialState.COMPLETE else None,
        params={"strength": strength, "depth": depth},
        distributions=DISTRIBUTIONS,
        user_attrs={"structures": rows},
    )


def test_the_exponent_of_each_pair_within_a_family_and_structure_and_those_outside_the_bounds() -> None:
    trials = [
        trial(0.0, "last", {"dev": 0.0}),  # the baseline: no family's member
        trial(0.5, "last", {"dev": 0.01, "crops": 0.02}),
        trial(1.0, "last", {"dev": 0.04}, TrialState.PRUNED),  # pruned trials measured drift too: 0.01 · 2² (p 2)
        trial(0.25, "50%", {"dev": 0.001}),
        trial(0.5, "50%", {"dev": 0.016}),  # 0.001 · 2⁴: p 4, outside the bounds
    ]
    found = pairs(trials)
    assert [(p.structure, p.low, p.high, round(p.exponent, 6)) for p in found] == [
        ("dev", 0.25, 0.5, 4.0),
        ("dev", 0.5, 1.0, 2.0),
    ]
    said = report(found)
    assert said.startswith("2 pairs of λ in 2 families, 1 structures: p from 2.00 to 4.00, median 3.00; 1 outside")
    assert "dev λ 0.25 → 0.5: p 4.00" in said
    assert report([]) == "no family has drift measured at two λ"


@pytest.mark.parametrize("exponent", [1.9, 2.6])
def test_a_power_law_within_the_bounds_reports_nothing_outside(exponent: float) -> None:
    trials = [trial(s, "last", {"dev": 0.05 * s**exponent}) for s in (0.3, 0.45, 0.7, 1.0)]
    assert all(p.exponent == pytest.approx(exponent) for p in pairs(trials))
    assert report(pairs(trials)).endswith("0 outside the bisection's bounds [1.75, 3.25]")
