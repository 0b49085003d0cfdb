"""PosIR scored as PosIR scores itself (`objectives.posir`), against its analysis script's steps worked by hand.

The script (github.com/Ziyang1060/PosIR, ndcg_PSI_analysis.py, read at commit c8ad9bf) takes each query's
span midpoint over its document's character length (the midpoint capped at the length; queries with a
length <= 0 or a negative midpoint dropped), cuts [0, 1] into 20 bins with pandas.cut(linspace(0, 1, 21),
include_lowest=True) — closed on the right — and the token lengths at 0/512/1024/1536/inf, also closed on
the right; per bucket it averages nDCG@10 within each filled bin, then reports the plain mean of those bin
means and 1 - min/max of them; the overall PSI pools every placed query into the 20 bins; the overall
nDCG@10 is the mean over all queries. Every expected number below is worked out from those steps by hand.
"""

from __future__ import annotations

import numpy as np
import pytest

from objectives.posir import (
    BUCKETS,
    Placement,
    aggregate_posir,
    length_bucket,
    posir_bootstrap,
    posir_figures,
    position_bin,
)

# id: (span, document characters, document tokens, nDCG@10)    where the script puts it
QUERIES = {
    "a": ([0, 10], 100, 300, 1.0),  # midpoint 5/100 = 0.05: on the first edge, so bin 1; Q1
    "b": ([0, 0], 100, 300, 0.5),  # 0: bin 1 (the lowest edge is included); Q1
    "c": ([40, 60], 100, 300, 0.25),  # 0.5: bin 10, (0.45, 0.5]; Q1
    "d": ([95, 105], 200, 512, 0.75),  # 100/200 = 0.5: bin 10; 512 tokens is still Q1
    "l": ([95, 125], 100, 300, 0.2),  # midpoint 110 capped at 100: 1.0, bin 20; Q1
    "e": ([20, 30], 100, 513, 0.6),  # 0.25: bin 5, (0.2, 0.25]; 513 tokens: Q2
    "f": ([21, 31], 100, 1024, 0.3),  # 0.26: bin 6; 1024 tokens is still Q2
    "g": ([0, 2], 4, 5000, 0.9),  # 1/4 = 0.25: bin 5; Q4
    "h": ([60, 80], 100, 0, 0.1),  # 0.7: bin 14, (0.65, 0.7]; token length 0: no bucket, but in the pooled bins
    "i": ([0, 10], 0, 300, 1.0),  # character length 0: dropped from every position figure
    "j": ([-10, 4], 100, 300, 0.0),  # midpoint -3: dropped
    "k": (None, 100, 300, 0.3),  # no span: dropped (the script needs one for every query)
}


