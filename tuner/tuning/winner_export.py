"""Exporting the winner: its YAML written and registered as an MLflow model (each naming the other), its run marked,
and the parent run closed with the summary; a failed write leaves nothing behind."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from objectives import Selection
from tuner.common.files import EXPORTS, OutputRefusedError
from tuner.common.messages import UserError, first_line
from tuner.data import PositionalDataset
from tuner.engine.exported import build_export, write_exported
from tuner.engine.models import LoadedModel
from tuner.tracking.display import describe_config
from tuner.tracking.progress import Phase
from tuner.tracking.registry import USAGE, Registered, publish, reserve_version, withdraw
from tuner.tracking.runs import Tracker
from tuner.tuning.accounts import study_layer_tokens, trial_figures
from tuner.tuning.heldout import SummaryRow, config_of
from tuner.tuning.search_space import trial_basket_shares
from tuner.tuning.settings import TuneSettings
from tuner.tuning.summary import describe_objective, heldout_sentence, row_metrics

log = logging.getLogger(__name__)


class ExportFailedError(UserError, RuntimeError):
    """The winner's YAML could not be written (a full disk): no file, no registry version, the parent run FAILED."""

    label = "export failed"


@dataclass(frozen=True)
class Winning:
    """What exporting a study's winner reads: the run's settings and model, the study, its chosen trial and why,
    the summary rows it was scored in, the tuning set, the stores it came from and the HM floor it cleared."""

    settings: TuneSettings
    model: LoadedModel
    study: optuna.Study
    best: optuna.trial.FrozenTrial
    rows: list[SummaryRow]
    storage: str
    tuning: PositionalDataset
    selection: Selection
    tracker: Tracker
    floor: float


def _export(winning: Winning, **provenance: object) -> Path:
    winner_row, baseline_row = winning.rows[-1], winning.rows[0]
    metrics: dict[str, dict[str, float]] = {
        "tuning": winner_row.tuning.as_dict(),
        "tuning_baseline": baseline_row.tuning.as_dict(),
    }
    for name, held in winner_row.heldout.items():
        metrics[f"heldout/{name}"] = held.report.as_dict()
        metrics[f"heldout_baseline/{name}"] = baseline_row.heldout[name].report.as_dict()
    exported = build_export(
        winning.model,
        config_of(winning.best, winning.model),
        {k: {m: (float(v) if v is not None else None) for m, v in d.items()} for k, d in metrics.items()},
        study=winning.study.study_name,
        trial=winning.best.number,
        storage=winning.storage,
        dataset=winning.tuning.name,
        dataset_fingerprint=winning.tuning.fingerprint(),
        seed=winning.settings.seed,
        selection_rule=winning.selection.rule,
        selection=winning.selection.describe(),
        heldout=list(winner_row.heldout),
        hm_floor_rule=winning.settings.hm_floor,
        intervals={
            name: {k: list(v) for k, v in held.delta.intervals().items()}
            for name, held in winner_row.heldout.items()
            if held.delta is not None
        },
        **provenance,
    )
    path = _export_path(winning.settings, winning.study)
    if winning.settings.output is None:
        path.parent.mkdir(parents=True, exist_ok=True)
    return write_exported(exported, path, force=winning.settings.force)


def _export_path(settings: TuneSettings, study: optuna.Study) -> Path:
    return settings.output or EXPORTS / f"{study.study_name}.yaml"


def _export_and_register(winning: Winning) -> tuple[Path, Registered | None]:
    """Write the YAML and register it as an MLflow model (`tuner.tracking.registry`), each naming the other: the
    registry version is reserved first, so the YAML it carries records it. A registry failure leaves a
    warning and the YAML (without a version), never a lost study."""
    with Phase("export: writing the winner's YAML and registering it in MLflow"):
        registered = None
        try:
            registered = reserve_version(
                winning.tracker,
                winning.model.spec.alias,
                winning.tracker.find_trial_run(winning.study.study_name, winning.best.number)
                or winning.tracker.parent_id
                or "",
                version_description(winning),
                {
                    "posfair.study": winning.study.study_name,
                    "posfair.trial": str(winning.best.number),
                    "posfair.dataset": winning.tuning.name,
                },
            )
        except Exception as error:  # noqa: BLE001 - the registry is an extra; the export must not be lost to it
            log.warning(
                "the winner is not registered in MLflow (%s: %s)",
                error.__class__.__name__,
                first_line(error),
            )
        try:
            path = _export(
                winning,
                objective=describe_objective(winning.study, winning.best, winning.floor),
                structures=winning.best.user_attrs.get("structures", {}),
                layer_tokens=study_layer_tokens(winning.study),
                # NaN: a re-exported study that recorded none
                hm_floor=winning.floor if winning.floor == winning.floor else None,
                mlflow_run_id=winning.tracker.parent_id,
                tracking_uri=winning.tracker.uri,
                registered_model=registered.name if registered else None,
                registered_version=registered.version if registered else None,
            )
        except (
            OSError,
            OutputRefusedError,
        ) as error:  # a full disk, a file put there since the run began: nothing written
            if registered is not None:
                withdraw(winning.tracker, registered)
            refused = not isinstance(error, OSError)
            raise ExportFailedError(
                f"cannot write the winner's YAML {_export_path(winning.settings, winning.study)}: "
                f"{error.strerror or error if isinstance(error, OSError) else error}; nothing exported (no partial "
                f"file, no registry version). {'Choose' if refused else 'Free space or choose'} another --output, then "
                f"run `tune export --study-name {winning.study.study_name} --output ...`"
            ) from None
        if registered is not None:
            try:
                publish(winning.tracker, registered, path, winning.model.dimension, winning.settings.trust_remote_code)
            except Exception as error:  # noqa: BLE001 - as above
                log.warning(
                    "the winner's MLflow model was not written (%s: %s)",
                    error.__class__.__name__,
                    first_line(error),
                )
    return path, registered


