"""Specification of the position-aware metrics (paper §4.3) and of exact search."""

from __future__ import annotations

import math

import numpy as np
import pytest

from objectives import retrieval
from objectives.metrics import evaluate, harmonic_mean, position_sensitivity, score_queries
from objectives.retrieval import exact_search
from tuner.data.dataset import THIRDS, PositionalDataset


def ranked(*doc_ids: str) -> dict[str, float]:
    """A run entry listing `doc_ids` best first."""
    return {doc: float(len(doc_ids) - rank) for rank, doc in enumerate(doc_ids)}


def filler(n: int, start: int = 0) -> list[str]:
    """Distinct irrelevant doc ids x<start>, x<start+1>, ..."""
    return [f"x{i}" for i in range(start, start + n)]


def make_dataset(
    qrels: dict[str, dict[str, int]],
    groups: dict[str, tuple[str, ...]] | None = None,
    group_order: tuple[str, ...] = THIRDS,
    strata: dict[str, str] | None = None,
) -> PositionalDataset:
    return PositionalDataset(
        name="toy",
        corpus={doc: f"text of {doc}" for judged in qrels.values() for doc in judged},
        queries={qid: f"query {qid}" for qid in qrels},
        qrels=qrels,
        groups=groups or {},
        group_order=group_order if groups else (),
        strata=strata or {},
    )


# --- HM and PSI ---------------------------------------------------------------------------------


def test_hm_and_psi_reproduce_paper_table_1_gte_without_calibration() -> None:
    groups = [0.8716, 0.7801, 0.7223]  # begin, middle, end
    assert round(harmonic_mean(groups) * 100, 2) == 78.66
    assert round(position_sensitivity(groups), 3) == 0.171


@pytest.mark.parametrize(
    ("row", "groups", "hm", "psi"),
    [
        ("bge-m3-dense, no calibration", (88.77, 78.39, 71.88), 79.09, 0.190),
        ("Qwen3-Embedding-0.6B, no calibration", (88.54, 78.83, 65.61), 76.49, 0.259),
        ("gte-multilingual-base, segment embed average", (76.88, 78.83, 74.65), 76.75, 0.053),
    ],
)
def test_hm_and_psi_match_other_table_1_rows(row: str, groups: tuple[float, ...], hm: float, psi: float) -> None:
    """The table's groups are rounded to 0.01, so its HM may be one unit off in the last digit
    (bge-m3: the rounded groups give 79.085)."""
    values = [v / 100 for v in groups]
    assert harmonic_mean(values) * 100 == pytest.approx(hm, abs=0.011), row
    assert position_sensitivity(values) == pytest.approx(psi, abs=0.0011), row


def test_hm_is_zero_when_any_group_scores_zero() -> None:
    assert harmonic_mean([0.9, 0.0, 0.8]) == 0.0


def test_hm_and_psi_of_equal_groups() -> None:
    assert harmonic_mean([0.6, 0.6, 0.6]) == pytest.approx(0.6)
    assert position_sensitivity([0.6, 0.6, 0.6]) == 0.0


def test_psi_is_zero_when_every_group_scores_zero() -> None:
    assert position_sensitivity([0.0, 0.0]) == 0.0


def test_psi_is_one_when_some_group_scores_zero() -> None:
    assert position_sensitivity([0.5, 0.0]) == 1.0


