"""Concluding a study: name the winner, score it (beside no calibration and the paper's default) on the
held-out sets, export it, and close the MLflow parent run; or say why there is no winner, or which process exports."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NoReturn

import optuna
from optuna.trial import TrialState

from objectives import Selection
from tuner.calibration import CalibrationConfig
from tuner.data import PositionalDataset
from tuner.evaluation.evaluator import Evaluation, Evaluator
from tuner.tracking.display import NOTE, display_metrics, summary_metrics
from tuner.tracking.runs import Tracker
from tuner.tuning.accounts import (
    budget_metrics,
    budget_tags,
    dashboard_notes,
    describe_trials,
    study_layer_tokens,
    trial_metrics,
)
from tuner.tuning.candidates import pareto_front, winner
from tuner.tuning.export_election import claim_export, describe_elected, record_export
from tuner.tuning.heldout import SummaryRow, config_of, summary_rows
from tuner.tuning.settings import TuneSettings
from tuner.tuning.study import WINNER_ATTR
from tuner.tuning.summary import (
    heldout_markdown,
    heldout_picture,
    nothing_feasible,
    psi_importances,
    row_dict,
    structure_metrics,
    study_conclusion,
    study_figures,
    winner_columns,
)
from tuner.tuning.winner_export import Closing, Winning, export_and_close

log = logging.getLogger(__name__)


class NoFeasibleTrialError(RuntimeError):
    """No complete trial satisfied the constraints: nothing is exported."""


@dataclass(frozen=True)
class TuneOutcome:
    study: str
    winner_trial: int
    config: CalibrationConfig
    export_path: Path
    rows: list[SummaryRow]
    pareto: list[int]
    floor: float
    tracking_uri: str
    selection: Selection
    registered: str | None = None  # models:/NAME@champion, when the winner was registered


def conclude(
    settings: TuneSettings,
    study: optuna.Study,
    tracker: Tracker,
    evaluator: Evaluator,
    heldout: list[PositionalDataset],
    floor: float,
    staging: Path,
    storage: str,
) -> TuneOutcome | None:
    """Pick the winner, score it on the held-out sets, export it, and close the parent run; None when another
    process finishing the study at the same time was elected to export it (`claim_export`)."""
    model = evaluator.model
    elected = claim_export(study)
    if elected is not None:
        _leave_export_to(elected, study, tracker)
        return None
    picked = winner(study, settings.selection)
    baseline = evaluator.run(None)
    figures = study_figures(study, floor, picked, staging, settings.constraints(0.0).conservative)
    if picked is None:
        _no_winner(study, settings, tracker, baseline, floor, figures)
    best, selection = picked
    log.info("trials: %s", describe_trials(study))
    log.info("winner: %s", selection.describe())
    tracker.close_stale_trials(study.study_name, [t.number for t in study.trials if t.state == TrialState.FAIL])
    if best.params.get("strength") == 0:
        log.warning(
            "no calibration is fairer than the uncalibrated model by more than the tuning split's noise: "
            "the export keeps the model uncalibrated (strength 0); `--selection lowest` takes the lowest PSI"
        )
    rows = summary_rows(study, best, evaluator, heldout, settings)
    export_path, registered = export_and_close(
        Winning(settings, model, study, best, rows, storage, evaluator.dataset, selection, tracker, floor),
        outcome="exported",
        exported=partial(_concluded, staging, figures),
        failure_artifacts=figures,
    )
    return TuneOutcome(
        study.study_name,
        best.number,
        config_of(best, model),
        export_path,
        rows,
        # one objective: the rule, not the front, decides
        [t.number for t in pareto_front(study)] if settings.pareto else [],
        floor,
        tracker.uri,
        selection,
        f"{registered.uri} (version {registered.version})" if registered else None,
    )


def _no_winner(
    study: optuna.Study,
    settings: TuneSettings,
    tracker: Tracker,
    baseline: Evaluation,
    floor: float,
    figures: list[Path],
) -> NoReturn:
    """No complete trial is feasible: say why on the study and its parent run (closed FAILED), and end with an error."""
    reason = nothing_feasible(study, settings, floor)
    study.set_user_attr(WINNER_ATTR, f"none: {reason}")
    tracker.finish_study(
        {
            **summary_metrics("tuning/uncalibrated", baseline.report.as_dict(), None),
            **display_metrics({"hm_floor": floor}),
        },
        figures,
        {"posfair.outcome": "no feasible trial", NOTE: reason},
        "FAILED",
    )
    raise NoFeasibleTrialError(reason)


def _leave_export_to(elected: dict[str, object], study: optuna.Study, tracker: Tracker) -> None:
    """Say which process exports (or exported) the study, and close this process's hold on the parent run."""
    log.info("%s", describe_elected(elected, study))
    tracker.finish_study({}, [], {})


def _concluded(staging: Path, figures: Sequence[Path], winning: Winning, path: Path) -> Closing:
    """What `conclude` does once the winner's YAML is at `path` (`export_and_close`): record the export for
    later runs (`record_export`), write the summary and held-out table, describe the winner on the study, and
    return what the parent run's close adds (the study's figures and costs, the description)."""
    study, best, rows = winning.study, winning.best, winning.rows
    record_export(study, path)
    summary = staging / "summary.json"
    summary.write_text(json.dumps([row_dict(r) for r in rows], indent=1), encoding="utf-8")
    heldout_table = staging / "heldout.md"
    heldout_table.write_text(heldout_markdown(rows), encoding="utf-8")
    pictures = [heldout_picture(rows, staging / "heldout.png")] if rows[0].heldout else []
    description = study_conclusion(best, rows, winning.model.num_layers, winning.selection)
    study.set_user_attr(WINNER_ATTR, description)
    dashboard_notes(study, best, winning.selection, winning.model.num_layers)
    return Closing(
        {
            **display_metrics({"hm_floor": winning.floor}),
            **winner_columns(best, rows),
            **{f"psi_importance/{k}": v for k, v in psi_importances(study).items()},
            **structure_metrics(best),
            "cost/layer_tokens": float(study_layer_tokens(study)),
            "cost/heldout_layer_tokens": float(sum(row.heldout_layer_tokens for row in rows)),
            **budget_metrics(study),
            **trial_metrics(study),
        },
        [*figures, *pictures, heldout_table, summary],
        {NOTE: description, "posfair.trials": describe_trials(study), **budget_tags(study)},
    )
