"""Fairness at a finer granularity and in direction: the fifths profile and the tilt, worked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from objectives import paired_bootstrap
from objectives.metrics import evaluate
from tuner.data.dataset import THIRDS, PositionalDataset


def ranked(*doc_ids: str) -> dict[str, float]:
    return {doc: float(len(doc_ids) - rank) for rank, doc in enumerate(doc_ids)}


# Ten queries, each asking for its own passage; the answer sits at `POSITIONS[i]`. Query i is found at rank
# RANKS[i] (nDCG@10 = 1/log2(rank + 1)), or not at all (None: 0).
POSITIONS = [0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95]
RANKS = [1, 1, 1, 3, 1, None, 3, None, None, 1]


def dataset(positions: list[float] | None = POSITIONS) -> PositionalDataset:
    qids = [f"q{i}" for i in range(10)]
    thirds = {q: (THIRDS[min(int(3 * p), 2)],) for q, p in zip(qids, POSITIONS)}
    return PositionalDataset(
        name="toy",
        corpus={f"d{i}": f"passage {i}" for i in range(10)} | {f"x{i}": "filler" for i in range(3)},
        queries={q: f"query {q}" for q in qids},
        qrels={q: {f"d{i}": 1} for i, q in enumerate(qids)},
        groups=thirds,
        group_order=THIRDS,
        positions=dict(zip(qids, positions)) if positions is not None else {},
    )


def run() -> dict[str, dict[str, float]]:
    out = {}
    for i, rank in enumerate(RANKS):
        if rank is not None:
            out[f"q{i}"] = ranked(*[f"x{j}" for j in range(rank - 1)], f"d{i}")
    return out


def scores() -> np.ndarray:
    return np.array([0.0 if r is None else 1.0 / np.log2(r + 1) for r in RANKS])


def test_fifths_profile_is_the_mean_ndcg_of_the_queries_whose_answer_falls_in_each_fifth():
    report, _ = evaluate(run(), dataset())
    y = scores()
    expected = [y[0:2].mean(), y[2:4].mean(), y[4:6].mean(), y[6:8].mean(), y[8:10].mean()]
    assert list(report.position_ndcg10) == ["fifth-1", "fifth-2", "fifth-3", "fifth-4", "fifth-5"]
    assert list(report.position_ndcg10.values()) == pytest.approx(expected)
    assert report.position_psi == pytest.approx(1 - min(expected) / max(expected))
    assert report.as_dict()["psi_fifths"] == pytest.approx(report.position_psi)


def test_tilt_is_the_least_squares_slope_over_the_mean_signed_towards_the_favoured_end():
    report, _ = evaluate(run(), dataset())
    x, y = np.array(POSITIONS), scores()
    slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    assert report.tilt == pytest.approx(slope / y.mean())
    assert report.tilt < 0, "the answers near the end are found less often: the beginning is favoured"

    mirrored, _ = evaluate(run(), dataset([1 - p for p in POSITIONS]))
    assert mirrored.tilt == pytest.approx(-report.tilt), "the same scores at mirrored positions tilt the other way"


def test_tilt_falls_back_to_the_centre_of_each_third_where_spans_are_unknown():
    report, per_query = evaluate(run(), dataset(positions=None))
    centres = np.array([{"begin": 1 / 6, "middle": 1 / 2, "end": 5 / 6}[THIRDS[min(int(3 * p), 2)]] for p in POSITIONS])
    y = scores()
    slope = ((centres - centres.mean()) * (y - y.mean())).sum() / ((centres - centres.mean()) ** 2).sum()
    assert report.tilt == pytest.approx(slope / y.mean())
    assert report.position_ndcg10 == {} and report.position_psi is None, "no fifths without the spans themselves"


def test_tilt_worked_by_hand_on_three_groups():
    # begin 1.0, middle 0.5, end 0.0 and 1.0 at centres 1/6, 1/2, 5/6, 5/6: mean x 7/12, mean y 5/8,
    # Sxy = -5/24, Sxx = 11/36, slope = -15/22, tilt = slope / (5/8) = -12/11
    data = PositionalDataset(
        name="toy",
        corpus={f"d{i}": "p" for i in range(4)} | {"x0": "f", "x1": "f"},
        queries={f"q{i}": "q" for i in range(4)},
        qrels={f"q{i}": {f"d{i}": 1} for i in range(4)},
        groups={"q0": ("begin",), "q1": ("middle",), "q2": ("end",), "q3": ("end",)},
        group_order=THIRDS,
    )
    report, _ = evaluate({"q0": ranked("d0"), "q1": ranked("x0", "x1", "d1"), "q3": ranked("d3")}, data)
    assert report.tilt == pytest.approx(-12 / 11)


def test_the_bootstrap_reports_the_change_in_tilt_and_in_fifths_psi():
    data = dataset()
    base, base_q = evaluate(run(), data)
    better = {q: ranked(f"d{i}") for i, q in enumerate(data.queries)}  # every answer at rank 1: flat
    cand, cand_q = evaluate(better, data)
    delta = paired_bootstrap(base_q, cand_q, n_resamples=200, seed=1)
    assert cand.tilt == pytest.approx(0.0) and cand.position_psi == pytest.approx(0.0)
    assert delta.tilt is not None and delta.tilt.estimate == pytest.approx(cand.tilt - base.tilt)
    assert delta.position_psi is not None and delta.position_psi.estimate == pytest.approx(-base.position_psi)