@pytest.mark.parametrize("bad", [[], [0.5, -0.1]])
def test_hm_and_psi_reject_empty_or_negative_input(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        harmonic_mean(bad)
    with pytest.raises(ValueError):
        position_sensitivity(bad)


# --- per-query nDCG@10 and Recall@10 (ir-measures) ----------------------------------------------


def ndcg_of(run_entry: dict[str, float], relevant: dict[str, int]) -> float:
    ndcg, _ = score_queries({"q": run_entry}, {"q": relevant}, ["q"])
    return float(ndcg[0])


def test_ndcg_relevant_at_rank_1_is_1() -> None:
    assert ndcg_of(ranked("d", *filler(9)), {"d": 1}) == pytest.approx(1.0)


def test_ndcg_relevant_at_rank_3_is_one_over_log2_4() -> None:
    assert ndcg_of(ranked("x0", "x1", "d", *filler(7, start=2)), {"d": 1}) == pytest.approx(1 / math.log2(4))


def test_ndcg_relevant_below_rank_10_is_0() -> None:
    assert ndcg_of(ranked(*filler(10), "d"), {"d": 1}) == 0.0


def test_ndcg_two_relevant_at_ranks_1_and_3() -> None:
    ideal = 1 + 1 / math.log2(3)
    assert ndcg_of(ranked("a", "x0", "b"), {"a": 1, "b": 1}) == pytest.approx((1 + 1 / math.log2(4)) / ideal)


def test_ndcg_uses_binary_relevance() -> None:
    graded = {"a": 1, "b": 3}
    assert ndcg_of(ranked("a", "b"), graded) == pytest.approx(1.0)
    assert ndcg_of(ranked("x0", "a"), {"a": 2}) == ndcg_of(ranked("x0", "a"), {"a": 1})


def test_query_missing_from_run_scores_zero() -> None:
    ndcg, recall = score_queries({"q1": ranked("d")}, {"q1": {"d": 1}, "q2": {"d": 1}}, ["q1", "q2"])
    assert ndcg.tolist() == [1.0, 0.0]
    assert recall.tolist() == [1.0, 0.0]


def test_recall_at_10_counts_relevant_documents_in_the_top_10() -> None:
    run = {"q": ranked("a", *filler(9), "b")}
    _, recall = score_queries(run, {"q": {"a": 1, "b": 1, "c": 1, "x0": 0}}, ["q"])
    assert recall[0] == pytest.approx(1 / 3)


def test_numpy_scores_are_accepted() -> None:
    run = {"q": {"d": np.float32(0.9), "x": np.float64(0.1)}}
    assert ndcg_of(run["q"], {"d": 1}) == pytest.approx(1.0)


# --- evaluate: groups, HM/PSI, strata ------------------------------------------------------------

# q1 at rank 1 (1.0), q2 at rank 3 (0.5), q3 missing (0.0), q4 at rank 1 (1.0).
QRELS = {"q1": {"d1": 1}, "q2": {"d2": 1}, "q3": {"d3": 1}, "q4": {"d4": 1}}
RUN = {"q1": ranked("d1"), "q2": ranked("x0", "x1", "d2"), "q4": ranked("d4")}


def test_group_ndcg_is_the_mean_over_the_group_in_group_order() -> None:
    groups = {"q1": ("begin",), "q2": ("middle",), "q3": ("end",), "q4": ("end",)}
    report, _ = evaluate(RUN, make_dataset(QRELS, groups))
    assert list(report.group_ndcg10) == ["begin", "middle", "end"]
    assert report.group_ndcg10 == pytest.approx({"begin": 1.0, "middle": 0.5, "end": 0.5})
    assert report.group_counts == {"begin": 1, "middle": 1, "end": 2}
    assert report.hm == pytest.approx(3 / (1 / 1.0 + 1 / 0.5 + 1 / 0.5))  # 0.6
    assert report.psi == pytest.approx(1 - 0.5 / 1.0)


def test_metrics_score_plain_mappings_without_the_dataset_type() -> None:
    """`evaluate` reads only mappings: a bare namespace scores exactly as the dataset type (objectives needs no
    tuner)."""
    from types import SimpleNamespace

    qrels = {"b": {"d1": 1}, "m": {"d2": 1}, "e": {"d3": 1}}
    run = {"b": ranked("d1"), "m": ranked(*filler(2), "d2"), "e": ranked(*filler(12), "d3")}
    plain = SimpleNamespace(
        name="toy",
        queries={q: q for q in qrels},
        qrels=qrels,
        groups={"b": ("begin",), "m": ("middle",), "e": ("end",)},
        group_order=THIRDS,
        strata={},
        positions={},
    )
    report, _ = evaluate(run, plain)
    assert report.group_ndcg10 == {"begin": 1.0, "middle": pytest.approx(1 / math.log2(4)), "end": 0.0}
    assert report == evaluate(run, make_dataset(qrels, plain.groups))[0]


def test_query_in_two_groups_counts_in_both_but_once_in_the_aggregate() -> None:
    groups = {"q1": ("begin", "middle"), "q2": ("middle",), "q3": ("end",), "q4": ("end",)}
    report, _ = evaluate(RUN, make_dataset(QRELS, groups))
    assert report.group_ndcg10["middle"] == pytest.approx((1.0 + 0.5) / 2)
    assert report.group_counts == {"begin": 1, "middle": 2, "end": 2}
    assert report.n_queries == 4
    assert report.ndcg10 == pytest.approx((1.0 + 0.5 + 0.0 + 1.0) / 4)
    assert report.recall10 == pytest.approx(3 / 4)


def test_general_retrieval_set_has_no_hm_or_psi() -> None:
    report, _ = evaluate(RUN, make_dataset(QRELS))
    assert report.hm is None and report.psi is None and report.group_ndcg10 == {}
    assert report.as_dict() == pytest.approx({"ndcg10": 0.625, "recall10": 0.75, "n_queries": 4})


def test_as_dict_flattens_the_report_for_logging() -> None:
    groups = {"q1": ("begin",), "q2": ("middle",), "q3": ("end",), "q4": ("end",)}
    report, _ = evaluate(RUN, make_dataset(QRELS, groups))
    assert report.as_dict() == pytest.approx(
        {
            "ndcg10": 0.625,
            "recall10": 0.75,
            "n_queries": 4,
            "ndcg10_begin": 1.0,
            "ndcg10_middle": 0.5,
            "ndcg10_end": 0.5,
            "n_begin": 1,
            "n_middle": 1,
            "n_end": 2,
            "hm": 0.6,  # 3 / (1/1.0 + 1/0.5 + 1/0.5), worked by hand
            "psi": 0.5,  # 1 - 0.5/1.0
            "tilt": -12 / 11,  # begin 1, middle .5, end 0 and 1 at third centres: tests/test_position_profile.py
        }
    )


def test_stratified_hm_and_psi_are_means_of_the_within_stratum_values() -> None:
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(4)}
    # Stratum "short": begin 1.0, end 0.5. Stratum "long": begin 0.5, end 0.0 (q3 not retrieved).
    run = {"q0": ranked("d0"), "q1": ranked("x0", "x1", "d1"), "q2": ranked("x0", "x1", "d2")}
    groups = {"q0": ("begin",), "q1": ("end",), "q2": ("begin",), "q3": ("end",)}
    strata = {"q0": "short", "q1": "short", "q2": "long", "q3": "long"}
    report, _ = evaluate(run, make_dataset(qrels, groups, ("begin", "end"), strata))

    by_name = {s.name: s for s in report.strata}
    assert [s.name for s in report.strata] == ["long", "short"]
    assert by_name["short"].group_ndcg10 == pytest.approx({"begin": 1.0, "end": 0.5})
    assert by_name["long"].group_ndcg10 == pytest.approx({"begin": 0.5, "end": 0.0})
    assert by_name["short"].hm == pytest.approx(2 / 3) and by_name["long"].hm == 0.0
    assert by_name["short"].psi == pytest.approx(0.5) and by_name["long"].psi == 1.0
    assert by_name["long"].group_counts == {"begin": 1, "end": 1}
    assert report.hm == pytest.approx((2 / 3 + 0.0) / 2)
    assert report.psi == pytest.approx((0.5 + 1.0) / 2)
    # Pooled over strata, per group: begin (1.0 + 0.5) / 2, end (0.5 + 0.0) / 2.
    assert report.group_ndcg10 == pytest.approx({"begin": 0.75, "end": 0.25})
    assert report.as_dict()["short/ndcg10_end"] == pytest.approx(0.5)
    assert report.as_dict()["long/psi"] == 1.0 and report.as_dict()["long/n_end"] == 1


