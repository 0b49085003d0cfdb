"""Pooled screens: a cheap first rung that ranks trials like the full corpus does.

A random sub-corpus biases every score upwards (fewer distractors) and by how much depends on the config.
A *pool* does not drop the passages that matter: for a balanced sample of the tuning queries it keeps
each query's relevant passages and its top candidates under reference rankings (in a study, the uncalibrated
model's), as pooled test collections and MTEB's hard-negative tasks do.

Two facts make it a sound screen:
- a passage's rank among a subset of the corpus is never worse than its rank in the corpus, so a query's
  nDCG@10 on the pool is at least its nDCG@10 on the corpus, for every config: an HM or nDCG@10 that
  misses its limit on the pool (beyond noise) misses it on the corpus too;
- a reference ranking's top `depth` (≥ 10) are all in the pool, so the references score exactly as on the
  corpus, and a config that moves a relevant passage into the top 10 from among them is seen.
PSI has no such bound, so the screen compares trials with each other on the pool (rank agreement with
the full corpus is measured in `benchmarks/pool_agreement.py`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from objectives import Run
from tuner.common.options import SCREEN_QUERIES
from tuner.data import PositionalDataset

SCREEN_DEPTH = 10
"""Candidates per query and reference ranking: the depth nDCG@10 reads."""
SCREEN_SHARE = 0.5
"""The largest share of the corpus a pool may hold and still be worth a rung of its own."""


def balanced_queries(dataset: PositionalDataset, per_group: int, seed: int = 0) -> list[str]:
    """Up to `per_group` queries of each (stratum, position group) cell, drawn by a seeded shuffle of the
    sorted ids, so the sample is the same on every machine; a query in several groups counts in the first."""
    cells: dict[tuple[str, str], list[str]] = {}
    for qid in sorted(dataset.queries):
        labels = dataset.groups.get(qid, ())
        if labels:
            cells.setdefault((dataset.strata.get(qid, ""), labels[0]), []).append(qid)
    chosen: list[str] = []
    for cell in sorted(cells):
        members = cells[cell]
        random.Random(f"{seed}:{cell}").shuffle(members)
        chosen += members[:per_group]
    return sorted(chosen)


def pool(
    dataset: PositionalDataset,
    rankings: Sequence[Run],
    per_group: int = SCREEN_QUERIES,
    depth: int = SCREEN_DEPTH,
    seed: int = 0,
) -> PositionalDataset:
    """The balanced sample of queries over their pool: every relevant passage of theirs and the top `depth`
    of each reference ranking (`rankings`, runs over the full corpus)."""
    if depth < 10:
        raise ValueError(f"a pool's depth must be at least 10 (nDCG@10 reads the top 10), got {depth}")
    qids = balanced_queries(dataset, per_group, seed)
    if not qids:
        raise ValueError(f"dataset {dataset.name!r}: no query has a position group, so nothing can be pooled")
    kept: set[str] = set()
    for qid in qids:
        kept.update(d for d, rel in dataset.qrels[qid].items() if rel > 0)
        for ranking in rankings:
            kept.update(top(ranking.get(qid, {}), depth))
    return dataset.subset(qids, name=f"{dataset.name}-pool").within(kept)


def most_passages(
    dataset: PositionalDataset, per_group: int = SCREEN_QUERIES, depth: int = SCREEN_DEPTH, rankings: int = 1
) -> int:
    """The most passages a pool can hold, known before any ranking: the sample's relevant passages and
    `depth` candidates per query and ranking, at most the corpus."""
    qids = balanced_queries(dataset, per_group)
    relevant = {d for q in qids for d, rel in dataset.qrels[q].items() if rel > 0}
    return min(len(dataset.corpus), len(relevant) + depth * rankings * len(qids))


def top(scores: dict[str, float], depth: int) -> list[str]:
    """The `depth` best documents of one query's run, ties to the lower id, so a pool never depends on the
    order a run's dict happens to hold them in."""
    return [d for d, _ in sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:depth]]


def candidate_recall(
    dataset: PositionalDataset, qids: Sequence[str], rankings: Sequence[Run], depth: int = SCREEN_DEPTH
) -> float:
    """Share of the sampled queries' relevant passages that the candidates alone hold (the pool adds the rest)."""
    found = total = 0
    for qid in qids:
        relevant = {d for d, rel in dataset.qrels[qid].items() if rel > 0}
        candidates = {d for ranking in rankings for d in top(ranking.get(qid, {}), depth)}
        found += len(relevant & candidates)
        total += len(relevant)
    return found / total if total else float("nan")
