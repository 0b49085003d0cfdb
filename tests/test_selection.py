"""Specification of winner selection: the one-standard-error rule, and the evidence it rests on."""

from __future__ import annotations

import math

import numpy as np
import pytest

from objectives.evidence import trial_evidence
from objectives.metrics import PerQuery, aggregate
from objectives.selection import Candidate, paired_se, select


def trial(number: int, psi: float, se: float, drift: float, *constraints: float) -> Candidate:
    return Candidate(number, psi, se, drift, constraints or (-0.01,))


def test_an_over_correcting_config_with_the_lowest_psi_loses_to_an_indistinguishable_milder_one():
    aggressive = trial(6, psi=0.032, se=0.030, drift=0.056)  # λ 1 on every layer: flat on dev by a hair
    steady = trial(2, psi=0.055, se=0.032, drift=0.010)  # λ 0.55 on the last layer: within one SE of it
    weak = trial(9, psi=0.150, se=0.035, drift=0.002)  # milder still, but clearly less fair
    chosen = select([aggressive, steady, weak])
    assert chosen is not None
    assert chosen.winner == steady
    assert chosen.best == aggressive and chosen.threshold == pytest.approx(0.062)
    assert chosen.eligible == (2, 6)
    assert "trial 2" in chosen.describe() and "[2, 6]" in chosen.describe()


def test_a_config_better_by_more_than_one_standard_error_wins_however_strong():
    strong = trial(4, psi=0.020, se=0.010, drift=0.080)
    mild = trial(5, psi=0.060, se=0.030, drift=0.005)  # outside 0.020 + 0.010
    assert select([mild, strong]).winner == strong


def band_of_three() -> list[Candidate]:
    """Three feasible trials within one SE of the best (0.164 + 0.03): mildest, fairest on average, most accurate."""
    return [
        Candidate(1, 0.164, 0.03, 0.020, (-0.01,), hm=0.570, mean_psi=0.120),  # the best objective
        Candidate(2, 0.180, 0.03, 0.008, (-0.01,), hm=0.574, mean_psi=0.140),  # the mildest
        # the fairest on the mean of the structures
        Candidate(3, 0.170, 0.03, 0.030, (-0.01,), hm=0.566, mean_psi=0.095),
        Candidate(4, 0.185, 0.03, 0.015, (-0.01,), hm=0.581, mean_psi=0.150),  # the most accurate
        Candidate(5, 0.240, 0.03, 0.001, (-0.01,), hm=0.590, mean_psi=0.050),  # outside the band: never chosen
    ]


@pytest.mark.parametrize(("rule", "expected"), [("one-se", 2), ("one-se-fairest", 3), ("one-se-hm", 4), ("lowest", 1)])
def test_each_rule_breaks_the_one_se_band_by_its_own_criterion(rule, expected):
    chosen = select(band_of_three(), rule)
    assert chosen is not None and chosen.winner.trial_number == expected
    if rule != "lowest":
        assert chosen.eligible == (1, 2, 3, 4)


def test_a_trial_without_structures_is_ranked_on_average_by_its_objective():
    plain = [Candidate(1, 0.10, 0.05, 0.02, (-0.01,)), Candidate(2, 0.12, 0.05, 0.01, (-0.01,), mean_psi=0.11)]
    assert select(plain, "one-se-fairest").winner.trial_number == 1  # 0.10 (its objective) < 0.11


def test_the_reason_names_the_tie_break_and_its_figure():
    fairest = select(band_of_three(), "one-se-fairest")
    assert "fairest on average over the structures (mean PSI 0.0950)" in fairest.describe()
    assert "the most accurate (HM 0.5810)" in select(band_of_three(), "one-se-hm").describe()


def test_the_lowest_rule_takes_the_lowest_objective_as_before():
    aggressive, steady = trial(6, 0.032, 0.03, 0.056), trial(2, 0.055, 0.03, 0.010)
    chosen = select([aggressive, steady], "lowest")
    assert chosen.winner == aggressive and chosen.eligible == (6,)
    assert "lowest objective" in chosen.describe()


def test_infeasible_trials_never_win_and_none_feasible_means_no_winner():
    below_floor = trial(1, 0.01, 0.03, 0.001, 0.02)  # misses the HM floor
    lost_ndcg = trial(3, 0.02, 0.03, 0.002, -0.01, 0.0004)  # loses aggregate nDCG@10
    kept = trial(7, 0.09, 0.03, 0.03, -0.01, 0.0)  # exactly on a limit counts as met
    assert select([below_floor, lost_ndcg, kept]).winner == kept
    assert select([below_floor]) is None and select([]) is None
    assert select([trial(8, float("nan"), 0.0, 0.0)]) is None
    assert not trial(9, 0.1, 0.0, 0.0, float("nan")).feasible


def test_ties_go_to_the_lower_objective_then_the_higher_hm_then_the_earlier_trial():
    a, b, c = trial(3, 0.05, 0.02, 0.010), trial(1, 0.06, 0.02, 0.010), trial(2, 0.05, 0.02, 0.010)
    assert select([a, b, c]).winner == c
    higher_hm = Candidate(5, 0.05, 0.02, 0.010, (-0.01,), hm=0.6)
    assert select([a, b, c, higher_hm]).winner == higher_hm


