"""The pooled screen (issue 21): a balanced, deterministic sample of the tuning queries over every relevant
passage of theirs and the reference rankings' top candidates; on it no query scores below its corpus score,
and a reference ranking scores exactly as on the corpus."""

from __future__ import annotations

import numpy as np
import pytest

from objectives import evaluate, exact_search
from objectives.constraint import REQUIREMENTS
from objectives.robustness import screen_prune_reason
from tests.test_robustness import evidence
from tuner.data import PositionalDataset
from tuner.evaluation.pools import balanced_queries, candidate_recall, most_passages, pool, top

GROUPS = ("begin", "middle", "end")


def collection(docs: int = 60, per_doc: int = 3, seed: int = 0) -> tuple[PositionalDataset, np.ndarray, np.ndarray]:
    """`docs` passages, `per_doc` queries each (one per group in turn); random unit vectors, a query's a noisy
    copy of its passage's."""
    rng = np.random.default_rng(seed)
    corpus = {f"d{i:03d}": f"passage {i}" for i in range(docs)}
    queries, qrels, groups = {}, {}, {}
    for i in range(docs):
        for j in range(per_doc):
            qid = f"q{i:03d}-{j}"
            queries[qid], qrels[qid], groups[qid] = f"query {qid}", {f"d{i:03d}": 1}, (GROUPS[j % 3],)
    dataset = PositionalDataset("synthetic", corpus, queries, qrels, groups, GROUPS)
    d = rng.normal(size=(docs, 16))
    q = np.repeat(d, per_doc, axis=0) + 1.2 * rng.normal(size=(len(queries), 16))  # near its passage: ranks vary
    return dataset, d / np.linalg.norm(d, axis=1, keepdims=True), q / np.linalg.norm(q, axis=1, keepdims=True)


def search(
    dataset: PositionalDataset, doc_vectors: np.ndarray, query_vectors: np.ndarray, docs: list[str] | None = None
):
    """Exact search of `dataset`'s queries over `docs` (default: every passage); the vectors are the full
    collection's (`collection`: passage dNNN is row NNN, query qNNN-j row 3·NNN + j)."""
    docs = docs or [f"d{i:03d}" for i in range(len(doc_vectors))]
    rows = [3 * int(q[1:4]) + int(q.split("-")[1]) for q in dataset.queries]
    return exact_search(
        query_vectors[rows], doc_vectors[[int(d[1:]) for d in docs]], list(dataset.queries), docs, k=100
    )


def test_the_sample_is_balanced_over_the_groups_and_the_same_on_every_call() -> None:
    dataset, _, _ = collection()
    sample = balanced_queries(dataset, 7)
    assert sample == balanced_queries(dataset, 7)
    counts = {g: sum(dataset.groups[q][0] == g for q in sample) for g in GROUPS}
    assert counts == {"begin": 7, "middle": 7, "end": 7}
    assert balanced_queries(dataset, 7, seed=1) != sample  # the seed draws another sample, as balanced
    assert len(balanced_queries(dataset, 1000)) == len(dataset.queries)  # a cell smaller than asked gives all it has


def test_the_sample_is_balanced_within_each_stratum() -> None:
    dataset, _, _ = collection()
    strata = {q: ("short" if int(q[1:4]) < 20 else "long") for q in dataset.queries}
    stratified = PositionalDataset(
        dataset.name, dataset.corpus, dataset.queries, dataset.qrels, dataset.groups, GROUPS, strata
    )
    sample = balanced_queries(stratified, 5)
    assert {
        (s, g): sum(strata[q] == s and dataset.groups[q][0] == g for q in sample)
        for s in ("short", "long")
        for g in GROUPS
    } == {(s, g): 5 for s in ("short", "long") for g in GROUPS}


def test_the_pool_holds_every_relevant_passage_and_each_rankings_top_candidates_and_nothing_else() -> None:
    dataset, docs, queries = collection()
    reference = search(dataset, docs, queries)
    other = search(dataset, docs[::-1].copy(), queries)  # a second ranking that disagrees with the first
    pooled = pool(dataset, [reference, other], per_group=4, depth=10)
    sample = balanced_queries(dataset, 4)
    assert sorted(pooled.queries) == sample and pooled.name == "synthetic-pool"
    expected = {d for q in sample for d in dataset.qrels[q]}
    for ranking in (reference, other):
        expected |= {d for q in sample for d, _ in sorted(ranking[q].items(), key=lambda x: (-x[1], x[0]))[:10]}
    assert set(pooled.corpus) == expected
    assert pool(dataset, [reference, other], per_group=4, depth=10) == pooled  # deterministic
    assert candidate_recall(dataset, sample, [reference, other]) == pytest.approx(
        np.mean([dataset.qrels[q].keys() <= set(top(reference[q], 10)) | set(top(other[q], 10)) for q in sample])
    )


