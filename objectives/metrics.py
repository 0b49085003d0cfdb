"""Position-aware retrieval metrics (paper §4.3): per-group nDCG@10, their harmonic mean (HM) and PSI.

Per-query scores come from ir-measures (pytrec_eval), so nDCG matches the reference implementation
the literature reports. Everything above the query level is plain numpy over a query-weight matrix,
which lets the bootstrap reuse exactly the aggregation the report uses (`aggregate`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import ir_measures
import numpy as np

NDCG10 = ir_measures.nDCG @ 10
RECALL10 = ir_measures.R @ 10
POSITION_BINS = tuple(f"fifth-{i}" for i in range(1, 6))
"""Bins of the finer position profile: fifths of the relative position of a query's answer."""
THIRD_CENTRES = {"begin": 1 / 6, "middle": 1 / 2, "end": 5 / 6}
"""Where a thirds group sits, for the tilt of a dataset that knows groups but not spans (FineWeb-PosQ)."""


class Judged(Protocol):
    """What scoring reads of a benchmark: plain mappings (`tuner.data.PositionalDataset` has them all).

    Metrics know no loader: any object with these attributes can be scored.
    """

    @property
    def name(self) -> str: ...
    @property
    def queries(self) -> Mapping[str, str]: ...
    @property
    def qrels(self) -> Mapping[str, Mapping[str, int]]: ...
    @property
    def groups(self) -> Mapping[str, tuple[str, ...]]: ...  # query → its position groups (none: general retrieval)
    @property
    def group_order(self) -> tuple[str, ...]: ...
    @property
    def strata(self) -> Mapping[str, str]: ...  # query → stratum (PosIR's length quartiles)
    @property
    def positions(self) -> Mapping[str, float]: ...  # query → its answer's relative position in [0, 1]


def harmonic_mean(values: Sequence[float]) -> float:
    """Harmonic mean of per-group nDCG@10 (the paper's HM): dominated by the worst group, so a
    calibration cannot buy HM by over-serving one position. Any value 0 gives 0."""
    return float(_harmonic_mean(_nonnegative(values)))


def position_sensitivity(values: Sequence[float]) -> float:
    """Position Sensitivity Index (Zeng et al., 2025): 1 − min/max over groups, 0 when flat.

    Defined as 0 when every group scores 0 (max 0): nothing varies with position then.
    """
    return float(_position_sensitivity(_nonnegative(values)))


def _nonnegative(values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"expected a non-empty list of per-group scores, got {values!r}")
    if (array < 0).any():
        raise ValueError(f"per-group scores must be non-negative, got {values!r}")
    return array


def _harmonic_mean(values: np.ndarray) -> np.ndarray:
    """HM over the last axis; 1/0 = inf makes any zero give 0, and NaN (an empty group) propagates."""
    with np.errstate(divide="ignore"):
        return values.shape[-1] / (1.0 / values).sum(axis=-1)