def test_pooled_group_ndcg_weighs_each_query_once_not_each_stratum_once() -> None:
    """A group's pooled nDCG@10 is the mean over its queries, so a stratum with more queries weighs more."""
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(5)}
    run = {q: ranked(f"d{i}") for i, q in enumerate(qrels) if q != "q2"}  # q2 (long, begin) not retrieved: 0.0
    groups = {"q0": ("begin",), "q1": ("begin",), "q2": ("begin",), "q3": ("end",), "q4": ("end",)}
    strata = {"q0": "short", "q1": "short", "q2": "long", "q3": "short", "q4": "long"}
    report, _ = evaluate(run, make_dataset(qrels, groups, ("begin", "end"), strata))
    # begin: q0 1, q1 1, q2 0 over three queries = 2/3 (a mean of the stratum means would say (1 + 0) / 2)
    assert report.group_ndcg10 == pytest.approx({"begin": 2 / 3, "end": 1.0})
    assert report.group_counts == {"begin": 3, "end": 2}


def test_group_without_queries_is_an_error() -> None:
    groups = {"q1": ("begin",), "q2": ("middle",)}
    with pytest.raises(ValueError, match="'end' has no query"):
        evaluate(RUN, make_dataset(QRELS, groups))


def test_a_grouped_query_of_a_stratified_dataset_needs_a_stratum() -> None:
    groups = {q: ("begin",) for q in QRELS}
    with pytest.raises(ValueError, match="position group but no stratum"):
        evaluate(RUN, make_dataset(QRELS, groups, ("begin",), {"q1": "short"}))


