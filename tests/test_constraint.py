"""Specification of the HM floor, the Optuna constraint values and the winner selection."""

from __future__ import annotations

import pytest

from objectives.constraint import Candidate, HmFloor, constraint_value, constraint_values, pick_winner
from objectives.metrics import PositionReport


def report(hm: float | None = 0.80) -> PositionReport:
    return PositionReport(
        dataset="toy",
        n_queries=3,
        ndcg10=0.81,
        recall10=0.9,
        group_ndcg10={} if hm is None else {"begin": 0.85, "middle": 0.80, "end": 0.76},
        group_counts={} if hm is None else {"begin": 1, "middle": 1, "end": 1},
        hm=hm,
        psi=None if hm is None else 0.106,
    )


# --- HmFloor ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["baseline", " Baseline "])
def test_baseline_floor_is_the_uncalibrated_hm(text: str) -> None:
    floor = HmFloor.parse(text)
    assert floor == HmFloor()
    assert floor.resolve(0.7866) == 0.7866


def test_the_default_floor_is_baseline() -> None:
    assert HmFloor().resolve(0.5) == 0.5


@pytest.mark.parametrize(("text", "expected"), [("0.52", 0.52), ("0", 0.0), ("1", 1.0), (".7", 0.7)])
def test_absolute_floor_is_on_the_0_to_1_scale_and_ignores_the_baseline(text: str, expected: float) -> None:
    assert HmFloor.parse(text).resolve(0.9) == expected


@pytest.mark.parametrize(("text", "expected"), [("-1%", 0.792), ("+0.5%", 0.804), ("- 2 %", 0.784), ("+0%", 0.8)])
def test_relative_floor_scales_the_baseline_hm(text: str, expected: float) -> None:
    assert HmFloor.parse(text).resolve(0.8) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["baseline", "0.52", "-1%", "+0.5%"])
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
    with pytest.raises(ValueError, match=r"accepted: 'baseline'.*'0\.52'.*'-1%'"):
        HmFloor.parse("auto")


def test_a_floor_built_directly_is_validated_too() -> None:
    with pytest.raises(ValueError, match="kind"):
        HmFloor("median")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="takes no value"):
        HmFloor("baseline", 0.5)


# --- constraint values --------------------------------------------------------------------------


def test_constraint_value_is_floor_minus_hm_so_non_positive_means_feasible() -> None:
    assert constraint_value(hm=0.80, floor=0.79) == pytest.approx(-0.01)
    assert constraint_value(hm=0.79, floor=0.79) == 0.0
    assert constraint_value(hm=0.78, floor=0.79) == pytest.approx(0.01)


def test_constraint_values_hold_the_hm_floor_alone_by_default() -> None:
    assert constraint_values(report(hm=0.80), floor=0.79) == pytest.approx((-0.01,))


def test_a_general_retrieval_allowance_adds_a_second_constraint() -> None:
    # General nDCG@10 dropped 0.3 points with 0.5 allowed: feasible by 0.2 points.
    values = constraint_values(report(), floor=0.79, general_delta=-0.003, max_general_drop=0.005)
    assert values == pytest.approx((-0.01, -0.002))
    # A 0.7-point drop breaks it by 0.2 points; a gain is always fine.
    assert constraint_values(report(), 0.79, -0.007, 0.005)[1] == pytest.approx(0.002)
    assert constraint_values(report(), 0.79, +0.01, 0.0)[1] == pytest.approx(-0.01)


@pytest.mark.parametrize(("delta", "allowance"), [(-0.003, None), (None, 0.005)])
def test_the_general_delta_and_its_allowance_come_together(delta: float | None, allowance: float | None) -> None:
    with pytest.raises(ValueError, match="give both or neither"):
        constraint_values(report(), 0.79, general_delta=delta, max_general_drop=allowance)


def test_a_negative_allowance_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_general_drop"):
        constraint_values(report(), 0.79, general_delta=0.0, max_general_drop=-0.005)


def test_a_report_without_position_groups_cannot_be_constrained_on_hm() -> None:
    with pytest.raises(ValueError, match="no position groups"):
        constraint_values(report(hm=None), floor=0.79)


# --- winner -------------------------------------------------------------------------------------


def test_the_winner_is_the_feasible_candidate_with_the_lowest_psi() -> None:
    candidates = [
        Candidate(trial_number=0, psi=0.15, hm=0.80, constraints=(-0.01,)),
        Candidate(trial_number=1, psi=0.05, hm=0.70, constraints=(0.09,)),  # lowest PSI, but below the floor
        Candidate(trial_number=2, psi=0.12, hm=0.79, constraints=(0.0,)),  # exactly on the floor counts
        Candidate(trial_number=3, psi=0.10, hm=0.81, constraints=(-0.02, 0.001)),  # breaks the general check
    ]
    assert pick_winner(candidates) == candidates[2]


def test_a_psi_tie_goes_to_the_higher_hm_then_to_the_earlier_trial() -> None:
    low_hm = Candidate(trial_number=0, psi=0.1, hm=0.80, constraints=(-0.01,))
    high_hm = Candidate(trial_number=1, psi=0.1, hm=0.82, constraints=(-0.03,))
    twin = Candidate(trial_number=2, psi=0.1, hm=0.82, constraints=(-0.03,))
    assert pick_winner([low_hm, twin, high_hm]) == high_hm


def test_no_feasible_candidate_means_no_winner() -> None:
    assert pick_winner([Candidate(0, psi=0.1, hm=0.7, constraints=(0.05,))]) is None
    assert pick_winner([]) is None


def test_a_nan_constraint_is_not_feasible() -> None:
    assert not Candidate(0, psi=0.1, hm=0.8, constraints=(float("nan"),)).feasible
