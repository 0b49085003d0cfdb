"""Specification of the paired bootstrap over queries."""

from __future__ import annotations

import re

import numpy as np
import pytest

from objectives.bootstrap import Interval, PairedBootstrap, paired_bootstrap
from objectives.metrics import PerQuery, evaluate
from tuner.data.dataset import THIRDS, PositionalDataset

N_QUERIES = 90


def make_dataset(
    stratified: bool = False, positional: bool = True, groups: dict[str, tuple[str, ...]] | None = None
) -> PositionalDataset:
    """N_QUERIES queries with one relevant document each, by default cycling through the thirds (and,
    when stratified, through two length strata); every fifth query also counts in "end"."""
    qids = [f"q{i}" for i in range(N_QUERIES)]
    if groups is None:
        groups = {q: (THIRDS[i % 3],) + (("end",) if i % 5 == 0 and i % 3 != 2 else ()) for i, q in enumerate(qids)}
    return PositionalDataset(
        name="toy",
        corpus={f"d{i}": "text" for i in range(N_QUERIES)},
        queries={q: "query" for q in qids},
        qrels={q: {f"d{i}": 1} for i, q in enumerate(qids)},
        groups=groups if positional else {},
        group_order=THIRDS if positional else (),
        strata={q: ("short", "long")[i % 2] for i, q in enumerate(qids)} if stratified else {},
    )


def run_with_ranks(ranks: np.ndarray) -> dict[str, dict[str, float]]:
    """Query i retrieves its relevant document d<i> at rank ranks[i] (1-based) among fillers."""
    run = {}
    for i, rank in enumerate(ranks):
        docs = [f"x{j}" for j in range(rank - 1)] + [f"d{i}"]
        run[f"q{i}"] = {doc: float(len(docs) - r) for r, doc in enumerate(docs)}
    return run


def per_query(ranks: np.ndarray, **dataset_options: bool) -> PerQuery:
    return evaluate(run_with_ranks(ranks), make_dataset(**dataset_options))[1]


BASELINE_RANKS = np.random.default_rng(7).integers(2, 12, size=N_QUERIES)  # some fall outside the top 10
BETTER_RANKS = BASELINE_RANKS - 1  # every query moves up one rank, so every nDCG@10 strictly improves


@pytest.mark.parametrize("stratified", [False, True])
def test_identical_runs_give_exactly_zero_deltas_with_zero_width_intervals(stratified: bool) -> None:
    baseline = per_query(BASELINE_RANKS, stratified=stratified)
    result = paired_bootstrap(baseline, baseline, n_resamples=200)
    intervals = [result.ndcg10, result.hm, result.psi, *result.groups.values()]
    assert all(i == Interval(0.0, 0.0, 0.0) for i in intervals)


@pytest.mark.parametrize("stratified", [False, True])
def test_a_candidate_better_on_every_query_has_strictly_positive_intervals(stratified: bool) -> None:
    result = paired_bootstrap(
        per_query(BASELINE_RANKS, stratified=stratified), per_query(BETTER_RANKS, stratified=stratified)
    )
    assert result.hm is not None
    assert result.ndcg10.low > 0 and result.hm.low > 0
    assert all(interval.low > 0 for interval in result.groups.values())


def test_point_estimates_are_the_differences_of_the_reports() -> None:
    dataset = make_dataset(stratified=True)
    base_report, baseline = evaluate(run_with_ranks(BASELINE_RANKS), dataset)
    cand_report, candidate = evaluate(run_with_ranks(BETTER_RANKS), dataset)
    result = paired_bootstrap(baseline, candidate, n_resamples=50)
    assert base_report.hm is not None and cand_report.hm is not None
    assert base_report.psi is not None and cand_report.psi is not None
    assert result.hm is not None and result.psi is not None
    assert result.ndcg10.estimate == pytest.approx(cand_report.ndcg10 - base_report.ndcg10)
    assert result.hm.estimate == pytest.approx(cand_report.hm - base_report.hm)
    assert result.psi.estimate == pytest.approx(cand_report.psi - base_report.psi)
    for group in THIRDS:
        expected = cand_report.group_ndcg10[group] - base_report.group_ndcg10[group]
        assert result.groups[group].estimate == pytest.approx(expected)


def test_intervals_contain_their_point_estimates() -> None:
    worse_ranks = np.random.default_rng(8).integers(1, 12, size=N_QUERIES)
    result = paired_bootstrap(per_query(BASELINE_RANKS), per_query(worse_ranks))
    assert result.hm is not None and result.psi is not None
    for interval in [result.ndcg10, result.hm, result.psi, *result.groups.values()]:
        assert interval.low <= interval.estimate <= interval.high
        assert interval.low < interval.high