def test_a_query_without_a_position_needs_no_stratum_and_counts_for_aggregate_ndcg_only() -> None:
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(3)}
    run = {"q0": ranked("d0"), "q1": ranked("x0", "d1"), "q2": ranked("x0", "x1", "d2")}  # 1, 1/log2(3), 0.5
    report, _ = evaluate(
        run, make_dataset(qrels, {"q0": ("begin",), "q1": ("end",)}, ("begin", "end"), {"q0": "short", "q1": "short"})
    )
    assert report.group_counts == {"begin": 1, "end": 1} and report.strata[0].group_counts == {"begin": 1, "end": 1}
    assert report.psi == pytest.approx(1 - 1 / math.log2(3))
    assert report.ndcg10 == pytest.approx((1 + 1 / math.log2(3) + 0.5) / 3), "q2 counts in the aggregate"


# --- exact search -------------------------------------------------------------------------------


def unit_rows(rng: np.random.Generator, n: int, dim: int = 16) -> np.ndarray:
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_exact_search_returns_the_true_top_k_best_first() -> None:
    rng = np.random.default_rng(0)
    queries, docs = unit_rows(rng, 5), unit_rows(rng, 200)
    doc_ids = [f"d{i}" for i in range(200)]
    run = exact_search(queries, docs, ["a", "b", "c", "d", "e"], doc_ids, k=10)

    expected = np.argsort(-(queries @ docs.T), axis=1)[:, :10]
    for qid, row in zip("abcde", expected):
        assert list(run[qid]) == [doc_ids[i] for i in row]
        scores = list(run[qid].values())
        assert scores == sorted(scores, reverse=True)
        assert all(type(s) is float for s in scores)


def test_exact_search_breaks_ties_towards_the_earlier_document_also_at_the_cut() -> None:
    docs = np.array([[0.6, 0.8], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    run = exact_search(np.array([[1.0, 0.0]], dtype=np.float32), docs, ["q"], ["a", "b", "c", "d", "e"], k=2)
    assert list(run["q"]) == ["b", "c"]

    # One clear winner and 49 tied documents (argpartition alone would pick an arbitrary two of them).
    docs = np.zeros((50, 2), dtype=np.float32)
    docs[40] = [1.0, 0.0]
    run = exact_search(np.array([[1.0, 0.0]], dtype=np.float32), docs, ["q"], [f"d{i}" for i in range(50)], k=3)
    assert list(run["q"]) == ["d40", "d0", "d1"]


def test_exact_search_caps_k_at_the_corpus_size() -> None:
    docs = np.eye(3, dtype=np.float32)
    run = exact_search(docs[:1], docs, ["q"], ["a", "b", "c"], k=100)
    assert list(run["q"]) == ["a", "b", "c"]


def test_exact_search_over_an_empty_corpus_retrieves_nothing() -> None:
    assert exact_search(np.ones((2, 3)), np.zeros((0, 3)), ["q", "r"], [], k=10) == {"q": {}, "r": {}}


def test_exact_search_ranks_the_same_whatever_the_query_chunking(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    queries, docs = unit_rows(rng, 7), unit_rows(rng, 50)
    query_ids, doc_ids = [f"q{i}" for i in range(7)], [f"d{i}" for i in range(50)]
    whole = exact_search(queries, docs, query_ids, doc_ids, k=5)
    monkeypatch.setattr(retrieval, "_QUERY_CHUNK", 3)
    chunked = exact_search(queries, docs, query_ids, doc_ids, k=5)
    # BLAS may round a lone-query chunk differently in the last float32 bit, so scores are compared approximately.
    assert {q: list(docs) for q, docs in chunked.items()} == {q: list(docs) for q, docs in whole.items()}
    for qid in query_ids:
        assert list(chunked[qid].values()) == pytest.approx(list(whole[qid].values()), abs=1e-6)


@pytest.mark.parametrize(
    ("queries", "docs", "query_ids", "doc_ids", "k"),
    [
        (np.zeros((1, 3)), np.zeros((2, 4)), ["q"], ["a", "b"], 1),
        (np.zeros((1, 3)), np.zeros((2, 3)), ["q", "r"], ["a", "b"], 1),
        (np.zeros((1, 3)), np.zeros((2, 3)), ["q"], ["a"], 1),
        (np.zeros((1, 3)), np.zeros((2, 3)), ["q"], ["a", "b"], 0),
    ],
)
def test_exact_search_rejects_inconsistent_input(queries, docs, query_ids, doc_ids, k) -> None:  # noqa: ANN001
    with pytest.raises(ValueError):
        exact_search(queries, docs, query_ids, doc_ids, k=k)
