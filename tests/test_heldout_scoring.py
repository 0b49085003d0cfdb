"""Held-out cells: how far a config moves the begin-to-end gap against no calibration, on common query resamples."""

from __future__ import annotations

import numpy as np

from benchmarks.heldout_scoring import cells
from objectives.metrics import PerQuery

THIRDS = ("begin", "middle", "end")
RESAMPLES = 300


def per_query(scores: dict[str, list[float]]) -> PerQuery:
    """The same nine queries, three per third, with the nDCG@10 given; unstratified."""
    labels = [group for group in THIRDS for _ in scores[group]]
    values = np.array([value for group in THIRDS for value in scores[group]])
    return PerQuery(
        query_ids=tuple(f"q{i}" for i in range(len(labels))),
        ndcg10=values,
        recall10=values,
        group_order=THIRDS,
        membership=np.array([[float(label == group) for group in THIRDS] for label in labels]),
        strata_order=(),
        stratum_membership=np.ones((len(labels), 1)),
        positions=np.array([{"begin": 1 / 6, "middle": 1 / 2, "end": 5 / 6}[label] for label in labels]),
        placed=np.zeros(len(labels), dtype=bool),
    )


BASE = {"begin": [1.0, 0.9, 0.8], "middle": [0.7, 0.6, 0.7], "end": [0.3, 0.5, 0.1]}  # end − begin −0.6
CALIBRATED = {"begin": [0.9, 0.9, 0.7], "middle": [0.7, 0.7, 0.7], "end": [0.6, 0.7, 0.2]}  # −0.333…


def gap_delta_by_hand(seed: int) -> tuple[float, float, float]:
    """The calibrated gap less the uncalibrated one, in points: the estimate and the 2.5th/97.5th percentiles over
    the resamples both are scored on (every query equally likely, drawn as `multinomial` counts)."""
    counts = np.random.default_rng(seed).multinomial(9, np.full(9, 1 / 9), size=RESAMPLES)
    begin, end = np.repeat([1.0, 0.0, 0.0], 3), np.repeat([0.0, 0.0, 1.0], 3)

    def gap(scores: dict[str, list[float]], w: np.ndarray) -> np.ndarray:
        values = np.array([v for g in THIRDS for v in scores[g]])
        return (w * end) @ values / ((w * end).sum(axis=-1)) - (w * begin) @ values / ((w * begin).sum(axis=-1))

    moved = gap(CALIBRATED, counts) - gap(BASE, counts)
    estimate = gap(CALIBRATED, np.ones(9)) - gap(BASE, np.ones(9))
    low, high = np.nanpercentile(moved, [2.5, 97.5])
    return 100 * float(estimate), 100 * float(low), 100 * float(high)


def test_the_gap_change_is_the_paired_difference_of_end_minus_begin_against_no_calibration() -> None:
    found = cells(per_query(BASE), {"none": per_query(BASE), "calibrated": per_query(CALIBRATED)}, "none", RESAMPLES)
    np.testing.assert_allclose(found["calibrated"].gap_delta, gap_delta_by_hand(0), atol=1e-9)
    assert round(found["calibrated"].gap_delta[0], 6) == round(100 * (-1 / 3 + 0.6), 6)
    assert found["none"].gap_delta == (0.0, 0.0, 0.0)  # no calibration against itself moves nothing