def test_the_same_seed_gives_the_same_intervals_and_another_seed_different_ones() -> None:
    baseline, candidate = per_query(BASELINE_RANKS), per_query(BETTER_RANKS)
    first = paired_bootstrap(baseline, candidate, n_resamples=300, seed=3)
    assert paired_bootstrap(baseline, candidate, n_resamples=300, seed=3) == first
    assert paired_bootstrap(baseline, candidate, n_resamples=300, seed=4) != first


def test_resamples_that_miss_a_small_group_are_left_out_and_counted() -> None:
    lone_begin = {f"q{i}": ("begin",) if i == 0 else (("middle", "end")[i % 2],) for i in range(N_QUERIES)}
    dataset = make_dataset(groups=lone_begin)
    baseline = evaluate(run_with_ranks(BASELINE_RANKS), dataset)[1]
    candidate = evaluate(run_with_ranks(BETTER_RANKS), dataset)[1]
    result = paired_bootstrap(baseline, candidate, n_resamples=400)
    # P(a resample misses q0) = (1 - 1/90)^90 ≈ 0.37.
    assert 0.25 * 400 < result.n_undefined < 0.5 * 400
    assert result.hm is not None and np.isfinite([result.hm.low, result.hm.high]).all()


def test_general_retrieval_sets_get_only_an_ndcg_interval() -> None:
    result = paired_bootstrap(per_query(BASELINE_RANKS, positional=False), per_query(BETTER_RANKS, positional=False))
    assert result.hm is None and result.psi is None and result.groups == {}
    assert result.ndcg10.low > 0
    assert result.summary().startswith("ΔnDCG@10 +")


def test_runs_scored_on_different_queries_cannot_be_paired() -> None:
    baseline = per_query(BASELINE_RANKS)
    other = evaluate(run_with_ranks(BASELINE_RANKS), make_dataset().subset([f"q{i}" for i in range(10)]))[1]
    with pytest.raises(ValueError, match="different queries"):
        paired_bootstrap(baseline, other)


def test_runs_with_different_group_layouts_cannot_be_paired() -> None:
    with pytest.raises(ValueError, match="layouts"):
        paired_bootstrap(per_query(BASELINE_RANKS), per_query(BASELINE_RANKS, stratified=True))


@pytest.mark.parametrize(("n_resamples", "confidence"), [(0, 0.95), (100, 1.0), (100, 0.0)])
def test_bad_bootstrap_settings_are_rejected(n_resamples: int, confidence: float) -> None:
    baseline = per_query(BASELINE_RANKS)
    with pytest.raises(ValueError):
        paired_bootstrap(baseline, baseline, n_resamples=n_resamples, confidence=confidence)


def test_interval_formats_signed_points_or_raw_values() -> None:
    assert Interval(0.0123, 0.0040, 0.0210).format() == "+1.23 [+0.40, +2.10]"
    assert Interval(-0.0123, -0.021, 0.004).format(scale=1, digits=3) == "-0.012 [-0.021, +0.004]"


def test_summary_reports_hm_and_ndcg_in_points_and_psi_raw() -> None:
    # The README's "paper default" row: ΔHM +2.27 points, ΔPSI −0.107, ΔnDCG@10 +1.04 points.
    result = PairedBootstrap(
        ndcg10=Interval(0.0104, 0.0040, 0.0173),
        hm=Interval(0.0227, 0.0146, 0.0308),
        psi=Interval(-0.107, -0.137, -0.082),
        groups={},
        n_resamples=1000,
        n_undefined=0,
    )
    assert result.summary() == "ΔHM +2.27 [+1.46, +3.08], ΔPSI -0.107 [-0.137, -0.082], ΔnDCG@10 +1.04 [+0.40, +1.73]"


def test_summary_of_a_real_bootstrap_carries_its_intervals() -> None:
    result = paired_bootstrap(per_query(BASELINE_RANKS), per_query(BETTER_RANKS), n_resamples=100)
    assert result.hm is not None and result.psi is not None
    printed = [float(number) for number in re.findall(r"[+-]\d+\.\d+", result.summary())]
    expected = [
        *(round(100 * v, 2) for v in (result.hm.estimate, result.hm.low, result.hm.high)),  # points
        *(round(v, 3) for v in (result.psi.estimate, result.psi.low, result.psi.high)),  # raw
        *(round(100 * v, 2) for v in (result.ndcg10.estimate, result.ndcg10.low, result.ndcg10.high)),
    ]
    assert printed == pytest.approx(expected, abs=1e-9)
