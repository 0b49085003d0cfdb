"""`tune diagnose`: does a model need calibration on a dataset? Its position bias uncalibrated, with intervals.

The dataset is encoded once, uncalibrated (vectors that `tune evaluate` or a study left in the cache are read from
there), and scored by position group. The verdict reads one figure: the last group's nDCG@10 less the first's
(end − begin), with its 95% bootstrap interval. Calibration spreads the pooling token's attention away from the
beginning of a passage, so it is indicated only where the beginning is favoured beyond noise.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath
from typing import Any, Literal

from rich.console import Console

from objectives import PositionProfile, PositionReport, position_profile
from objectives.bootstrap import Interval
from tuner.common.files import DIAGNOSIS_SCHEMA
from tuner.common.options import DiagnoseRequest
from tuner.data import load_benchmark, require_position_groups
from tuner.engine.models import load_model
from tuner.engine.specs import resolve_spec
from tuner.evaluation.evaluator import Evaluator
from tuner.evaluation.visible import within_reach
from tuner.report.tables import Grid, points, psi_cell, render_grids

log = logging.getLogger(__name__)

CONFIDENCE = 0.95
Lean = Literal["beginning", "end", "level"]


@dataclass(frozen=True)
class Verdict:
    """Which end of a passage the model favours beyond noise (or neither), and what that says about calibration."""

    lean: Lean
    calibration_indicated: bool
    sentence: str


def verdict(model: str, dataset: str, end_minus_begin: Interval) -> Verdict:
    """The verdict of an end − begin interval (nDCG@10, 0–1 scale), decided on the figures as printed (points, two
    decimals), so the sentence never contradicts the table: an interval printed wholly below 0 favours the beginning,
    wholly above 0 the end; one that holds 0 is level within noise."""
    gap = end_minus_begin
    estimate, low, high = (round(100 * value, 2) for value in (gap.estimate, gap.low, gap.high))
    if high < 0:
        return Verdict(
            "beginning",
            True,
            f"{model} favours the beginning of a passage by {-estimate:.2f} points [{-high:.2f}, {-low:.2f}] of "
            f"nDCG@10 on {dataset}: calibration is indicated.",
        )
    if low > 0:
        return Verdict(
            "end",
            False,
            f"{model} favours the end of a passage by {estimate:.2f} points [{low:.2f}, {high:.2f}] of nDCG@10 on "
            f"{dataset}: calibration, which spreads attention away from the beginning, is unlikely to help.",
        )
    return Verdict(
        "level",
        False,
        f"{model} is level along the passage within noise on {dataset} (end − begin {estimate:+.2f} points "
        f"[{low:+.2f}, {high:+.2f}] of nDCG@10, an interval that holds 0): calibration is unlikely to help.",
    )


@dataclass(frozen=True)
class Diagnosis:
    """What `tune diagnose` measured: the uncalibrated report and its profile with intervals (0–1 scale)."""

    model: str  # as the user named it (a registry alias or a folder)
    model_name: str  # as the verdict names it: the last part of its hub id or folder
    pooling: str
    padding_side: str
    dataset: str
    report: PositionReport
    profile: PositionProfile
    n_resamples: int
    seed: int
    encode_seconds: float
    from_cache: bool  # the uncalibrated document vectors were read from the cache, not encoded

    @property
    def verdict(self) -> Verdict:
        assert self.profile.end_minus_begin is not None  # `diagnose` scores only sets with position groups
        return verdict(self.model_name, self.dataset, self.profile.end_minus_begin)


def diagnose(request: DiagnoseRequest) -> Diagnosis:
    """Load the dataset and the model, encode the dataset uncalibrated (or read its vectors from the cache) and
    profile it along the passage with `request.bootstrap` resamples."""
    spec = resolve_spec(request.model, request.pooling, request.padding_side)  # a name it does not know fails first
    dataset = load_benchmark(request.dataset)
    require_position_groups(dataset, "--dataset")
    consent, pooling, padding = request.trust_remote_code, request.pooling, request.padding_side
    loaded = load_model(request.model, trust_remote_code=consent, pooling=pooling, padding_side=padding)
    # batched as `tune evaluate` batches, so its cached uncalibrated vectors are found
    evaluator = Evaluator(loaded, within_reach(dataset, loaded), request.batch_size, batch_tokens=request.batch_tokens)
    start = time.perf_counter()
    evaluation = evaluator.run(None)
    seconds, from_cache = time.perf_counter() - start, evaluator.counts.baseline_from_disk > 0
    source = f"read from the cache in {evaluator.cache.cache_dir}" if from_cache else "encoded"
    log.info("%s: uncalibrated document vectors %s (%.1f s)", evaluator.dataset.name, source, seconds)
    return Diagnosis(
        model=request.model,
        model_name=PurePosixPath(spec.source.rstrip("/\\")).name or spec.source,
        pooling=spec.pooling,
        padding_side=spec.padding_side,
        dataset=evaluator.dataset.name,
        report=evaluation.report,
        profile=position_profile(evaluation.per_query, request.bootstrap, request.seed, CONFIDENCE),
        n_resamples=request.bootstrap,
        seed=request.seed,
        encode_seconds=seconds,
        from_cache=from_cache,
    )


def _cell(interval: Interval | None, points_scale: bool = True) -> str:
    """'63.20 [60.10, 66.00]' in points (PSI: raw, three decimals); — where undefined."""
    if interval is None:
        return "—"
    show = points if points_scale else psi_cell
    return f"{show(interval.estimate)} [{show(interval.low)}, {show(interval.high)}]"


def grid(diagnosis: Diagnosis) -> Grid:
    """The figures as one grid: nDCG@10 per group, end − begin, HM, PSI and the tilt, each with its interval."""
    profile, report = diagnosis.profile, diagnosis.report
    groups = list(profile.groups)
    title = (
        f"{diagnosis.model} on {diagnosis.dataset}, no calibration: nDCG@10 by answer position (×100; PSI raw; "
        f"tilt ×100; 95% bootstrap intervals over {diagnosis.n_resamples} resamples of {report.n_queries} queries)"
    )
    gap, tilt = profile.end_minus_begin, profile.tilt
    rows = [[f"nDCG@10 {group}", _cell(profile.groups[group]), str(report.group_counts[group])] for group in groups]
    rows += [
        [f"{groups[-1]} − {groups[0]}", gap.format() if gap else "—", ""],
        ["HM", _cell(profile.hm), ""],
        ["PSI ↓", _cell(profile.psi, points_scale=False), ""],
        ["tilt", tilt.format(digits=1) if tilt else "—", ""],
    ]
    return title, ["", "no calibration [95% interval]", "queries"], rows


def render(diagnosis: Diagnosis, console: Console) -> None:
    """The table, then the verdict."""
    render_grids([grid(diagnosis)], console)
    console.print(diagnosis.verdict.sentence, markup=False)


def to_dict(diagnosis: Diagnosis) -> dict[str, Any]:
    """Every figure as a JSON-ready dict (0–1 scale, as `tune evaluate --json`), the verdict with it."""
    profile = diagnosis.profile

    def interval(value: Interval | None) -> dict[str, float] | None:
        return None if value is None else asdict(value)

    return {
        "schema": DIAGNOSIS_SCHEMA,
        "model": diagnosis.model,
        "model_name": diagnosis.model_name,
        "pooling": diagnosis.pooling,
        "padding_side": diagnosis.padding_side,
        "dataset": diagnosis.dataset,
        "n_queries": diagnosis.report.n_queries,
        "group_order": list(profile.groups),
        "group_counts": diagnosis.report.group_counts,
        "n_resamples": diagnosis.n_resamples,
        "seed": diagnosis.seed,
        "confidence": CONFIDENCE,
        "ndcg10": {group: asdict(value) for group, value in profile.groups.items()},
        "end_minus_begin": interval(profile.end_minus_begin),
        "hm": interval(profile.hm),
        "psi": interval(profile.psi),
        "tilt": interval(profile.tilt),
        "verdict": asdict(diagnosis.verdict),
        "encode_seconds": diagnosis.encode_seconds,
        "from_cache": diagnosis.from_cache,
    }