def test_among_equally_mild_trials_the_lower_objective_wins_before_the_higher_hm():
    """Objective first, HM second: the fairer of two equally mild trials wins even with the lower HM."""
    fairer = Candidate(4, 0.040, 0.02, 0.010, (-0.01,), hm=0.50)
    higher_hm = Candidate(3, 0.050, 0.02, 0.010, (-0.01,), hm=0.70)  # within one SE of the fairer one
    for rule in ("one-se", "lowest"):
        assert select([higher_hm, fairer], rule).winner == fairer


def test_the_best_of_equal_objectives_is_the_milder_then_the_higher_hm_then_the_earlier_trial():
    """The best trial is the `lowest` rule's winner, and its own standard error sets the one-SE threshold."""
    milder = Candidate(7, 0.05, 0.010, 0.010, (-0.01,), hm=0.50)
    stronger = Candidate(3, 0.05, 0.030, 0.020, (-0.01,), hm=0.70)  # earlier, higher HM, but moves the vectors more
    assert select([stronger, milder], "lowest").winner == milder
    chosen = select([stronger, milder])
    assert chosen.best == milder and chosen.threshold == pytest.approx(0.05 + 0.010)
    lower_hm = Candidate(2, 0.05, 0.030, 0.010, (-0.01,), hm=0.40)  # as mild and earlier, lower HM
    assert select([lower_hm, milder], "lowest").winner == milder
    later_twin = Candidate(9, 0.05, 0.030, 0.010, (-0.01,), hm=0.50)
    assert select([later_twin, milder], "lowest").winner == milder


def test_a_best_trial_without_a_standard_error_admits_only_its_own_objective():
    """A NaN standard error (the bootstrap could not measure the noise) counts as no noise, not as endless
    noise: otherwise every feasible trial, however unfair, would be within "one SE" and the mildest would win."""
    best = trial(1, psi=0.020, se=float("nan"), drift=0.080)
    mild_but_unfair = trial(2, psi=0.300, se=0.010, drift=0.001)
    chosen = select([best, mild_but_unfair])
    assert chosen.winner == best and chosen.threshold == pytest.approx(0.020) and chosen.eligible == (1,)


def test_two_trials_scored_on_the_same_resamples_are_told_apart_by_the_noise_of_their_difference():
    """Each trial's own standard error (0.037, as on WikiPos-dev) counts the noise the two trials share (which
    resampled queries are hard); the spread of their difference over the common resamples does not. A trial 0.02
    above the best with a paired spread of 0.005 is worse beyond noise, though well within the best's own SE;
    one 0.002 above with a paired spread of 0.01 is not."""
    rng = np.random.default_rng(0)
    shared = rng.normal(0.15, 0.037, 500)  # the noise every trial has on a resample
    best = Candidate(1, 0.150, 0.037, 0.030, (-0.01,), resamples=tuple(shared))
    worse = Candidate(2, 0.170, 0.037, 0.010, (-0.01,), resamples=tuple(shared + 0.02 + rng.normal(0, 0.005, 500)))
    level = Candidate(3, 0.152, 0.037, 0.020, (-0.01,), resamples=tuple(shared + 0.002 + rng.normal(0, 0.01, 500)))
    chosen = select([best, worse, level])
    assert chosen.paired and chosen.eligible == (1, 3) and chosen.winner == level  # the milder of the two within noise
    assert "within one paired standard error of the best (trial 1: 0.1500" in chosen.describe()
    unpaired = select(
        [Candidate(c.trial_number, c.objective, c.objective_se, c.drift, c.constraints) for c in (best, worse, level)]
    )
    assert not unpaired.paired and unpaired.eligible == (1, 2, 3) and unpaired.winner.trial_number == 2  # 0.150 + 0.037


def test_a_trial_without_resamples_is_judged_by_the_best_one_s_own_standard_error():
    shared = np.full(500, 0.15) + np.random.default_rng(1).normal(0, 0.03, 500)
    best = Candidate(1, 0.150, 0.030, 0.030, (-0.01,), resamples=tuple(shared))
    old = Candidate(2, 0.175, 0.030, 0.010, (-0.01,))  # recorded before trials kept their resamples
    undefined = Candidate(3, 0.190, 0.030, 0.005, (-0.01,), resamples=(float("nan"),) * 499 + (0.2,))
    chosen = select([best, old, undefined])
    assert chosen.eligible == (1, 2) and chosen.winner == old and not chosen.paired  # 0.175 ≤ 0.150 + 0.030 < 0.190
    assert "within one standard error of the best (trial 1: 0.1500 + 0.0300 = 0.1800)" in chosen.describe()


