"""Specification of the HM floor and the Optuna constraint values (selection: tests/test_selection.py)."""

from __future__ import annotations

import pytest

from objectives.constraint import Constraints, HmFloor
from tuner.tuning.settings import TuneSettings

# --- HmFloor ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["baseline", " Baseline "])
def test_baseline_floor_is_the_uncalibrated_hm_cleared_by_the_point_estimate(text: str) -> None:
    floor = HmFloor.parse(text)
    assert floor == HmFloor("baseline")
    assert floor.resolve(0.7866) == 0.7866
    assert not floor.conservative


def test_the_default_floor_is_significant_the_uncalibrated_hm_cleared_by_the_lower_bound() -> None:
    assert HmFloor() == HmFloor.parse("significant")
    assert HmFloor().resolve(0.5) == 0.5
    assert HmFloor().conservative


@pytest.mark.parametrize(("text", "expected"), [("0.52", 0.52), ("0", 0.0), ("1", 1.0), (".7", 0.7)])
def test_absolute_floor_is_on_the_0_to_1_scale_and_ignores_the_baseline(text: str, expected: float) -> None:
    assert HmFloor.parse(text).resolve(0.9) == expected


@pytest.mark.parametrize(("text", "expected"), [("-1%", 0.792), ("+0.5%", 0.804), ("- 2 %", 0.784), ("+0%", 0.8)])
def test_relative_floor_scales_the_baseline_hm(text: str, expected: float) -> None:
    assert HmFloor.parse(text).resolve(0.8) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["significant", "baseline", "0.52", "-1%", "+0.5%"])
def test_a_floor_prints_as_text_that_parses_back_to_it(text: str) -> None:
    floor = HmFloor.parse(text)
    assert str(floor) == text
    assert HmFloor.parse(str(floor)) == floor


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("52", r"not on the 0–1 scale \(for 52 points write 0.52\)"),
        ("1.5", "not on the 0–1 scale"),
        ("-0.1", "not on the 0–1 scale"),
        ("1%", "ambiguous: give a relative change a sign"),
        ("-100%", "drop to 0 or below"),
        ("nan", "not on the 0–1 scale"),
        ("inf", "not on the 0–1 scale"),
        ("", "cannot read HM floor"),
        ("auto", "cannot read HM floor"),
        ("--1%", "cannot read HM floor"),
    ],
)
def test_bad_floor_text_is_rejected_with_a_helpful_message(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HmFloor.parse(text)


def test_rejections_of_unreadable_floors_name_the_accepted_forms() -> None:
    with pytest.raises(ValueError, match=r"accepted: 'significant'.*'baseline'.*'0\.52'.*'-1%'"):
        HmFloor.parse("auto")


def test_a_floor_built_directly_is_validated_too() -> None:
    with pytest.raises(ValueError, match="kind"):
        HmFloor("median")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="takes no value"):
        HmFloor("baseline", 0.5)


# --- constraint values --------------------------------------------------------------------------


def test_the_hm_constraint_is_floor_minus_the_lower_bound_when_conservative() -> None:
    # HM 0.80 with its interval down to 0.785, floor 0.79: the point clears it, the lower bound does not.
    assert Constraints(0.79).values(hm=0.80, hm_low=0.785, ndcg_delta=0.0)["hm_floor"] == pytest.approx(0.005)
    assert Constraints(0.79, conservative=False).values(0.80, 0.785, 0.0)["hm_floor"] == pytest.approx(-0.01)


def test_aggregate_ndcg_may_not_fall_below_the_uncalibrated_model_by_default() -> None:
    values = Constraints(0.79).values(hm=0.80, hm_low=0.80, ndcg_delta=-0.0004)
    assert values == pytest.approx({"hm_floor": -0.01, "ndcg_drop": 0.0004})
    assert Constraints(0.79).values(0.80, 0.80, ndcg_delta=0.0)["ndcg_drop"] == 0.0, "no change is allowed"
    relaxed = Constraints(0.79, max_ndcg_drop=0.005).values(0.80, 0.80, ndcg_delta=-0.003)
    assert relaxed["ndcg_drop"] == pytest.approx(-0.002), "half a point allowed, 0.3 lost: feasible by 0.2"
    assert "ndcg_drop" not in Constraints(0.79, max_ndcg_drop=None).values(0.80, 0.80, -0.5)


def test_a_general_retrieval_allowance_adds_a_third_constraint() -> None:
    constraints = Constraints(0.79, max_general_drop=0.005)
    # General nDCG@10 dropped 0.3 points with 0.5 allowed: feasible by 0.2 points.
    assert constraints.values(0.80, 0.80, 0.0, general_delta=-0.003)["general_drop"] == pytest.approx(-0.002)
    assert constraints.values(0.80, 0.80, 0.0, general_delta=-0.007)["general_drop"] == pytest.approx(0.002)
    with pytest.raises(ValueError, match="general nDCG@10 change"):
        constraints.values(0.80, 0.80, 0.0)


@pytest.mark.parametrize("field", ["max_ndcg_drop", "max_general_drop"])
@pytest.mark.parametrize("bad", [-0.005, float("nan")])
def test_a_negative_or_nan_allowance_is_rejected(field: str, bad: float) -> None:
    with pytest.raises(ValueError, match=f"{field} must be a drop allowance >= 0"):
        Constraints(0.79, **{field: bad})


def test_with_a_multiple_of_one_the_crops_may_not_end_less_fair_than_uncalibrated() -> None:
    """Crops PSI 0.30 against 0.25 uncalibrated: 0.05 beyond the multiple 1, infeasible."""
    once = Constraints(0.79, max_crops_psi=1.0)
    assert once.values(0.80, 0.80, 0.0, crops_psi=(0.30, 0.25))["crops_psi"] == pytest.approx(0.05)
    assert once.values(0.80, 0.80, 0.0, crops_psi=(0.20, 0.25))["crops_psi"] == pytest.approx(-0.05)
    strict = Constraints(0.79, max_crops_psi=0.5).values(0.80, 0.80, 0.0, crops_psi=(0.20, 0.25))
    assert strict["crops_psi"] == pytest.approx(0.075), "half the uncalibrated PSI is 0.125; 0.20 misses it by 0.075"
    assert "crops_psi" not in once.values(0.80, 0.80, 0.0), "no crops scored (no segment structure): no constraint"


def test_the_crops_constraint_is_off_by_default() -> None:
    """Opt-in (`--max-crops-psi 1`): it excluded no trial of the default runs and costs 61% more encoding."""
    assert "crops_psi" not in Constraints(0.79).values(0.80, 0.80, 0.0, crops_psi=(0.9, 0.1))
    assert TuneSettings().max_crops_psi is None


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_negative_or_non_finite_crops_multiple_is_rejected(bad: float) -> None:
    with pytest.raises(ValueError, match="max_crops_psi must be a multiple >= 0"):
        Constraints(0.79, max_crops_psi=bad)
