"""Configs scored side by side on held-out sets, each against no calibration and against a reference config.

Shared by the benchmarks that compare configs chosen in different ways (`selection_rules`, `natural`): every
config is scored on the same queries, so each difference gets a paired bootstrap (common query resamples), the
same noise model the study's selection uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from objectives import paired_bootstrap
from objectives.bootstrap import Interval, percentile_interval
from objectives.evidence import evidence_weights
from objectives.metrics import PerQuery, aggregate

RESAMPLES = 1000
REVERSAL_Z = 1.96
"""Standard errors a tilt must clear zero by, on the side opposite the uncalibrated tilt, to count as a reversal."""


@dataclass(frozen=True)
class HeldOutCell:
    """One config on one held-out set. nDCG@10 and HM in points (×100); PSI on its 0–1 scale."""

    psi: float
    psi_se: float
    psi_ratio: float  # PSI ÷ the uncalibrated PSI on the same set
    hm: float
    ndcg10: float
    hm_delta: tuple[float, float, float]  # against no calibration: estimate, 95% interval
    ndcg_delta: tuple[float, float, float]
    end_minus_begin: tuple[float, float, float]  # last group − first group, points; > 0: the end favoured
    gap_delta: tuple[float, float, float]  # end − begin minus no calibration's, paired: how far the gap moved
    tilt: float
    tilt_se: float
    reversed: bool  # tilt on the other side of zero from the uncalibrated tilt, beyond noise
    psi_minus_reference: float  # PSI − the reference config's PSI (0 for the reference itself)
    psi_minus_reference_se: float  # its bootstrap SE over common query resamples

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cells(
    baseline: PerQuery, runs: Mapping[str, PerQuery], reference: str, n_resamples: int = RESAMPLES, seed: int = 0
) -> dict[str, HeldOutCell]:
    """Every run against `baseline` (no calibration) and against `runs[reference]`, on common query resamples."""
    weights = evidence_weights(len(baseline.query_ids), n_resamples, seed)
    base = aggregate(baseline, weights)
    assert base.psi is not None and base.hm is not None
    aggregates = {name: aggregate(per_query, weights) for name, per_query in runs.items()}
    ref = aggregates[reference]
    assert ref.psi is not None
    base_gap = base.group_ndcg10[:, -1] - base.group_ndcg10[:, 0]
    out = {}
    for name, per_query in runs.items():
        agg = aggregates[name]
        assert agg.psi is not None and agg.hm is not None
        deltas = paired_bootstrap(baseline, per_query, n_resamples, seed)
        first, last = agg.group_ndcg10[:, 0], agg.group_ndcg10[:, -1]
        gap_delta = (last - first) - base_gap
        tilt = agg.tilt if agg.tilt is not None else np.full(len(weights), np.nan)
        base_tilt = float(base.tilt[0]) if base.tilt is not None else float("nan")
        tilt_se = float(np.nanstd(tilt[1:]))
        difference = (agg.psi - ref.psi)[1:]
        out[name] = HeldOutCell(
            psi=float(agg.psi[0]),
            psi_se=float(np.nanstd(agg.psi[1:])),
            psi_ratio=float(agg.psi[0] / base.psi[0]) if base.psi[0] else float("nan"),
            hm=100 * float(agg.hm[0]),
            ndcg10=100 * float(agg.ndcg10[0]),
            hm_delta=_as_points(deltas.hm),
            ndcg_delta=_as_points(deltas.ndcg10),
            end_minus_begin=_as_points(percentile_interval(float(last[0] - first[0]), (last - first)[1:], 0.95)),
            gap_delta=_as_points(percentile_interval(float(gap_delta[0]), gap_delta[1:], 0.95)),
            tilt=float(tilt[0]),
            tilt_se=tilt_se,
            reversed=bool(np.sign(tilt[0]) == -np.sign(base_tilt) and abs(tilt[0]) > REVERSAL_Z * tilt_se),
            psi_minus_reference=float(agg.psi[0] - ref.psi[0]),
            psi_minus_reference_se=float(np.nanstd(difference)),
        )
    return out


def _as_points(interval: Interval | None) -> tuple[float, float, float]:
    assert interval is not None, "a positional set has HM and end − begin intervals"
    return (100 * interval.estimate, 100 * interval.low, 100 * interval.high)


def score(
    model: Any,
    sets: Sequence[str],
    configs: Mapping[str, Any],
    reference: str,
    n_resamples: int = RESAMPLES,
    seed: int = 0,
    progress: Any = print,
) -> dict[str, dict[str, HeldOutCell]]:
    """set → config label → cell: `configs` (label → CalibrationConfig, None for no calibration) on each set, the
    layer inputs cached where the configs start calibrating so each resumes there."""
    from tuner.data import load_benchmark
    from tuner.engine.prefix import starting_layers
    from tuner.evaluation.evaluator import Evaluator

    starts = starting_layers(configs.values(), model.num_layers)
    table: dict[str, dict[str, HeldOutCell]] = {}
    for name in sets:
        evaluator = Evaluator(
            model, load_benchmark(name), prefix_layers=starts, keep_on_disk=True, keep_layer_inputs=False
        )
        baseline = evaluator.run(None).per_query
        runs = {}
        for label, config in configs.items():
            runs[label] = baseline if config is None else evaluator.run(config).per_query
            progress(f"  {name}: {label} scored")
        table[name] = cells(baseline, runs, reference, n_resamples, seed)
    return table
