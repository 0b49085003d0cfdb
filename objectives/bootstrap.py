"""Paired bootstrap over queries: is a calibration's change in HM, PSI or nDCG@10 more than noise?

Both runs are scored on the same resampled queries (same indices), so per-query difficulty cancels and
the intervals are usually much tighter than two independent ones would be. Each resample is a row of
query counts, aggregated by `objectives.metrics.aggregate` — the same code that builds the report.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from objectives.metrics import PerQuery, aggregate

# Resamples drawn per block, so the (block × queries) count matrix stays around 32 MiB of float64.
_WEIGHT_CELLS_PER_BLOCK = 1 << 22


@dataclass(frozen=True)
class Interval:
    """A point estimate with a percentile confidence interval, on the metric's own (0–1) scale."""

    estimate: float
    low: float
    high: float

    def format(self, scale: float = 100.0, digits: int = 2) -> str:
        """Signed, e.g. `+1.23 [+0.40, +2.10]`; scale 100 shows nDCG/HM in points, use 1 for PSI."""

        def signed(value: float) -> str:
            return f"{value * scale:+.{digits}f}"

        return f"{signed(self.estimate)} [{signed(self.low)}, {signed(self.high)}]"


@dataclass(frozen=True)
class PairedBootstrap:
    """Candidate − baseline deltas. `hm`/`psi` are None for datasets without position groups.

    `n_undefined` counts resamples that left some (stratum, group) cell without a query. HM and PSI are
    undefined there (and so is a group's nDCG when the resample misses the group altogether); those
    resamples are left out of the intervals they would make undefined.
    """

    ndcg10: Interval
    hm: Interval | None
    psi: Interval | None
    groups: dict[str, Interval]
    n_resamples: int
    n_undefined: int
    tilt: Interval | None = None
    position_psi: Interval | None = None

    def intervals(self) -> dict[str, tuple[float, float, float]]:
        """metric → (estimate, low, high) on the 0–1 scale, for ndcg10 and, where defined, hm and psi."""
        named = {"ndcg10": self.ndcg10, "hm": self.hm, "psi": self.psi}
        return {name: (i.estimate, i.low, i.high) for name, i in named.items() if i is not None}

    def summary(self) -> str:
        """One log line: ΔHM and ΔnDCG@10 in points, ΔPSI raw."""
        parts = [f"ΔnDCG@10 {self.ndcg10.format()}"]
        if self.hm is not None and self.psi is not None:
            parts = [f"ΔHM {self.hm.format()}", f"ΔPSI {self.psi.format(scale=1, digits=3)}", *parts]
        return ", ".join(parts)


