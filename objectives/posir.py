"""PosIR's own figures (Zeng et al., 2026), computed as the benchmark's analysis computes them.

The authors' analysis (github.com/Ziyang1060/PosIR, `ndcg_PSI_analysis.py`) reads, per query, its nDCG@10,
its reference span `[start, end]` in characters, and its positive document's length in characters and in
tokens (the benchmark's `pos_token_length` column: the script never tokenises anything itself). Then:

- nDCG@10: the mean over every query, placed or not.
- Where a query's answer sits: the span's midpoint `(start + end) / 2` over the document's character length,
  the midpoint capped at the length; a query whose length is not positive or whose midpoint is negative
  is left out of every position figure (and of the buckets).
- 20 position bins of equal width over [0, 1], closed on the right: (0.05k, 0.05(k+1)], the first one also
  holding 0. A span whose midpoint sits exactly on an edge belongs to the bin before it.
- Four length buckets by the token length, closed on the right: Q1 (0, 512], Q2 (512, 1024],
  Q3 (1024, 1536], Q4 above 1536; a token length that is missing or not positive joins no bucket (its query
  still counts in the pooled bins).
- Within a bucket: the mean nDCG@10 of each bin that holds a query; the bucket's nDCG@10 is the plain mean
  of those bin means (every filled bin weighs alike, whatever its count) and its PSI is 1 - min/max of them.
- PSI: 1 - min/max of the bin means over every placed query, the buckets pooled (not a mean of the buckets'
  PSIs).

Where the script has no answer, posfair says "undefined" (None): a bucket without a query (the script
stops with an error there), a PSI whose largest bin mean is 0 (the script's 0/0). A bucket with one filled
bin gets PSI 0, what the formula gives (the script stops at its correlation statistics, which need two).
A query without a span is left out of the position figures like one with an invalid span (the script
needs a span for every query).

As in `objectives.metrics`, every figure is computed for each row of a query-weight matrix, so the paired
bootstrap resamples through the same code that makes the point estimates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from objectives.bootstrap import Interval, percentile_interval, resampled_weights

BUCKETS: tuple[str, ...] = ("Q1", "Q2", "Q3", "Q4")
BUCKET_LIMITS: tuple[int, ...] = (512, 1024, 1536)
"""Upper token lengths of Q1, Q2, Q3 (each closed on the right); Q4 is everything longer."""
BINS = 20
BIN_EDGES = np.linspace(0.0, 1.0, BINS + 1)
"""The bins' edges as the analysis makes them (numpy's linspace, so e.g. 0.15 falls below the third edge)."""


def position_bin(relative: float) -> int:
    """The bin (0-19) of a relative position in [0, 1]: (edge k, edge k+1], the first bin closed at 0 too."""
    return max(int(np.searchsorted(BIN_EDGES, relative, side="left")) - 1, 0)


def length_bucket(token_length: float | None) -> int:
    """The bucket (index into BUCKETS) of a positive document's token length; -1 when it is missing or <= 0."""
    if token_length is None or not token_length > 0:
        return -1
    return next((b for b, limit in enumerate(BUCKET_LIMITS) if token_length <= limit), len(BUCKET_LIMITS))


def relative_position(span: Sequence[float] | None, char_length: float | None) -> float | None:
    """The span's midpoint over the character length, the midpoint capped at the length; None where the analysis
    drops the query: no span, a length that is missing or not positive, a negative midpoint."""
    if span is None or len(span) != 2 or any(v is None for v in span) or char_length is None or not char_length > 0:
        return None
    midpoint = (span[0] + span[1]) / 2
    if not midpoint >= 0:
        return None
    return min(midpoint, char_length) / char_length


