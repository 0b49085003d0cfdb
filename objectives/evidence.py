"""What one trial tells selection: its objective, how noisy that is, and its change against no calibration.

All of it comes from one set of query resamples, so the objective's standard error and the interval of
the HM change describe the same noise. The objective is the paper's PSI (the mean over strata of the
within-stratum PSI, see `objectives.metrics`); its standard error lets selection treat configs whose
PSI differs by less than the tuning split can resolve as equals (`objectives.selection`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from objectives.metrics import PerQuery, aggregate

EVIDENCE_RESAMPLES = 500


@dataclass(frozen=True)
class TrialEvidence:
    """One trial on the tuning split, against the uncalibrated model on the same queries (0–1 scale)."""

    objective: float
    objective_se: float
    hm: float
    hm_low: float
    ndcg_delta: float
    # the upper end of HM's 95% interval: below the floor, the floor is missed beyond noise
    hm_high: float = float("nan")
    ndcg_delta_high: float = float("nan")  # the upper end of the nDCG@10 change's 95% interval
    # the signed trend along the passage (`objectives.metrics._tilt`); None: positions unknown
    tilt: float | None = None
    tilt_se: float = 0.0
    baseline_tilt: float | None = None
    baseline_tilt_se: float = 0.0  # 0: unknown (the uncalibrated direction is then taken as it stands)
    # PSI on each of the common resamples (`evidence_weights`): two trials' rows are paired, so the spread of
    # their difference is the noise between those two configs, not each one's own (`objectives.selection`)
    psi_resamples: np.ndarray | None = field(default=None, compare=False, repr=False)


def evidence_weights(n: int, n_resamples: int = EVIDENCE_RESAMPLES, seed: int = 0) -> np.ndarray:
    """Query counts for the evidence: row 0 the point estimate (every query once), then `n_resamples` bootstrap
    resamples of `n` queries. One seed for every trial: common random numbers, so configs compare resample by
    resample."""
    return np.vstack([np.ones(n), np.random.default_rng(seed).multinomial(n, np.full(n, 1 / n), size=n_resamples)])


def trial_evidence(
    baseline: PerQuery, candidate: PerQuery, n_resamples: int = EVIDENCE_RESAMPLES, seed: int = 0
) -> TrialEvidence:
    """PSI and its bootstrap standard error, HM and the ends of its 95% interval (the uncalibrated HM plus
    the 2.5th / 97.5th percentile of the paired HM change), the change in aggregate nDCG@10 (and the upper
    end of its interval), and the tilt with its standard error beside the uncalibrated tilt."""
    if baseline.query_ids != candidate.query_ids:
        raise ValueError("baseline and candidate were scored on different queries; evaluate both on one dataset")
    if not candidate.group_order:
        raise ValueError("a dataset without position groups has no PSI or HM to tune")
    weights = evidence_weights(len(candidate.query_ids), n_resamples, seed)
    base, cand = aggregate(baseline, weights), aggregate(candidate, weights)
    # the point figures from one row of weights, as the report computes them: a matrix product over a thousand rows
    # may round its first row an ulp apart, and the 'significant' HM floor is the report's HM, which the uncalibrated
    # trial (a zero change) must meet exactly
    base_point, cand_point = aggregate(baseline, weights[:1]), aggregate(candidate, weights[:1])
    assert base.hm is not None and cand.hm is not None and cand.psi is not None
    assert base_point.hm is not None and cand_point.hm is not None and cand_point.psi is not None
    psi, hm_change, ndcg_change = cand.psi[1:], (cand.hm - base.hm)[1:], (cand.ndcg10 - base.ndcg10)[1:]
    tilt = cand.tilt if cand.tilt is not None and np.isfinite(cand.tilt[0]) else None
    base_tilt = base.tilt if base.tilt is not None and np.isfinite(base.tilt[0]) else None
    return TrialEvidence(
        objective=float(cand_point.psi[0]),
        objective_se=float(np.nanstd(psi)),
        hm=float(cand_point.hm[0]),
        hm_low=float(base_point.hm[0] + np.nanpercentile(hm_change, 2.5)),
        ndcg_delta=float(cand_point.ndcg10[0] - base_point.ndcg10[0]),
        hm_high=float(base_point.hm[0] + np.nanpercentile(hm_change, 97.5)),
        ndcg_delta_high=float(np.nanpercentile(ndcg_change, 97.5)),
        tilt=None if tilt is None else float(tilt[0]),
        tilt_se=0.0 if tilt is None else float(np.nanstd(tilt[1:])),
        baseline_tilt=None if base_tilt is None else float(base_tilt[0]),
        baseline_tilt_se=0.0 if base_tilt is None else float(np.nanstd(base_tilt[1:])),
        psi_resamples=np.asarray(psi, dtype=float),
    )
