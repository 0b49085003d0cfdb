"""Specification of robust selection: the worst structure is the objective, a reversed bias is a violation,
and a trial is pruned between rungs only when it is out of the running beyond noise."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from objectives.constraint import Constraints
from objectives.evidence import TrialEvidence
from objectives.robustness import NO_DIRECTION, RobustEvidence, StructureEvidence, certain_violations, prune_reason
from objectives.selection import Candidate, select


def evidence(
    psi: float,
    se: float = 0.02,
    tilt: float | None = None,
    baseline_tilt: float | None = -0.5,
    tilt_se: float = 0.05,
    hm: float = 0.55,
    hm_low: float = 0.53,
    hm_high: float = 0.57,
    ndcg: float = 0.01,
    ndcg_high: float = 0.02,
) -> TrialEvidence:
    return TrialEvidence(psi, se, hm, hm_low, ndcg, hm_high, ndcg_high, tilt, tilt_se, baseline_tilt)


def robust(*structures: tuple[str, TrialEvidence]) -> RobustEvidence:
    """Evidence in the order given; "dev" is the tuning passages."""
    return RobustEvidence(tuple(StructureEvidence(name, e, tuning=name == "dev") for name, e in structures))


def candidate(number: int, robust_evidence: RobustEvidence, drift: float, floor_gap: float = -0.01) -> Candidate:
    """A trial as selection sees it, with the constraints a study would store (HM floor, reversal)."""
    reversal = robust_evidence.reversal()
    constraints = Constraints(0.5).values(0.55, 0.5 - floor_gap, 0.01, reversal=reversal)
    return Candidate(
        number, robust_evidence.objective, robust_evidence.objective_se, drift, tuple(constraints.values())
    )


def test_the_objective_is_the_worst_psi_over_the_structures_with_that_structure_s_noise():
    r = robust(("dev", evidence(0.05, 0.02)), ("crops", evidence(0.21, 0.04)), ("openings", evidence(0.12, 0.03)))
    assert r.worst.name == "crops" and r.objective == 0.21 and r.objective_se == 0.04


def test_the_worst_case_on_each_resample_is_the_highest_psi_over_the_structures_there() -> None:
    import dataclasses

    import numpy as np

    dev = dataclasses.replace(evidence(0.20), psi_resamples=np.array([0.20, 0.10, np.nan, np.nan]))
    crops = dataclasses.replace(evidence(0.15), psi_resamples=np.array([0.10, 0.30, 0.05, np.nan]))
    both = robust(("dev", dev), ("crops", crops)).objective_resamples
    assert both is not None and both[:3] == pytest.approx([0.20, 0.30, 0.05]) and math.isnan(both[3])
    assert robust(("dev", dev), ("crops", evidence(0.15))).objective_resamples is None  # a structure without resamples


def test_a_reversal_is_a_tilt_against_the_uncalibrated_direction():
    # uncalibrated: the beginning is favoured (tilt < 0); the trial now favours the end (tilt > 0): reversed
    assert StructureEvidence("s", evidence(0.1, tilt=0.12, baseline_tilt=-0.4)).reversal == pytest.approx(0.12)
    # the bias kept its sign, only smaller: not reversed
    assert StructureEvidence("s", evidence(0.1, tilt=-0.05, baseline_tilt=-0.4)).reversal == pytest.approx(-0.05)
    # a model biased towards the end (tilt > 0) is reversed when the beginning becomes favoured
    assert StructureEvidence("s", evidence(0.1, tilt=-0.2, baseline_tilt=0.3)).reversal == pytest.approx(0.2)
    assert StructureEvidence("s", evidence(0.1, tilt=None)).reversal is None


def test_a_structure_whose_uncalibrated_tilt_is_within_noise_has_no_direction_to_reverse():
    """Where the uncalibrated model favours neither end beyond noise (|tilt| under 1.96 of its bootstrap
    standard errors), a calibrated tilt of either sign is unevenness that PSI measures, not a reversal."""
    level = dataclasses.replace(evidence(0.1, tilt=0.12, baseline_tilt=-0.017), baseline_tilt_se=0.02)
    assert StructureEvidence("openings", level).reversal is None
    tilted = dataclasses.replace(evidence(0.1, tilt=0.12, baseline_tilt=-0.05), baseline_tilt_se=0.02)
    assert StructureEvidence("openings", tilted).reversal == pytest.approx(0.12)  # 2.5 standard errors: a direction
    r = robust(("dev", evidence(0.05, tilt=-0.02)), ("openings", level))
    assert r.reversal() == pytest.approx(-0.02)  # only the structure with a direction counts
    assert "reversal" not in r.per_structure()["openings"] and r.per_structure()["openings"]["tilt"] == pytest.approx(
        0.12
    )


def test_where_no_structure_has_a_direction_the_rule_is_met_and_says_there_is_none_to_reverse():
    """The rule stays checked (every trial names it, as the study's rule does); with nothing to reverse it is met."""
    level = dataclasses.replace(evidence(0.1, tilt=0.3, baseline_tilt=-0.01), baseline_tilt_se=0.02)
    r = robust(("dev", level), ("openings", level))
    assert r.reversal() == 0.0 and r.reversal(allowance=0.05) == pytest.approx(-0.05)
    assert r.deciding()["reversal"] == NO_DIRECTION
    constraints = Constraints(0.5)
    sentence = constraints.explain(constraints.values(0.55, 0.53, 0.01, reversal=r.reversal()), r.deciding())
    assert (
        "the no-reversal rule met (no tuning structure favours one end beyond noise uncalibrated: none to reverse)"
        in sentence
    )
    assert robust(("dev", evidence(0.05, tilt=None))).reversal() is None  # positions unknown: not checked at all


def test_the_uncalibrated_tilt_s_standard_error_is_its_spread_over_the_evidence_resamples():
    """Scored against itself, the uncalibrated model's tilt and its standard error are the candidate's; scored
    beside a calibrated run, the same figures stand as the baseline's."""
    from objectives.evidence import trial_evidence
    from objectives.metrics import PerQuery

    rng = np.random.default_rng(3)
    positions = rng.uniform(0, 1, 400)
    groups = np.minimum((positions * 3).astype(int), 2)

    def run(slope: float) -> PerQuery:
        scores = np.clip(0.7 + slope * positions + rng.normal(0, 0.2, 400), 0, 1)
        ids = tuple(f"q{i}" for i in range(400))
        return PerQuery(
            ids, scores, scores, ("begin", "middle", "end"), np.eye(3)[groups], (), np.ones((400, 1)), positions
        )

    uncalibrated, calibrated = run(-0.3), run(0.0)
    alone = trial_evidence(uncalibrated, uncalibrated, n_resamples=300)
    beside = trial_evidence(uncalibrated, calibrated, n_resamples=300)
    assert alone.tilt is not None and alone.tilt < 0 and alone.tilt_se > 0
    assert beside.baseline_tilt == pytest.approx(alone.tilt) and beside.baseline_tilt_se == pytest.approx(alone.tilt_se)
    assert beside.tilt_se != pytest.approx(alone.tilt_se)


def test_the_reversal_constraint_takes_the_most_reversed_structure():
    r = robust(("dev", evidence(0.05, tilt=-0.02)), ("crops", evidence(0.2, tilt=0.15, tilt_se=0.05)))
    assert r.reversal() == pytest.approx(0.15)
    assert r.reversal(allowance=0.05) == pytest.approx(0.10)
    assert r.reversal(z=2) == pytest.approx(0.05)  # less two standard errors: reversed beyond noise
    assert robust(("dev", evidence(0.05, tilt=None))).reversal() is None
    values = Constraints(0.5).values(0.55, 0.53, 0.01, reversal=r.reversal())
    assert values["reversal"] == pytest.approx(0.15)
    assert "reversal" not in Constraints(0.5, max_reversal=None).values(0.55, 0.53, 0.01, reversal=0.15)


def test_the_lowest_dev_psi_that_reverses_the_bias_on_one_structure_loses_to_a_milder_config():
    """The synthetic study of issue 20: λ 1 is flattest on dev but turns the bias round on the crops; a milder
    config is fair on both without reversing it, and wins; the edge of the space wins only when it is better
    everywhere."""
    # lowest dev PSI
    edge = robust(("dev", evidence(0.02, 0.02, tilt=0.01)), ("crops", evidence(0.18, 0.04, tilt=0.25)))
    milder = robust(("dev", evidence(0.07, 0.02, tilt=-0.08)), ("crops", evidence(0.09, 0.03, tilt=-0.05)))
    plain_psi = select([Candidate(6, 0.02, 0.02, 0.06, (-0.01,)), Candidate(2, 0.07, 0.02, 0.01, (-0.01,))])
    assert plain_psi.winner.trial_number == 6  # ranked by the dev PSI alone, the edge wins
    chosen = select([candidate(6, edge, drift=0.06), candidate(2, milder, drift=0.01)])
    assert chosen.winner.trial_number == 2
    # without the reversal it is the worst case that decides: the edge's crops PSI 0.18 is beyond 0.09 + 0.03
    assert (
        select(
            [
                Candidate(6, edge.objective, edge.objective_se, 0.06, (-0.01,)),
                Candidate(2, milder.objective, milder.objective_se, 0.01, (-0.01,)),
            ]
        ).winner.trial_number
        == 2
    )
    better_everywhere = robust(("dev", evidence(0.02, 0.01, tilt=-0.01)), ("crops", evidence(0.03, 0.01, tilt=-0.02)))
    assert (
        select([candidate(6, better_everywhere, drift=0.06), candidate(2, milder, drift=0.01)]).winner.trial_number == 6
    )


def test_a_trial_worse_beyond_noise_than_the_selection_threshold_is_pruned_one_within_noise_is_not():
    threshold = 0.10  # best complete trial: 0.08 + SE 0.02
    beyond = robust(("dev", evidence(0.20, 0.03)))  # 0.20 − 1 × 0.03 = 0.17 > 0.10
    within = robust(("dev", evidence(0.125, 0.03)))  # 0.125 − 0.03 = 0.095 ≤ 0.10: could still be eligible
    assert "worst-case PSI 0.200" in prune_reason(beyond, threshold, {}, ["crops"])
    assert prune_reason(within, threshold, {}, ["crops"]) is None
    # a lower bound needs no noise margin of its own: one SE covers how far the threshold can still rise
    assert "− 1 SE = 0.110 is above 0.100" in prune_reason(
        robust(("dev", evidence(0.14, 0.03))), threshold, {}, ["crops"]
    )
    assert prune_reason(beyond, None, {}, ["crops"]) is None  # no feasible complete trial yet: nothing to beat
    assert prune_reason(beyond, threshold, {}, []) is None  # the last rung is scored: the trial is complete
    assert prune_reason(beyond, math.nan, {}, ["crops"]) is None


def test_constraints_prune_only_when_missed_beyond_noise():
    tuning = evidence(0.1, hm=0.49, hm_low=0.47, hm_high=0.51, ndcg=-0.01, ndcg_high=0.002)
    r = robust(("dev", tuning))
    # the floor 0.50 lies inside HM's interval [0.47, 0.51]: not beyond noise; nDCG's change reaches +0.2: neither
    assert certain_violations(tuning, hm_floor=0.50, max_ndcg_drop=0.0) == {}
    missed = certain_violations(tuning, hm_floor=0.52, max_ndcg_drop=0.0)
    assert missed == {"hm_floor": pytest.approx(0.01)}
    lost = evidence(0.1, ndcg=-0.03, ndcg_high=-0.01)
    assert certain_violations(lost, 0.4, 0.0) == {"ndcg_drop": pytest.approx(0.01)}
    assert certain_violations(lost, 0.4, 0.02) == {}  # within the allowance
    assert certain_violations(lost, 0.4, None) == {}  # --max-ndcg-drop none
    # only what a pool's scores bound (HM, nDCG@10): a structure's reversed bias is never among them
    flipped = evidence(0.1, tilt=0.2, tilt_se=0.05, baseline_tilt=-0.5)
    assert certain_violations(flipped, 0.4, None) == {}
    said = Constraints(0.52).clause("hm_floor", 0.52 - 0.51)  # the tuning split scored: its lower bound 0.51 under 0.52
    assert (
        prune_reason(r, None, [said], ["crops"])
        == "misses the HM floor (HM lower bound 51.00 < 52.00), which no remaining structure can undo"
    )


def test_a_structure_that_loses_ndcg_beyond_its_noise_makes_the_trial_infeasible_the_tuning_split_aside():
    """On the tuning split nDCG@10 is held by its point estimate (`ndcg_drop`); on every other structure a loss
    counts once even the favourable end of its 95% interval is a loss (`structure_ndcg`)."""
    dev = evidence(0.10, ndcg=-0.05, ndcg_high=-0.03)  # the tuning split's own loss is ndcg_drop's business
    noisy = evidence(0.12, ndcg=-0.008, ndcg_high=0.004)  # a loss within noise: the interval reaches +0.4 points
    significant = evidence(0.12, ndcg=-0.018, ndcg_high=-0.004)  # even the favourable end loses 0.4 points
    assert robust(("dev", dev)).significant_ndcg_loss() is None, "no other structure scored yet"
    assert robust(("dev", dev), ("crops", noisy)).significant_ndcg_loss() == pytest.approx(-0.004)
    both = robust(("dev", dev), ("crops", noisy), ("openings", significant))
    assert both.significant_ndcg_loss() == pytest.approx(0.004), (
        "the worst structure decides, and more can only raise it"
    )
    values = Constraints(0.5).values(0.55, 0.53, 0.01, structure_ndcg_loss=both.significant_ndcg_loss())
    assert values["structure_ndcg"] == pytest.approx(0.004) and values["ndcg_drop"] == pytest.approx(-0.01)
    assert (
        Constraints(0.5, max_ndcg_drop=0.005).values(0.55, 0.53, 0.01, structure_ndcg_loss=0.004)["structure_ndcg"] < 0
    )
    assert "structure_ndcg" not in Constraints(0.5, max_ndcg_drop=None).values(
        0.55, 0.53, 0.01, structure_ndcg_loss=0.004
    )


def test_the_tuning_passages_own_loss_is_not_a_structure_loss_wherever_they_were_scored() -> None:
    """Rungs go cheapest first, so the tuning passages may be scored after another structure: their nDCG@10
    change is the `ndcg_drop` constraint's to judge (a point figure), never the structures' (an interval)."""
    dev = evidence(0.05, ndcg=-0.02, ndcg_high=-0.01)  # a loss beyond noise on the tuning passages
    crops = evidence(0.1, ndcg=-0.001, ndcg_high=0.004)  # within noise
    assert robust(("crops", crops), ("dev", dev)).significant_ndcg_loss() == pytest.approx(-0.004)
    assert robust(("dev", dev), ("crops", crops)).significant_ndcg_loss() == pytest.approx(-0.004)


def test_the_drift_ratio_is_the_largest_drift_over_the_structures_as_a_multiple_of_the_reference_s_there():
    moved = RobustEvidence(
        (
            StructureEvidence("dev", evidence(0.1), tuning=True, drift=0.06),  # 6x the reference's 0.01
            StructureEvidence("crops", evidence(0.1), drift=0.02),  # 4x its 0.005
            StructureEvidence("half", evidence(0.1), drift=0.0),  # unmoved here, as the reference is
        )
    )
    reference = {"dev": 0.01, "crops": 0.005, "half": 0.0}
    assert moved.drift_ratio(reference) == pytest.approx(6.0)
    # a structure the reference never measured is left out
    assert moved.drift_ratio({"crops": 0.005}) == pytest.approx(4.0)
    assert moved.drift_ratio({"half": 0.0}) is None and moved.drift_ratio({}) is None  # nothing to compare with
    assert moved.per_structure()["dev"]["drift"] == 0.06
    assert moved.drift_ratio(None) is None  # moved, and no yardstick yet: unknown


def test_no_calibration_drifts_zero_times_any_reference_even_before_the_reference_is_known():
    """The baseline trial runs before the paper default whose drift is the yardstick: it still has a drift
    constraint, so every complete trial of a study has the same constraints (GPSampler needs them alike)."""
    unmoved = RobustEvidence(
        (
            StructureEvidence("dev", evidence(0.3), tuning=True, drift=0.0),
            StructureEvidence("crops", evidence(0.2), drift=0.0),
        )
    )
    assert unmoved.drift_ratio(None) == 0.0 and unmoved.drift_ratio({"dev": 0.01}) == 0.0
    assert (
        Constraints(0.5, max_drift=2.0).values(0.55, 0.53, 0.01, drift_ratio=unmoved.drift_ratio(None))["drift"] == -2.0
    )


def test_the_drift_limit_is_a_multiple_of_the_reference_s_drift():
    assert Constraints(0.5, max_drift=2.0).values(0.55, 0.53, 0.01, drift_ratio=6.0)["drift"] == pytest.approx(4.0)
    assert Constraints(0.5, max_drift=2.0).values(0.55, 0.53, 0.01, drift_ratio=1.5)["drift"] == pytest.approx(-0.5)
    assert "drift" not in Constraints(0.5, max_drift=2.0).values(0.55, 0.53, 0.01)  # no reference: not applied
    assert "drift" not in Constraints(0.5).values(0.55, 0.53, 0.01, drift_ratio=6.0)  # unconstrained by default
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match="max_drift"):
            Constraints(0.5, max_drift=bad)