@dataclass(frozen=True, eq=False)
class Placement:
    """Where the analysis puts each query, in one query order: `bins` 0-19 (-1: not placed) and `buckets`
    (index into BUCKETS; -1: in none, which a query not placed never is)."""

    bins: np.ndarray
    buckets: np.ndarray

    @classmethod
    def of(
        cls,
        spans: Sequence[Sequence[float] | None],
        char_lengths: Sequence[float | None],
        token_lengths: Sequence[float | None],
    ) -> Placement:
        """Place queries from what the benchmark's files say of each: span, character length, token length."""
        bins, buckets = [], []
        for span, chars, tokens in zip(spans, char_lengths, token_lengths, strict=True):
            relative = relative_position(span, chars)
            bins.append(-1 if relative is None else position_bin(relative))
            buckets.append(-1 if relative is None else length_bucket(tokens))
        return cls(np.array(bins, dtype=int), np.array(buckets, dtype=int))

    def __len__(self) -> int:
        return len(self.bins)


@dataclass(frozen=True, eq=False)
class PosIRAggregates:
    """The figures for every row of a query-weight matrix: `ndcg10`, `psi` (R,); `bucket_ndcg10`, `bucket_psi`
    (R, 4); `bucket_counts` (R, 4) weighted queries per bucket. NaN where undefined."""

    ndcg10: np.ndarray
    psi: np.ndarray
    bucket_ndcg10: np.ndarray
    bucket_psi: np.ndarray
    bucket_counts: np.ndarray
    bucket_bins: np.ndarray  # (R, 4) filled bins per bucket


