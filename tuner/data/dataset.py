"""The one dataset type every benchmark loader returns, and the position vocabulary loaders share."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from tuner.common.messages import UserError

THIRDS: tuple[str, ...] = ("begin", "middle", "end")
"""Position groups of a passage cut into equal thirds: the paper's FineWeb-PosQ segments."""
FIFTHS: tuple[str, ...] = tuple(f"fifth-{i}" for i in range(1, 6))
"""Finer position groups: the passage cut into equal fifths."""
SLOT_THIRDS: tuple[str, ...] = ("early", "central", "late")
"""Position groups by segment slot rather than by character: the first, middle and last third of the slots."""


class DatasetUnavailableError(UserError, RuntimeError):
    """A benchmark's data cannot be reached from here (offline, not downloaded); the message says how to get it."""


def third_of(relative_position: float) -> str:
    """The third ("begin", "middle", "end") a relative position in [0, 1] falls in.

    Boundaries belong to the later third (1/3 is "middle", 2/3 is "end"); values outside [0, 1] are clipped,
    so a span end that overshoots its document by a character still lands in "end".
    """
    position = min(max(relative_position, 0.0), 1.0)
    if position < 1 / 3:
        return THIRDS[0]
    if position < 2 / 3:
        return THIRDS[1]
    return THIRDS[2]


def fifth_of(relative_position: float) -> str:
    """The fifth ("fifth-1" ... "fifth-5") a relative position in [0, 1] falls in; boundaries go to the later
    fifth and values outside [0, 1] are clipped, as in `third_of`."""
    position = min(max(relative_position, 0.0), 1.0)
    return FIFTHS[min(int(position * 5), 4)]


def slot_third(index: int, count: int) -> str:
    """The slot group of segment `index` (0-based) among `count` segments: the third of the slot order that
    holds the slot's centre, (index + 0.5) / count, with boundaries going to the later third."""
    if not 0 <= index < count:
        raise ValueError(f"segment {index} does not exist among {count}")
    return SLOT_THIRDS[THIRDS.index(third_of((index + 0.5) / count))]


def span_midpoint(start: int, end: int, length: int) -> float:
    """Where a character span [start, end) sits in a document of `length` characters: its midpoint, in [0, 1]."""
    if length <= 0:
        raise ValueError(f"cannot place span [{start}, {end}) in a document of length {length}: length must be > 0")
    if end < start:
        raise ValueError(f"span [{start}, {end}) ends before it starts: write it as [start, end] with start <= end")
    return min(max((start + end) / 2 / length, 0.0), 1.0)


def span_third(start: int, end: int, length: int) -> str:
    """The third of a document of `length` characters that holds the midpoint of the char span [start, end).

    Every loader places a span by its midpoint, as PosIR's own analysis does: a long span that starts early
    but mostly sits in the middle is a "middle" fact.
    """
    return third_of(span_midpoint(start, end, length))


