"""What one trial tells selection: its objective, how noisy that is, and its change against no calibration.

All of it comes from one set of query resamples, so the objective's standard error and the interval of
the HM change describe the same noise. The objective is the paper's PSI (the mean over strata of the
within-stratum PSI, see `objectives.metrics`); its standard error lets selection treat configs whose
PSI differs by less than the tuning split can resolve as equals (`objectives.selection`).
"""

from __future__ import annotations

from dataclasses import dataclass

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


def trial_evidence(
    baseline: PerQuery, candidate: PerQuery, n_resamples: int = EVIDENCE_RESAMPLES, seed: int = 0
) -> TrialEvidence:
    """PSI and its bootstrap standard error, HM and the lower end of its 95% interval (the uncalibrated
    HM plus the 2.5th percentile of the paired HM change), and the change in aggregate nDCG@10."""
    if baseline.query_ids != candidate.query_ids:
        raise ValueError("baseline and candidate were scored on different queries; evaluate both on one dataset")
    if not candidate.group_order:
        raise ValueError("a dataset without position groups has no PSI or HM to tune")
    n = len(candidate.query_ids)
    weights = np.vstack([np.ones(n), np.random.default_rng(seed).multinomial(n, np.full(n, 1 / n), size=n_resamples)])
    base, cand = aggregate(baseline, weights), aggregate(candidate, weights)
    assert base.hm is not None and cand.hm is not None and cand.psi is not None
    psi, hm_change = cand.psi[1:], (cand.hm - base.hm)[1:]
    return TrialEvidence(
        objective=float(cand.psi[0]),
        objective_se=float(np.nanstd(psi)),
        hm=float(cand.hm[0]),
        hm_low=float(base.hm[0] + np.nanpercentile(hm_change, 2.5)),
        ndcg_delta=float(cand.ndcg10[0] - base.ndcg10[0]),
    )