def _over_bins(sums: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean of the filled bins' means, 1 - min/max of them, and how many are filled, over the last axis."""
    filled = counts > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        means = np.where(filled, sums / np.where(filled, counts, 1), np.nan)
        n_filled = filled.sum(-1)
        mean = np.where(n_filled > 0, np.where(filled, means, 0.0).sum(-1) / np.maximum(n_filled, 1), np.nan)
        high = np.where(filled, means, -np.inf).max(-1)
        low = np.where(filled, means, np.inf).min(-1)
        psi = np.where((n_filled > 0) & (high > 0), 1.0 - low / np.where(high > 0, high, 1.0), np.nan)
    return mean, psi, n_filled


def aggregate_posir(ndcg10: np.ndarray, placement: Placement, weights: np.ndarray) -> PosIRAggregates:
    """PosIR's figures for every row of `weights` ((R, n_queries) query counts)."""
    if len(placement) != len(ndcg10) or weights.shape[-1] != len(ndcg10):
        raise ValueError(
            f"{len(ndcg10)} scores, {len(placement)} placements and {weights.shape[-1]} weights per row: "
            "give one per query"
        )
    placed = placement.bins >= 0
    in_bin = np.zeros((len(ndcg10), BINS))
    in_bin[np.flatnonzero(placed), placement.bins[placed]] = 1.0
    in_bucket = np.zeros((len(ndcg10), len(BUCKETS)))
    bucketed = placement.buckets >= 0
    in_bucket[np.flatnonzero(bucketed), placement.buckets[bucketed]] = 1.0
    cells = (in_bucket[:, :, None] * in_bin[:, None, :]).reshape(len(ndcg10), len(BUCKETS) * BINS)
    shape = (len(weights), len(BUCKETS), BINS)
    bucket_ndcg, bucket_psi, bucket_bins = _over_bins(
        (weights @ (cells * ndcg10[:, None])).reshape(shape), (weights @ cells).reshape(shape)
    )
    _, psi, _ = _over_bins(weights @ (in_bin * ndcg10[:, None]), weights @ in_bin)
    return PosIRAggregates(
        ndcg10=weights @ ndcg10 / weights.sum(-1),
        psi=psi,
        bucket_ndcg10=bucket_ndcg,
        bucket_psi=bucket_psi,
        bucket_counts=weights @ in_bucket,
        bucket_bins=bucket_bins,
    )


def _defined(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


@dataclass(frozen=True)
class BucketFigures:
    """One length bucket: its nDCG@10 and PSI (None: undefined), its queries and how many bins they fill."""

    name: str
    ndcg10: float | None
    psi: float | None
    n_queries: int
    n_bins: int


@dataclass(frozen=True)
class PosIRFigures:
    """PosIR's figures for one run; scores on the 0-1 scale. `n_placed`: queries in the position figures."""

    n_queries: int
    n_placed: int
    ndcg10: float
    psi: float | None
    buckets: tuple[BucketFigures, ...]

    def as_dict(self) -> dict[str, float | None]:
        """Flat figures: `ndcg10`, `psi`, `n_queries`, `n_placed`, and per bucket `Q1/ndcg10`, `Q1/psi`,
        `Q1/n_queries`, `Q1/n_bins` (the analysis's `nDCG@10`, `PSI`, `nDCG@10(Q1)`, `PSI(Q1)`)."""
        flat: dict[str, float | None] = {
            "ndcg10": self.ndcg10,
            "psi": self.psi,
            "n_queries": self.n_queries,
            "n_placed": self.n_placed,
        }
        for bucket in self.buckets:
            flat |= {
                f"{bucket.name}/ndcg10": bucket.ndcg10,
                f"{bucket.name}/psi": bucket.psi,
                f"{bucket.name}/n_queries": bucket.n_queries,
                f"{bucket.name}/n_bins": bucket.n_bins,
            }
        return flat


def posir_figures(ndcg10: np.ndarray, placement: Placement) -> PosIRFigures:
    """PosIR's figures of one run's per-query nDCG@10."""
    point = aggregate_posir(ndcg10, placement, np.ones((1, len(ndcg10))))
    return PosIRFigures(
        n_queries=len(ndcg10),
        n_placed=int((placement.bins >= 0).sum()),
        ndcg10=float(point.ndcg10[0]),
        psi=_defined(point.psi[0]),
        buckets=tuple(
            BucketFigures(
                name,
                _defined(point.bucket_ndcg10[0, b]),
                _defined(point.bucket_psi[0, b]),
                int(point.bucket_counts[0, b]),
                int(point.bucket_bins[0, b]),
            )
            for b, name in enumerate(BUCKETS)
        ),
    )


@dataclass(frozen=True)
class PosIRDeltas:
    """Candidate - baseline, with percentile intervals over paired query resamples; None where undefined."""

    ndcg10: Interval
    psi: Interval | None
    bucket_ndcg10: dict[str, Interval | None]
    bucket_psi: dict[str, Interval | None]
    n_resamples: int


def posir_bootstrap(
    baseline: np.ndarray,
    candidate: np.ndarray,
    placement: Placement,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> PosIRDeltas:
    """Paired bootstrap of the change in PosIR's figures: both runs' per-query nDCG@10 on the same resamples
    (`objectives.bootstrap`'s, so one seed draws the same resamples for posfair's table and PosIR's)."""
    if baseline.shape != candidate.shape:
        raise ValueError("baseline and candidate were scored on different queries; score both on one dataset")

    def deltas(weights: np.ndarray) -> dict[str, np.ndarray]:
        base, cand = aggregate_posir(baseline, placement, weights), aggregate_posir(candidate, placement, weights)
        return {
            "ndcg10": cand.ndcg10 - base.ndcg10,
            "psi": cand.psi - base.psi,
            "bucket_ndcg10": cand.bucket_ndcg10 - base.bucket_ndcg10,
            "bucket_psi": cand.bucket_psi - base.bucket_psi,
        }

    point = deltas(np.ones((1, len(baseline))))
    blocks = [deltas(weights) for weights in resampled_weights(len(baseline), n_resamples, seed)]
    samples = {name: np.concatenate([block[name] for block in blocks]) for name in point}

    def interval(name: str, column: int | None = None) -> Interval | None:
        estimate, drawn = (
            (point[name], samples[name]) if column is None else (point[name][:, column], samples[name][:, column])
        )
        return None if math.isnan(estimate[0]) else percentile_interval(float(estimate[0]), drawn, confidence)

    ndcg = interval("ndcg10")
    assert ndcg is not None  # a mean over every query is always defined
    return PosIRDeltas(
        ndcg10=ndcg,
        psi=interval("psi"),
        bucket_ndcg10={name: interval("bucket_ndcg10", b) for b, name in enumerate(BUCKETS)},
        bucket_psi={name: interval("bucket_psi", b) for b, name in enumerate(BUCKETS)},
        n_resamples=n_resamples,
    )