@dataclass(frozen=True)
class PositionalDataset:
    """A retrieval benchmark whose queries are labelled with where their answer sits in the passage.

    Construction validates the cross-references, so a loader bug or a broken file fails here with a
    message naming the query and document rather than as a silent zero in nDCG later.

    Attributes:
        name: What tables and logs call the benchmark.
        corpus: Document id → passage text.
        queries: Query id → query text.
        qrels: Query id → document id → relevance (> 0: relevant); every query has a relevant document.
        groups: Query id → the position groups it belongs to (a query may belong to several, and then counts in
            each); general-retrieval sets leave it empty.
        group_order: The position groups in the order tables show them (e.g. begin, middle, end).
        strata: Query id → its stratum (PosIR's length quartiles), which nests the position groups: HM and PSI
            are then computed within each stratum.
        positions: Query id → the relative position of its answer in the passage (the span's character
            midpoint, 0 = start, 1 = end), where a loader knows the span, so fairness can be measured at any
            granularity and in direction, not only over the named groups.

    Raises:
        ValueError: The corpus or the queries are empty, a query has no relevant document, a judgement, group,
            stratum or position names a query or document that is not there, or a position is outside [0, 1].
    """

    name: str
    corpus: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    group_order: tuple[str, ...] = ()
    strata: dict[str, str] = field(default_factory=dict)
    positions: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"dataset {self.name!r}"
        if not self.corpus:
            raise ValueError(f"{where}: the corpus is empty; point the loader at a file or folder that holds documents")
        if not self.queries:
            raise ValueError(f"{where}: there are no queries; check the queries file and any sampling or split options")
        for qid in self.queries:
            judged = self.qrels.get(qid)
            if not judged or not any(rel > 0 for rel in judged.values()):
                raise ValueError(
                    f"{where}: query {qid!r} has no relevant document in qrels; "
                    "add a judgement with relevance > 0 for it or drop the query"
                )
        for qid, judged in self.qrels.items():
            if qid not in self.queries:
                raise ValueError(
                    f"{where}: qrels judge query {qid!r}, which is not among the queries; "
                    "add the query text or drop its judgements"
                )
            for doc_id in judged:
                if doc_id not in self.corpus:
                    raise ValueError(
                        f"{where}: qrels of query {qid!r} point at doc {doc_id!r}, which is not in the corpus; "
                        "add the document to the corpus or drop the judgement"
                    )
        known = set(self.group_order)
        if len(known) != len(self.group_order):
            raise ValueError(f"{where}: group_order {self.group_order!r} repeats a label; list each group once")
        for qid, labels in self.groups.items():
            if qid not in self.queries:
                raise ValueError(f"{where}: groups label query {qid!r}, which is not among the queries; drop the label")
            for label in labels:
                if label not in known:
                    raise ValueError(
                        f"{where}: query {qid!r} is in group {label!r}, which is not in group_order "
                        f"{self.group_order!r}; add it to group_order or fix the label"
                    )
        for qid in self.strata:
            if qid not in self.queries:
                raise ValueError(f"{where}: strata name query {qid!r}, which is not among the queries; drop it")
        for qid, position in self.positions.items():
            if qid not in self.queries:
                raise ValueError(f"{where}: positions name query {qid!r}, which is not among the queries; drop it")
            if not 0.0 <= position <= 1.0:
                raise ValueError(f"{where}: query {qid!r} has position {position!r}; a relative position is in [0, 1]")

    def group_sizes(self) -> dict[str, int]:
        """Queries per group, in group_order; a query in several groups counts in each."""
        counts = Counter(label for labels in self.groups.values() for label in labels)
        return {label: counts[label] for label in self.group_order}

    def subset(self, qids: Iterable[str], name: str | None = None) -> PositionalDataset:
        """The same corpus with only the given queries: samples and tune/held-out parts search the full corpus."""
        keep = list(dict.fromkeys(qids))
        missing = [qid for qid in keep if qid not in self.queries]
        if missing:
            raise ValueError(f"dataset {self.name!r}: cannot take a subset with unknown queries {missing[:5]!r}")
        return PositionalDataset(
            name=name or self.name,
            corpus=self.corpus,
            queries={qid: self.queries[qid] for qid in keep},
            qrels={qid: self.qrels[qid] for qid in keep},
            groups={qid: self.groups[qid] for qid in keep if qid in self.groups},
            group_order=self.group_order,
            strata={qid: self.strata[qid] for qid in keep if qid in self.strata},
            positions={qid: self.positions[qid] for qid in keep if qid in self.positions},
        )

    def within(self, doc_ids: Iterable[str]) -> PositionalDataset:
        """The same queries over only these passages (judgements of the others dropped): a pool, or a share of
        the corpus, scored from vectors encoded over the whole (a passage's vector does not depend on the rest)."""
        kept = set(doc_ids)
        corpus = {d: text for d, text in self.corpus.items() if d in kept}
        qrels = {qid: {d: rel for d, rel in judged.items() if d in corpus} for qid, judged in self.qrels.items()}
        return replace(self, corpus=corpus, qrels=qrels)

    def fingerprint(self) -> str:
        """A content hash: caches and exported configs use it to tell datasets apart."""
        parts = [self.corpus, self.queries, self.qrels, self.groups, list(self.group_order), self.strata]
        payload = json.dumps(
            parts + [self.positions] if self.positions else parts,
            sort_keys=True,
            ensure_ascii=False,
        )
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


MIN_STRATUM_QUERIES = 3
"""Queries a stratum needs in each position group: HM and PSI are the mean over strata, so every stratum
weighs alike, and a stratum of one query would outweigh the rest of the set."""


def require_position_groups(dataset: PositionalDataset, flag: str) -> None:
    """PSI compares position groups: a set scored for it needs queries in at least two of them, and each
    stratum (when there are strata) at least `MIN_STRATUM_QUERIES` in every group.

    With one group (every query "all") PSI is 0 for any config, so the uncalibrated model would win by default.
    """
    filled = [label for label, count in dataset.group_sizes().items() if count > 0]
    if len(filled) >= 2:
        _require_full_strata(dataset, flag, filled)
        return
    if not filled:
        raise ValueError(
            f"{flag} {dataset.name}: no query has a position group, so PSI cannot be computed; give each "
            "query a 'group' (e.g. begin/middle/end) or a 'span', or use the set as --general"
        )
    raise ValueError(
        f"{flag} {dataset.name}: every query is in the one position group {filled[0]!r}, so PSI would be 0 "
        "for every config; label queries by where their answer sits (at least two groups, e.g. begin/middle/end)"
    )


def _require_full_strata(dataset: PositionalDataset, flag: str, groups: list[str]) -> None:
    grouped = [qid for qid, labels in dataset.groups.items() if labels]
    unstratified = [qid for qid in grouped if qid not in dataset.strata] if dataset.strata else []
    if unstratified:  # HM and PSI are means over strata: such a query would belong to none
        raise ValueError(
            f"{flag} {dataset.name}: {len(unstratified)} of its {len(grouped)} queries with a position group have no "
            f"stratum (e.g. {unstratified[0]!r}), while the others have one; give each of them a 'stratum', or drop "
            "'stratum' from every query"
        )
    counts: dict[str, dict[str, int]] = {}
    for qid, stratum in dataset.strata.items():
        cell = counts.setdefault(stratum, dict.fromkeys(groups, 0))
        for label in dataset.groups.get(qid, ()):
            if label in cell:
                cell[label] += 1
    for stratum, cell in counts.items():
        if min(cell.values()) < MIN_STRATUM_QUERIES:
            first, *rest = cell.items()
            spread = ", ".join(
                [
                    f"{first[1]} {'query' if first[1] == 1 else 'queries'} in group {first[0]!r}",
                    *(f"{n} in {g!r}" for g, n in rest),
                ]
            )
            raise ValueError(
                f"{flag} {dataset.name}: stratum {stratum!r} has {spread}; HM and PSI weigh every stratum alike, "
                f"so each needs at least {MIN_STRATUM_QUERIES} per group: merge it into a neighbouring stratum "
                "or drop its queries' 'stratum'"
            )