def paired_bootstrap(
    baseline: PerQuery,
    candidate: PerQuery,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> PairedBootstrap:
    """Percentile intervals for candidate − baseline over `n_resamples` query resamples.

    Resampling draws from the whole query set (not within strata); stratified HM/PSI are then the
    per-stratum means, exactly as in the report. The same seed gives the same intervals.
    """
    _check_paired(baseline, candidate)
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be at least 1, got {n_resamples}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")

    n_queries = len(baseline.query_ids)
    point = _deltas(baseline, candidate, np.ones((1, n_queries)))
    blocks = [_deltas(baseline, candidate, weights) for weights in resampled_weights(n_queries, n_resamples, seed)]
    resampled = {name: np.concatenate([b[name] for b in blocks]) for name in point}

    def interval(name: str, column: int | None = None) -> Interval:
        estimate, samples = point[name], resampled[name]
        if column is not None:
            estimate, samples = estimate[:, column], samples[:, column]
        return percentile_interval(float(estimate[0]), samples, confidence)

    has_groups = bool(baseline.group_order)
    return PairedBootstrap(
        ndcg10=interval("ndcg10"),
        hm=interval("hm") if has_groups else None,
        psi=interval("psi") if has_groups else None,
        groups={group: interval("groups", g) for g, group in enumerate(baseline.group_order)},
        n_resamples=n_resamples,
        n_undefined=int(np.isnan(resampled["hm"]).sum()) if has_groups else 0,
        tilt=interval("tilt") if "tilt" in point else None,
        position_psi=interval("position_psi") if "position_psi" in point else None,
    )


def resampled_weights(n_queries: int, n_resamples: int, seed: int) -> Iterator[np.ndarray]:
    """Query resamples with replacement, as blocks of (resamples, n_queries) counts; one seed, one sequence."""
    rng = np.random.default_rng(seed)
    block = max(1, _WEIGHT_CELLS_PER_BLOCK // n_queries)
    for start in range(0, n_resamples, block):
        size = min(block, n_resamples - start)
        yield rng.multinomial(n_queries, np.full(n_queries, 1.0 / n_queries), size=size).astype(np.float64)


def percentile_interval(estimate: float, samples: np.ndarray, confidence: float) -> Interval:
    """The point estimate with the central `confidence` share of the resampled values (undefined ones left out)."""
    tail = 50 * (1 - confidence)
    low, high = np.nanpercentile(samples, [tail, 100 - tail])
    return Interval(estimate, float(low), float(high))


@dataclass(frozen=True)
class PositionProfile:
    """One run's nDCG@10 in each position group and its tilt (`objectives.metrics`: the slope along the passage over
    the mean; None where positions are unknown), each with a percentile interval over query resamples (0–1 scale).

    `end_minus_begin` is the last group's nDCG@10 less the first's, both taken from the same resamples, so its
    interval says whether one end of the passage is favoured beyond noise (negative: the beginning). `hm` and `psi`
    are the report's HM and PSI with their intervals; all three are None for a run without position groups."""

    groups: dict[str, Interval]
    tilt: Interval | None
    end_minus_begin: Interval | None = None
    hm: Interval | None = None
    psi: Interval | None = None


def position_profile(
    run: PerQuery, n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95
) -> PositionProfile:
    """How one run does along the passage, with intervals: the same seed draws the same resamples for every run of a
    dataset, so the profiles of several configs are drawn over common resamples."""
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be at least 1, got {n_resamples}")
    point = aggregate(run, np.ones((1, len(run.query_ids))))
    blocks = [aggregate(run, weights) for weights in resampled_weights(len(run.query_ids), n_resamples, seed)]
    groups = np.concatenate([b.group_ndcg10 for b in blocks])
    profile = {
        group: percentile_interval(float(point.group_ndcg10[0, g]), groups[:, g], confidence)
        for g, group in enumerate(run.group_order)
    }
    tilt = None
    if point.tilt is not None and np.isfinite(point.tilt[0]):
        tilt = percentile_interval(
            float(point.tilt[0]), np.concatenate([b.tilt for b in blocks if b.tilt is not None]), confidence
        )
    if point.hm is None or point.psi is None:
        return PositionProfile(profile, tilt)
    first, last = point.group_ndcg10[0, 0], point.group_ndcg10[0, -1]
    gap = percentile_interval(float(last - first), groups[:, -1] - groups[:, 0], confidence)
    hms = np.concatenate([b.hm for b in blocks if b.hm is not None])
    psis = np.concatenate([b.psi for b in blocks if b.psi is not None])
    hm, psi = (
        percentile_interval(float(point.hm[0]), hms, confidence),
        percentile_interval(float(point.psi[0]), psis, confidence),
    )
    return PositionProfile(profile, tilt, gap, hm, psi)


def _deltas(baseline: PerQuery, candidate: PerQuery, weights: np.ndarray) -> dict[str, np.ndarray]:
    """Candidate − baseline for every row of `weights` (NaN where a row leaves a cell empty)."""
    base, cand = aggregate(baseline, weights), aggregate(candidate, weights)
    deltas = {"ndcg10": cand.ndcg10 - base.ndcg10, "groups": cand.group_ndcg10 - base.group_ndcg10}
    if base.hm is not None and cand.hm is not None and base.psi is not None and cand.psi is not None:
        deltas |= {"hm": cand.hm - base.hm, "psi": cand.psi - base.psi}
    if base.tilt is not None and cand.tilt is not None:
        deltas["tilt"] = cand.tilt - base.tilt
    if base.position_psi is not None and cand.position_psi is not None:
        deltas["position_psi"] = cand.position_psi - base.position_psi
    return deltas


def _check_paired(baseline: PerQuery, candidate: PerQuery) -> None:
    """A paired bootstrap needs both runs scored on the same queries with the same layout."""
    if baseline.query_ids != candidate.query_ids:
        raise ValueError("baseline and candidate were scored on different queries; evaluate both on one dataset")
    same_layout = (
        baseline.group_order == candidate.group_order
        and baseline.strata_order == candidate.strata_order
        and np.array_equal(baseline.membership, candidate.membership)
        and np.array_equal(baseline.stratum_membership, candidate.stratum_membership)
    )
    if not same_layout:
        raise ValueError("baseline and candidate have different group or stratum layouts; evaluate both on one dataset")