def test_a_resample_undefined_for_the_best_trial_is_left_out_of_every_paired_standard_error():
    """A resample on which the objective is undefined (NaN: a position group drew no query) says nothing about the
    noise between two trials: the paired spread is the standard deviation of the difference over the others."""
    nan = float("nan")
    best = Candidate(1, 0.200, 0.050, 0.030, (-0.01,), resamples=(0.10, 0.20, nan, 0.30))
    close = Candidate(2, 0.215, 0.050, 0.010, (-0.01,), resamples=(0.12, 0.25, nan, 0.31))
    differences = (0.02, 0.05, 0.01)
    mean = sum(differences) / 3
    spread = math.sqrt(sum((d - mean) ** 2 for d in differences) / 3)  # 0.0170
    assert paired_se(close, best) == pytest.approx(spread) and paired_se(best, best) == 0
    chosen = select([best, close])
    assert chosen.paired and chosen.eligible == (1, 2) and chosen.winner == close  # 0.215 − 0.200 ≤ 0.0170


def test_one_common_resample_measures_no_noise_so_the_best_trial_s_own_standard_error_judges():
    """The spread of a single difference is not a paired standard error of 0 (which would admit only exact ties)."""
    nan = float("nan")
    best = Candidate(1, 0.150, 0.030, 0.030, (-0.01,), resamples=(0.15, nan, nan))
    close = Candidate(2, 0.170, 0.030, 0.010, (-0.01,), resamples=(0.17, nan, nan))
    assert paired_se(close, best) is None
    chosen = select([best, close])
    assert not chosen.paired and chosen.eligible == (1, 2) and chosen.winner == close  # 0.170 ≤ 0.150 + 0.030


def test_an_unknown_rule_is_refused_by_name():
    with pytest.raises(ValueError, match="one-se, one-se-fairest, one-se-hm, lowest"):
        select([trial(0, 0.1, 0.0, 0.0)], "median")  # type: ignore[arg-type]


def per_query(scores: list[float], groups: list[int]) -> PerQuery:
    membership = np.eye(3)[groups]
    return PerQuery(
        tuple(f"q{i}" for i in range(len(scores))),
        np.array(scores),
        np.zeros(len(scores)),
        ("begin", "middle", "end"),
        membership,
        (),
        np.ones((len(scores), 1)),
    )


def test_trial_evidence_point_values_match_the_report_and_the_se_matches_a_hand_bootstrap():
    rng = np.random.default_rng(3)
    groups = [i % 3 for i in range(90)]
    base = per_query(list(rng.uniform(0, 1, 90) * np.array([1.0, 0.8, 0.5])[groups]), groups)  # begin favoured
    cand = per_query(list(np.clip(base.ndcg10 + rng.normal(0.05, 0.1, 90), 0, 1)), groups)
    evidence = trial_evidence(base, cand, n_resamples=400, seed=7)
    point_b, point_c = aggregate(base, np.ones((1, 90))), aggregate(cand, np.ones((1, 90)))
    assert evidence.objective == pytest.approx(point_c.psi[0])
    assert evidence.hm == pytest.approx(point_c.hm[0])
    assert evidence.ndcg_delta == pytest.approx(cand.ndcg10.mean() - base.ndcg10.mean())
    # the same resamples, drawn by hand: PSI's spread and the 2.5th percentile of the HM change
    weights = np.random.default_rng(7).multinomial(90, np.full(90, 1 / 90), size=400).astype(float)
    psi = aggregate(cand, weights).psi
    change = aggregate(cand, weights).hm - aggregate(base, weights).hm
    assert evidence.objective_se == pytest.approx(np.std(psi))
    assert evidence.psi_resamples == pytest.approx(psi)  # row by row: what pairs two trials in selection
    assert evidence.hm_low == pytest.approx(point_b.hm[0] + np.percentile(change, 2.5))
    assert evidence.hm_low < evidence.hm


def test_trial_evidence_needs_the_same_queries_and_position_groups():
    base = per_query([0.5, 0.5, 0.5], [0, 1, 2])
    other = PerQuery(
        ("x", "y", "z"), np.ones(3), np.zeros(3), ("begin", "middle", "end"), np.eye(3), (), np.ones((3, 1))
    )
    with pytest.raises(ValueError, match="different queries"):
        trial_evidence(base, other)


@pytest.mark.parametrize("size", [90, 301, 1277, 4000])
def test_the_uncalibrated_trial_meets_its_own_hm_floor_exactly(size: int) -> None:
    """The 'significant' floor is the uncalibrated HM as the report gives it; the baseline trial's lower HM bound is
    that HM plus a zero change. Both must come from one computation, or float rounding between two matrix products
    (one row against a thousand) can put the baseline an ulp under its own floor and leave no feasible trial."""
    rng = np.random.default_rng(size)
    for _ in range(10):
        groups = list(rng.integers(0, 3, size))
        base = per_query(list(rng.uniform(0, 1, size) * np.array([1.0, 0.8, 0.5])[groups]), groups)
        floor = float(aggregate(base, np.ones((1, size))).hm[0])  # what the report and `HmFloor.resolve` read
        evidence = trial_evidence(base, base)
        assert evidence.hm_low == floor and evidence.hm == floor