def _position_sensitivity(values: np.ndarray) -> np.ndarray:
    """PSI over the last axis; NaN (an empty group) propagates."""
    low, high = values.min(axis=-1), values.max(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(high == 0, 0.0, 1.0 - low / high)


def score_queries(
    run: Mapping[str, Mapping[str, float]],
    qrels: Mapping[str, Mapping[str, int]],
    query_ids: Sequence[str],
) -> tuple[np.ndarray, np.ndarray]:
    """Per-query nDCG@10 and Recall@10, aligned with `query_ids`, computed by ir-measures.

    Labels are binarised (> 0 is relevant), following Zeng et al. (2025). A query missing from the
    run scores 0. Scores are cast to `float` because pytrec_eval rejects numpy scalars.
    """
    binary_qrels = {qid: {doc: int(label > 0) for doc, label in qrels[qid].items()} for qid in query_ids}
    scored_run = {qid: {doc: float(s) for doc, s in run[qid].items()} for qid in query_ids if qid in run}
    row = {qid: i for i, qid in enumerate(query_ids)}
    values = {NDCG10: np.zeros(len(query_ids)), RECALL10: np.zeros(len(query_ids))}
    for metric in ir_measures.iter_calc([NDCG10, RECALL10], binary_qrels, scored_run):
        values[metric.measure][row[metric.query_id]] = metric.value
    return values[NDCG10], values[RECALL10]


@dataclass(frozen=True, eq=False)
class PerQuery:
    """Per-query scores and the group/stratum layout needed to aggregate them, in one query order.

    `membership[i, g]` is 1 when query i counts in group g (a query may count in several).
    `stratum_membership` is one-hot over `strata_order` (all zeros for a query without a position, which
    counts for aggregate nDCG only); an unstratified dataset gets a single all-ones column (and
    `strata_order == ()`), so one code path serves both. `positions` holds each query's relative answer
    position in [0, 1] (NaN where unknown); `placed` says where it is the span's own midpoint rather than
    the centre of the query's third.
    """

    query_ids: tuple[str, ...]
    ndcg10: np.ndarray
    recall10: np.ndarray
    group_order: tuple[str, ...]
    membership: np.ndarray
    strata_order: tuple[str, ...]
    stratum_membership: np.ndarray
    positions: np.ndarray | None = None
    placed: np.ndarray | None = None

    def cell_counts(self) -> np.ndarray:
        """Queries per (stratum, group) cell, shape (strata, groups)."""
        return (self.stratum_membership.T @ self.membership).astype(int)


@dataclass(frozen=True, eq=False)
class Aggregates:
    """Metrics for every row of a query-weight matrix (row r: one bootstrap resample, or the sample).

    Shapes: `ndcg10`, `recall10` (R,); `group_ndcg10` (R, G) pooled over strata; the `stratum_*`
    arrays (R, S, G) and (R, S), None for a dataset without position groups. A cell that a row leaves
    empty is NaN, and so is every HM/PSI that depends on it. `position_ndcg10` (R, 5) is the profile
    over fifths of the answer position and `tilt` (R,) the signed trend along the passage (see
    `tilt`); both None where the dataset cannot place its queries.
    """

    ndcg10: np.ndarray
    recall10: np.ndarray
    group_ndcg10: np.ndarray
    stratum_group_ndcg10: np.ndarray
    stratum_hm: np.ndarray | None
    stratum_psi: np.ndarray | None
    position_ndcg10: np.ndarray | None = None
    tilt: np.ndarray | None = None

    @property
    def position_psi(self) -> np.ndarray | None:
        """PSI over the fifths of the position profile: position sensitivity at a finer granularity."""
        return None if self.position_ndcg10 is None else _position_sensitivity(self.position_ndcg10)

    @property
    def hm(self) -> np.ndarray | None:
        """HM per row: the mean over strata of the within-stratum HM."""
        return None if self.stratum_hm is None else self.stratum_hm.mean(axis=1)

    @property
    def psi(self) -> np.ndarray | None:
        """PSI per row: the mean over strata of the within-stratum PSI."""
        return None if self.stratum_psi is None else self.stratum_psi.mean(axis=1)


def aggregate(per_query: PerQuery, weights: np.ndarray) -> Aggregates:
    """Weighted per-group, per-stratum and overall means; `weights` is (R, n_queries) query counts.

    Every mean is one matrix product against a query × (stratum, group) membership matrix, so a
    query in several groups counts in each and R bootstrap resamples cost R rows, not a loop.
    """
    n_strata, n_groups = per_query.stratum_membership.shape[1], len(per_query.group_order)
    cells = (per_query.stratum_membership[:, :, None] * per_query.membership[:, None, :]).reshape(
        len(per_query.query_ids), n_strata * n_groups
    )
    totals = (weights @ (cells * per_query.ndcg10[:, None])).reshape(len(weights), n_strata, n_groups)
    counts = (weights @ cells).reshape(len(weights), n_strata, n_groups)
    with np.errstate(divide="ignore", invalid="ignore"):
        stratum_group = totals / counts
        pooled_group = totals.sum(axis=1) / counts.sum(axis=1)
    n_weighted = weights.sum(axis=1)
    profile = trend = None
    if per_query.positions is not None:
        known = ~np.isnan(per_query.positions)
        if known.any():
            trend = _tilt(weights[:, known], per_query.positions[known], per_query.ndcg10[known])
        if per_query.placed is not None and per_query.placed.all():
            bins = np.minimum((per_query.positions * len(POSITION_BINS)).astype(int), len(POSITION_BINS) - 1)
            onehot = np.eye(len(POSITION_BINS))[bins]
            with np.errstate(divide="ignore", invalid="ignore"):
                profile = (weights @ (onehot * per_query.ndcg10[:, None])) / (weights @ onehot)
    return Aggregates(
        ndcg10=weights @ per_query.ndcg10 / n_weighted,
        recall10=weights @ per_query.recall10 / n_weighted,
        group_ndcg10=pooled_group,
        stratum_group_ndcg10=stratum_group,
        stratum_hm=_harmonic_mean(stratum_group) if n_groups else None,
        stratum_psi=_position_sensitivity(stratum_group) if n_groups else None,
        position_ndcg10=profile,
        tilt=trend,
    )


def _tilt(weights: np.ndarray, positions: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Signed trend of nDCG@10 along the passage, relative to its mean, for every row of `weights`.

    The weighted least-squares slope of per-query nDCG@10 against the answer's relative position
    (0 = start, 1 = end), divided by the mean nDCG@10: the fitted change from the first to the last
    character as a fraction of the mean. Negative: the beginning is favoured (the bias calibration
    corrects); positive: the end is favoured (over-correction). NaN when a row's positions do not vary.
    """
    n, sx, sy = weights.sum(axis=1), weights @ positions, weights @ scores
    sxx, sxy = weights @ positions**2, weights @ (positions * scores)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (n * sxy - sx * sy) / (n * sxx - sx**2) / (sy / n)


@dataclass(frozen=True)
class StratumReport:
    """Position metrics within one stratum (e.g. a PosIR length quartile)."""

    name: str
    group_ndcg10: dict[str, float]
    group_counts: dict[str, int]
    hm: float
    psi: float


@dataclass(frozen=True)
class PositionReport:
    """What one run scores on one dataset; all scores on the 0–1 scale.

    `group_ndcg10` is in the dataset's group_order and pools all strata. `hm`/`psi` are None for
    general-retrieval sets (no groups). For stratified datasets they are the unweighted mean over
    `strata` of the within-stratum HM/PSI — comparing positions inside a length quartile keeps
    document length from masquerading as position — so they are not the HM/PSI of `group_ndcg10`.
    `position_ndcg10`/`position_psi` profile the passage by fifths where the dataset knows its spans;
    `tilt` says which end is favoured (negative: the beginning; positive: the end), see `_tilt`.
    """

    dataset: str
    n_queries: int
    ndcg10: float
    recall10: float
    group_ndcg10: dict[str, float]
    group_counts: dict[str, int]
    hm: float | None
    psi: float | None
    strata: tuple[StratumReport, ...] = ()
    position_ndcg10: dict[str, float] = field(default_factory=dict)
    position_psi: float | None = None
    tilt: float | None = None

    def as_dict(self) -> dict[str, float]:
        """Flat metrics for logging: `ndcg10`, `recall10`, `n_queries`, `ndcg10_<group>`, `n_<group>` (queries
        in the group), `hm`, `psi`, `ndcg10_fifth-k`, `psi_fifths`, `tilt`, and per stratum
        `<stratum>/ndcg10_<group>`, `<stratum>/n_<group>`, `<stratum>/hm`, `<stratum>/psi`."""
        flat: dict[str, float] = {"ndcg10": self.ndcg10, "recall10": self.recall10, "n_queries": self.n_queries}
        flat |= {f"ndcg10_{group}": value for group, value in self.group_ndcg10.items()}
        flat |= {f"n_{group}": count for group, count in self.group_counts.items()}
        if self.hm is not None and self.psi is not None:
            flat |= {"hm": self.hm, "psi": self.psi}
        flat |= {f"ndcg10_{name}": value for name, value in self.position_ndcg10.items()}
        if self.position_psi is not None:
            flat["psi_fifths"] = self.position_psi
        if self.tilt is not None:
            flat["tilt"] = self.tilt
        for stratum in self.strata:
            flat |= {f"{stratum.name}/ndcg10_{group}": value for group, value in stratum.group_ndcg10.items()}
            flat |= {f"{stratum.name}/n_{group}": count for group, count in stratum.group_counts.items()}
            flat |= {f"{stratum.name}/hm": stratum.hm, f"{stratum.name}/psi": stratum.psi}
        return flat


def evaluate(run: Mapping[str, Mapping[str, float]], dataset: Judged) -> tuple[PositionReport, PerQuery]:
    """Score a run on every query of a dataset; the PerQuery lets the bootstrap resample without
    rescoring. A dataset whose queries carry no group is scored as a general-retrieval set."""
    per_query = _per_query(run, dataset)
    point = aggregate(per_query, np.ones((1, len(per_query.query_ids))))
    counts = per_query.cell_counts()
    groups = per_query.group_order
    hm, psi = point.hm, point.psi

    def by_group(values: np.ndarray) -> dict[str, float]:
        return {group: float(value) for group, value in zip(groups, values)}

    strata: tuple[StratumReport, ...] = ()
    if point.stratum_hm is not None and point.stratum_psi is not None:
        strata = tuple(
            StratumReport(
                name=name,
                group_ndcg10=by_group(point.stratum_group_ndcg10[0, s]),
                group_counts=dict(zip(groups, counts[s].tolist())),
                hm=float(point.stratum_hm[0, s]),
                psi=float(point.stratum_psi[0, s]),
            )
            for s, name in enumerate(per_query.strata_order)
        )
    report = PositionReport(
        dataset=dataset.name,
        n_queries=len(per_query.query_ids),
        ndcg10=float(point.ndcg10[0]),
        recall10=float(point.recall10[0]),
        group_ndcg10=by_group(point.group_ndcg10[0]),
        group_counts=dict(zip(groups, counts.sum(axis=0).tolist())),
        hm=None if hm is None else float(hm[0]),
        psi=None if psi is None else float(psi[0]),
        strata=strata,
        position_ndcg10={}
        if point.position_ndcg10 is None
        else dict(zip(POSITION_BINS, point.position_ndcg10[0].tolist())),
        position_psi=None if point.position_psi is None else float(point.position_psi[0]),
        tilt=None if point.tilt is None else float(point.tilt[0]),
    )
    return report, per_query


def _per_query(run: Mapping[str, Mapping[str, float]], dataset: Judged) -> PerQuery:
    """Score the dataset's queries and lay out their group and stratum membership.

    The dataset has already checked that every query is judged and every group label is known.
    """
    query_ids = tuple(dataset.queries)
    group_order = dataset.group_order if any(dataset.groups.values()) else ()
    group_index = {group: g for g, group in enumerate(group_order)}
    membership = np.zeros((len(query_ids), len(group_order)))
    for i, qid in enumerate(query_ids):
        for group in dataset.groups.get(qid, ()):
            membership[i, group_index[group]] = 1.0

    if dataset.strata:
        # A query without a position (no group) needs no stratum: it counts for aggregate nDCG only.
        unstratified = [qid for qid in query_ids if qid not in dataset.strata and dataset.groups.get(qid)]
        if unstratified:
            raise ValueError(
                f"dataset {dataset.name!r}: {len(unstratified)} queries have a position group but no stratum, "
                f"e.g. {unstratified[0]!r}; in a stratified dataset every grouped query needs one"
            )
        strata_order = tuple(sorted({dataset.strata[qid] for qid in query_ids if qid in dataset.strata}))
        stratum_index = {name: s for s, name in enumerate(strata_order)}
        stratum_membership = np.zeros((len(query_ids), len(strata_order)))
        for i, qid in enumerate(query_ids):
            if qid in dataset.strata:
                stratum_membership[i, stratum_index[dataset.strata[qid]]] = 1.0
    else:
        strata_order = ()
        stratum_membership = np.ones((len(query_ids), 1))

    ndcg10, recall10 = score_queries(run, dataset.qrels, query_ids)
    positions, placed = _positions(dataset, query_ids) if group_order else (None, None)
    per_query = PerQuery(
        query_ids, ndcg10, recall10, group_order, membership, strata_order, stratum_membership, positions, placed
    )
    empty = np.argwhere(per_query.cell_counts() == 0)
    if len(empty):
        s, g = empty[0]
        where = f" in stratum {strata_order[s]!r}" if strata_order else ""
        raise ValueError(f"group {group_order[g]!r} has no query{where}: its nDCG@10 is undefined")
    return per_query


def _positions(dataset: Judged, query_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each query's relative answer position: its span midpoint where the dataset knows it, else the centre of
    its begin/middle/end third(s) (NaN for other groups); and which positions are span midpoints."""
    placed = np.array([qid in dataset.positions for qid in query_ids], dtype=bool)
    positions = np.full(len(query_ids), np.nan)
    for i, qid in enumerate(query_ids):
        if placed[i]:
            positions[i] = dataset.positions[qid]
        elif (labels := dataset.groups.get(qid, ())) and all(label in THIRD_CENTRES for label in labels):
            positions[i] = float(np.mean([THIRD_CENTRES[label] for label in labels]))
    return positions, placed