@dataclass(frozen=True)
class Closing:
    """What a caller of `export_and_close` adds to the common close of the parent run."""

    metrics: dict[str, float] = field(default_factory=dict)
    artifacts: list[Path] = field(default_factory=list)  # logged before the YAML
    tags: dict[str, str] = field(default_factory=dict)


def export_and_close(
    winning: Winning,
    *,
    outcome: str,
    exported: Callable[[Winning, Path], Closing] = lambda winning, path: Closing(),
    failure_artifacts: Sequence[Path] = (),
) -> tuple[Path, Registered | None]:
    """The end `conclude` and `reexport` share: export and register the winner (`_export_and_register`), mark
    its run (`_mark_winner`), and close the parent run with the summary rows' metrics, the winner's number,
    the YAML and the tags both set (`posfair.outcome` = `outcome`, the export's path, the selection rule and
    its reasoning).

    What differs comes in as arguments. `exported(winning, path)` runs once the YAML is written, before the winner is
    marked: what may only follow a successful export (`conclude` records it for later runs and writes the
    files it logs), returning what it adds to the close. A failed export closes the parent run FAILED (with
    `failure_artifacts`) before the error goes on: neither a study nor a re-export leaves it RUNNING.
    """
    tracker, best, selection = winning.tracker, winning.best, winning.selection
    try:
        path, registered = _export_and_register(winning)
    except ExportFailedError as error:
        tracker.finish_study({}, list(failure_artifacts), {"posfair.outcome": f"export failed: {error}"}, "FAILED")
        raise
    extra = exported(winning, path)
    _mark_winner(tracker, winning.study, best, winning.model, selection, registered)
    tracker.finish_study(
        {**row_metrics(winning.rows), "winner_trial": best.number, **extra.metrics},
        [*extra.artifacts, path],
        {
            "posfair.outcome": outcome,
            "posfair.export": str(path),
            "posfair.selection_rule": selection.rule,
            "posfair.selection": selection.describe(),
            **extra.tags,
        },
    )
    return path, registered


def _mark_winner(
    tracker: Tracker,
    study: optuna.Study,
    best: optuna.trial.FrozenTrial,
    model: LoadedModel,
    selection: Selection,
    registered: Registered | None,
) -> None:
    """Name the winner's run (and keep its reference marker): what wins is visible in the run list."""
    markers = [m for m in (best.user_attrs.get("role"),) if m] + ["winner"]
    params = {**best.params, "layers": best.user_attrs.get("layers"), "basket_shares": trial_basket_shares(best)}
    where = f" Registered as {registered.uri} (version {registered.version})." if registered else ""
    tracker.mark_trial(
        study.study_name,
        best.number,
        markers,
        {"posfair.winner": "yes"},
        f"Winner (trial {best.number}): {describe_config(params, model.num_layers)}: {trial_figures(best)}. "
        f"Chosen by the {selection.rule} rule: {selection.reason()}.{where}",
    )


def version_description(winning: Winning) -> str:
    """The registered version's description: the study, the trial and its config, its held-out result, why it won,
    and what the pyfunc takes (`tuner.tracking.registry.USAGE`)."""
    best = winning.best
    params = {**best.params, "layers": best.user_attrs.get("layers"), "basket_shares": trial_basket_shares(best)}
    return (
        f"Study {winning.study.study_name}, trial {best.number}: {describe_config(params, winning.model.num_layers)}. "
        f"{heldout_sentence(winning.rows)} Chosen by the {winning.selection.rule} rule: "
        f"{winning.selection.reason()}. {USAGE}"
    )