def scored(queries: dict = QUERIES) -> tuple[np.ndarray, Placement]:
    rows = list(queries.values())
    placement = Placement.of([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    return np.array([r[3] for r in rows]), placement


def test_positions_fall_in_bins_closed_on_the_right() -> None:
    assert [position_bin(x) for x in (0.0, 0.05, 0.0500001, 0.1, 0.15, 0.5, 0.51, 0.95, 0.96, 1.0)] == [
        0,
        0,
        1,
        1,
        2,
        9,
        10,
        18,
        19,
        19,
    ]


def test_token_lengths_fall_in_buckets_closed_on_the_right() -> None:
    assert [length_bucket(t) for t in (1, 512, 513, 1024, 1025, 1536, 1537, 100_000)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [length_bucket(t) for t in (0, -5, None)] == [-1, -1, -1]


def test_the_queries_are_placed_as_the_script_places_them() -> None:
    _, placement = scored()
    bins = dict(zip(QUERIES, (placement.bins + 1).tolist()))  # 1-based, as in the comments
    assert bins == {"a": 1, "b": 1, "c": 10, "d": 10, "l": 20, "e": 5, "f": 6, "g": 5, "h": 14, "i": 0, "j": 0, "k": 0}
    buckets = {q: BUCKETS[b] if b >= 0 else None for q, b in zip(QUERIES, placement.buckets.tolist())}
    assert buckets == {
        **{q: "Q1" for q in "abcdl"},
        **{q: "Q2" for q in "ef"},
        "g": "Q4",
        **{q: None for q in "hijk"},
    }


def test_figures_follow_the_script() -> None:
    figures = posir_figures(*scored())
    # nDCG@10: every query, placed or not: (1 + .5 + .25 + .75 + .2 + .6 + .3 + .9 + .1 + 1 + 0 + .3) / 12 = 5.9 / 12
    assert figures.ndcg10 == pytest.approx(5.9 / 12)
    assert (figures.n_queries, figures.n_placed) == (12, 9)
    # pooled bins: 1 → (1 + .5)/2 = .75; 5 → (.6 + .9)/2 = .75; 6 → .3; 10 → (.25 + .75)/2 = .5; 14 → .1; 20 → .2
    assert figures.psi == pytest.approx(1 - 0.1 / 0.75)
    q1, q2, q3, q4 = figures.buckets
    # Q1's bins: 1 → .75, 10 → .5, 20 → .2; the bucket's nDCG@10 is their plain mean, not the mean of its 5 queries
    assert (q1.ndcg10, q1.psi, q1.n_queries, q1.n_bins) == (
        pytest.approx(1.45 / 3),
        pytest.approx(1 - 0.2 / 0.75),
        5,
        3,
    )
    # bins .6 and .3
    assert (q2.ndcg10, q2.psi, q2.n_queries, q2.n_bins) == (
        pytest.approx(0.45),
        pytest.approx(0.5),
        2,
        2,
    )
    assert (q3.ndcg10, q3.psi, q3.n_queries, q3.n_bins) == (None, None, 0, 0)  # no query: the script stops here
    assert (q4.ndcg10, q4.psi, q4.n_queries, q4.n_bins) == (pytest.approx(0.9), 0.0, 1, 1)  # one bin: 1 - .9/.9
    assert figures.as_dict()["Q1/psi"] == pytest.approx(1 - 0.2 / 0.75) and figures.as_dict()["Q3/ndcg10"] is None


def test_psi_is_undefined_where_every_bin_scores_zero() -> None:
    """The script divides 0 by 0 there (NaN); posfair says undefined rather than calling it perfectly flat."""
    figures = posir_figures(
        *scored({"x": ([0, 10], 100, 300, 0.0), "y": ([80, 90], 100, 300, 0.0), "z": (None, 100, 300, 0.6)})
    )
    assert figures.ndcg10 == pytest.approx(0.2)
    assert figures.psi is None and figures.buckets[0].psi is None and figures.buckets[0].ndcg10 == 0.0


def test_a_weight_counts_a_query_that_many_times() -> None:
    """The bootstrap's rows: weight 2 is the query twice, weight 0 leaves it out (here: bin 1 of Q1 loses b)."""
    ndcg, placement = scored()
    weights = np.ones((1, len(ndcg)))
    weights[0, 0], weights[0, 1] = 2, 0  # a twice, b never
    weighted = aggregate_posir(ndcg, placement, weights)
    # nDCG@10: (5.9 + 1.0 - 0.5) / 12; Q1's bin 1 is now a alone (1.0): bins 1.0, .5, .2
    assert weighted.ndcg10[0] == pytest.approx(6.4 / 12)
    assert weighted.bucket_ndcg10[0, 0] == pytest.approx(1.7 / 3) and weighted.bucket_psi[0, 0] == pytest.approx(
        1 - 0.2 / 1.0
    )
    assert weighted.psi[0] == pytest.approx(1 - 0.1 / 1.0)  # pooled bin 1 is 1.0 too
    assert weighted.bucket_counts[0].tolist() == [5, 2, 0, 1]


def test_the_bootstrap_pairs_both_runs_on_the_same_resamples() -> None:
    ndcg, placement = scored()
    same = posir_bootstrap(ndcg, ndcg.copy(), placement, n_resamples=50, seed=3)
    assert (
        (same.ndcg10.low, same.ndcg10.high) == (0.0, 0.0)
        and same.psi is not None
        and (same.psi.low, same.psi.high) == (0.0, 0.0)
    )
    flat = posir_bootstrap(ndcg, np.ones_like(ndcg), placement, n_resamples=50, seed=3)
    assert flat.ndcg10.estimate == pytest.approx(1 - 5.9 / 12)
    assert flat.psi is not None and flat.psi.estimate == pytest.approx(-(1 - 0.1 / 0.75))  # a flat run has PSI 0
    assert flat.bucket_psi["Q3"] is None and flat.bucket_ndcg10["Q3"] is None
    assert flat.psi.low <= flat.psi.estimate <= flat.psi.high


def test_queries_get_posirs_instruction_by_default_only_under_its_scoring() -> None:
    """PosIR's eval.py prefixes every model's queries with one instruction: its figures are made that way."""
    from tuner.common.options import EvaluateRequest

    assert EvaluateRequest(scoring="posir", general="").instruction
    assert not EvaluateRequest(scoring="posir", posir_instruction=False).instruction
    assert not EvaluateRequest().instruction
    with pytest.raises(ValueError, match="add --scoring posir"):
        EvaluateRequest(posir_instruction=True).check()