def test_a_passage_judged_relevant_at_any_grade_is_pooled_and_one_judged_at_grade_0_is_not() -> None:
    """Query qJ judges dJ0 relevant at grade 2, dJ1 at grade 1 and dJ2 at grade 0 (not relevant); the reference
    ranks dJ0 first, then the same nine filler passages for every query, then more filler below the top 10."""
    corpus = {f"d{j}{grade}": "passage" for j in range(3) for grade in range(3)} | {
        f"f{k:02d}": "filler" for k in range(40)
    }
    qrels = {f"q{j}": {f"d{j}0": 2, f"d{j}1": 1, f"d{j}2": 0} for j in range(3)}
    dataset = PositionalDataset(
        "graded", corpus, {q: "query" for q in qrels}, qrels, {f"q{j}": (GROUPS[j],) for j in range(3)}, GROUPS
    )
    reference = {f"q{j}": {f"d{j}0": 2.0} | {f"f{k:02d}": 1.0 - k / 100 for k in range(40)} for j in range(3)}
    pooled = pool(dataset, [reference], per_group=1, depth=10)
    assert set(pooled.corpus) == {f"d{j}{grade}" for j in range(3) for grade in (0, 1)} | {
        f"f{k:02d}" for k in range(9)
    }
    assert most_passages(dataset, per_group=1, depth=10) == 6 + 10 * 3  # the six relevant passages and 10 per query
    assert candidate_recall(dataset, sorted(qrels), [reference]) == pytest.approx(3 / 6)  # each dJ0 found, no dJ1


def test_on_the_pool_no_query_scores_below_its_corpus_score_and_the_reference_scores_exactly_the_same() -> None:
    dataset, docs, queries = collection(docs=400)
    reference = search(dataset, docs, queries)
    pooled = pool(dataset, [reference], per_group=6, depth=10)
    _, corpus_scores = evaluate(reference, dataset.subset(pooled.queries))
    _, pool_scores = evaluate(search(pooled, docs, queries, sorted(pooled.corpus)), pooled)
    assert np.array_equal(pool_scores.ndcg10, corpus_scores.ndcg10)  # its whole top 10 is in the pool
    rng = np.random.default_rng(5)
    for _ in range(5):  # any other config: a relevant passage ranks no lower among fewer passages
        moved = docs + 0.8 * rng.normal(size=docs.shape)
        moved /= np.linalg.norm(moved, axis=1, keepdims=True)
        _, full = evaluate(search(dataset, moved, queries), dataset.subset(pooled.queries))
        _, screened = evaluate(search(pooled, moved, queries, sorted(pooled.corpus)), pooled)
        assert np.all(screened.ndcg10 >= full.ndcg10 - 1e-12)
    assert len(pooled.corpus) < len(dataset.corpus) / 2
    assert screened.ndcg10.mean() > full.ndcg10.mean()  # higher on average: the screen's scores are not the corpus's


def test_a_pool_shallower_than_the_top_ten_is_refused() -> None:
    dataset, docs, queries = collection()
    with pytest.raises(ValueError, match="depth must be at least 10"):
        pool(dataset, [search(dataset, docs, queries)], depth=5)


def test_the_screen_prunes_a_trial_worse_beyond_noise_than_the_best_screened_one() -> None:
    """Threshold: the best complete trial's screen PSI + its SE. Pruned only when PSI − 2 SE is above it."""
    assert screen_prune_reason(evidence(0.30, 0.02), 0.20, {}) is not None  # 0.30 − 0.04 = 0.26 > 0.20
    assert screen_prune_reason(evidence(0.30, 0.06), 0.20, {}) is None  # 0.30 − 0.12 = 0.18: within noise
    assert screen_prune_reason(evidence(0.30, 0.02), None, {}) is None  # nothing feasible to compare with yet
    reason = screen_prune_reason(evidence(0.10, 0.02), 0.20, [REQUIREMENTS["hm_floor"].missed])
    assert reason == "misses the HM floor beyond noise on the pooled screen"
