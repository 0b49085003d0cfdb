"""Concluding a study: name the winner, score it (beside no calibration and the paper's default) on the
held-out sets, export it, and close the MLflow parent run; `reexport` does it again for a stored study."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import NoReturn

import optuna
from optuna.trial import TrialState

from objectives import (
    CONSTRAINTS,
    Constraints,
    HmFloor,
    Interval,
    PairedBootstrap,
    PositionProfile,
    PositionReport,
    Selection,
    describe_rule,
    paired_bootstrap,
    position_profile,
)
from tuner.calibration import CalibrationConfig
from tuner.common.files import EXPORTS, OutputRefusedError
from tuner.common.messages import UserError, first_line
from tuner.common.trials import SELECTION_ATTR, SETUP_COST_ATTR, complete_trials, named_constraints
from tuner.data import PositionalDataset
from tuner.engine.exported import build_export, write_exported
from tuner.engine.models import LoadedModel, hub_revision
from tuner.engine.prefix import starting_layers
from tuner.evaluation.evaluator import Evaluation, Evaluator
from tuner.tracking.plots import heldout_profiles, optuna_figures, param_importances, pareto_scatter
from tuner.tracking.progress import Phase
from tuner.tracking.registry import USAGE, Registered, publish, reserve_version, withdraw
from tuner.tracking.runs import NOTE, Tracker, describe_config, display_metrics, summary_metrics
from tuner.tuning.accounts import budget_metrics, budget_tags, dashboard_notes, describe_trials, trial_figures, trial_metrics
from tuner.tuning.search_space import BASELINE_PARAMS, PAPER_DEFAULT_PARAMS, is_reference_trial, trial_basket_shares, trial_config
from tuner.tuning.session import FLOOR_ATTR, reload_tuned
from tuner.tuning.settings import EXPERIMENT, TuneSettings
from tuner.tuning.study import (
    OWNER_ATTR,
    WINNER_ATTR,
    claim_export,
    load_stored_study,
    pareto_front,
    record_export,
    trial_by_number,
    winner,
)

log = logging.getLogger(__name__)


class NoFeasibleTrialError(RuntimeError):
    """No complete trial satisfied the constraints: nothing is exported."""


class ExportFailedError(UserError, RuntimeError):
    """The winner's YAML could not be written (a full disk): no file, no registry version, the parent run FAILED."""

    label = "export failed"


@dataclass(frozen=True)
class HeldOut:
    """A config on one held-out set, and its change against no calibration there (None for the baseline)."""

    report: PositionReport
    delta: PairedBootstrap | None
    layer_tokens: int = 0  # what scoring it cost (`Batches.layer_tokens`)
    profile: PositionProfile | None = None  # nDCG@10 per position group and the tilt, with intervals


@dataclass(frozen=True)
class SummaryRow:
    """One line of the summary: a config's tuning-split report and its comparison on each held-out set."""

    label: str
    trial: int | None
    config: CalibrationConfig | None
    tuning: PositionReport
    heldout: dict[str, HeldOut] = field(default_factory=dict)

    @property
    def heldout_layer_tokens(self) -> int:
        return sum(held.layer_tokens for held in self.heldout.values())


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
    reference = _trial_with(study, BASELINE_PARAMS)
    best = picked[0] if picked else None
    figures = [
        pareto_scatter(
            study, floor, reference, best, staging / "pareto.png", settings.constraints(0.0).conservative, picked[1] if picked else None
        ),
        *optuna_figures(study, staging),
    ]
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
    rows = _summary_rows(study, best, evaluator, heldout, settings)
    export_path, registered = _export_and_close(
        _Winning(settings, model, study, best, rows, storage, evaluator.dataset, selection, tracker, floor),
        outcome="exported",
        exported=partial(_concluded, staging, figures),
        failure_artifacts=figures,
    )
    return TuneOutcome(
        study.study_name,
        best.number,
        _config_of(best, model),
        export_path,
        rows,
        [t.number for t in pareto_front(study)] if settings.pareto else [],  # one objective: the rule, not the front, decides
        floor,
        tracker.uri,
        selection,
        f"{registered.uri} (version {registered.version})" if registered else None,
    )


def _no_winner(
    study: optuna.Study, settings: TuneSettings, tracker: Tracker, baseline: Evaluation, floor: float, figures: list[Path]
) -> NoReturn:
    """No complete trial is feasible: say why on the study and its parent run (closed FAILED), and end with an error."""
    reason = _nothing_feasible(study, settings, floor)
    study.set_user_attr(WINNER_ATTR, f"none: {reason}")
    tracker.finish_study(
        {**summary_metrics("tuning/uncalibrated", baseline.report.as_dict(), None), **display_metrics({"hm_floor": floor})},
        figures,
        {"posfair.outcome": "no feasible trial", NOTE: reason},
        "FAILED",
    )
    raise NoFeasibleTrialError(reason)


def _leave_export_to(elected: dict[str, object], study: optuna.Study, tracker: Tracker) -> None:
    """Say which process exports (or exported) the study, and close this process's hold on the parent run."""
    owner: dict[str, object] = elected.get(OWNER_ATTR) or {}  # type: ignore[assignment]
    who = f"the other process (pid {owner.get('pid', '?')} on {owner.get('host', '?')})"
    trials = len(complete_trials(study))
    if "export" in elected:
        log.info(
            "study %s is complete (%d trials) and its winner was exported by %s to %s, so not again here; "
            "`tune export --study-name %s` exports it again",
            study.study_name,
            trials,
            who,
            elected["export"],
            study.study_name,
        )
    else:
        log.info("study %s is complete (%d trials); its winner is being exported by %s, so not again here", study.study_name, trials, who)
    tracker.finish_study({}, [], {})


def _nothing_feasible(study: optuna.Study, settings: TuneSettings, floor: float) -> str:
    """Why no trial won: each constraint every complete trial missed, with the trial that came closest (in the
    constraints' own words, `Constraints.clause`), and the options that relax them."""
    complete = [named_constraints(t) | {"trial": t.number} for t in complete_trials(study)]
    constraints = replace(settings.constraints(0.0), hm_floor=floor)
    parts, options = [], []
    for requirement in CONSTRAINTS:
        checked = [values for values in complete if requirement.name in values]
        if not checked or any(values[requirement.name] <= 0 for values in checked):
            continue
        closest = min(checked, key=lambda values: values[requirement.name])
        clause = constraints.clause(requirement.name, closest[requirement.name])
        parts.append(f"every trial {requirement.missed} (the closest, trial {int(closest['trial'])}: {clause.partition(' (')[2][:-1]})")
        options.append(requirement.option)
    said = "; ".join(parts) or "no constraint was missed by every trial (each trial's `feasible` attribute says which it missed)"
    if not options:  # the options of what some trial missed
        options = [r.option for r in CONSTRAINTS if any(values.get(r.name, 0.0) > 0 for values in complete)]
    relax = " or ".join(dict.fromkeys(options))
    return f"no trial met the constraints; nothing exported. {said}. Relax {relax}, widen the search space, or run more --trials."


def reexport(
    study_name: str,
    storage: str,
    output: Path | None,
    tracking_uri: str | None,
    trust_remote_code: bool = False,
    selection: str | None = None,
    trial: int | None = None,
    *,
    force: bool = False,
) -> Path:
    """Export a stored study's current winner again (or its trial `trial`, as the user chose), re-scoring
    it (and the baseline) on every split. The winner is named by `selection`, by default the rule the study
    was run with.

    The model is loaded exactly as the study loaded it: the recorded revision (a hub commit), and remote
    code if the study was run with `--trust-remote-code` (said, unless `trust_remote_code` allows it here too).
    The export is logged to the study's MLflow parent run, in `tracking_uri` (default: the store the study
    logged to).
    """
    study = load_stored_study(study_name, storage)
    attrs = study.user_attrs
    _require_made_by_tune(study_name, storage, attrs)
    if attrs.get("trust_remote_code") and not trust_remote_code:
        log.warning(
            "study %s was tuned with --trust-remote-code, so %s runs its own code from its repository here too",
            study_name,
            attrs["model_name"],
        )
    if selection is None:
        selection = attrs.get(SELECTION_ATTR) or "one-se"
        if SELECTION_ATTR not in attrs:
            log.info(
                "study %s records no selection rule (an older posfair ran it): one-se, tune's default; --selection chooses", study_name
            )
    tracker = Tracker(tracking_uri or attrs.get("tracking_uri"), EXPERIMENT)  # an unreachable server fails here
    settings = _stored_settings(
        study,
        storage,
        selection,
        output=output,
        force=force,
        tracking_uri=tracker.uri,
        trust_remote_code=trust_remote_code or bool(attrs.get("trust_remote_code")),
    )
    picked = winner(study, selection) if trial is None else trial_by_number(study, trial)
    if picked is None:
        raise NoFeasibleTrialError(f"study {study_name!r} has no feasible complete trial; nothing to export")
    best, chosen = picked
    model, tuning, heldout = reload_tuned(settings, attrs)
    evaluator = Evaluator(
        model,
        tuning,
        settings.batch_size,
        batch_tokens=settings.batch_tokens,
        prefix_layers=settings.space.starting_layers(model.num_layers),
    )
    rows = _summary_rows(study, best, evaluator, heldout, settings)
    tracker.start_study(study_name, params=dict(attrs), tags={"posfair.model": model.spec.alias, "posfair.dataset": tuning.name})
    floor = float(attrs.get(FLOOR_ATTR, float("nan")))
    path, _ = _export_and_close(
        _Winning(settings, model, study, best, rows, storage, tuning, chosen, tracker, floor), outcome="re-exported"
    )
    return path


def _require_made_by_tune(study_name: str, storage: str, attrs: dict[str, object]) -> None:
    """A study `tune` did not make (it lacks what `tune` records) cannot be exported."""
    lacking = [
        key
        for key in ("model_name", "pooling", "dataset_name", "seed", "hm_floor", "pareto", "revision", "dataset_fingerprint")
        if key not in attrs
    ]
    if lacking:
        raise ValueError(
            f"study {study_name!r} in {storage} was not made by `tune` (it lacks {', '.join(lacking)}); "
            "only studies that `tune` ran can be exported"
        )


def _stored_settings(
    study: optuna.Study, storage: str, selection: str, *, output: Path | None, force: bool, tracking_uri: str, trust_remote_code: bool
) -> TuneSettings:
    """The settings a stored study was tuned with, from its attributes, with what `tune export` was given."""
    attrs = study.user_attrs
    return TuneSettings(
        model=attrs["model_name"],
        pooling=attrs["pooling"],
        padding_side=attrs.get("padding_side"),
        dataset=attrs["dataset_name"],
        seed=attrs["seed"],
        hm_floor=attrs["hm_floor"],
        max_ndcg_drop=attrs.get("max_ndcg_drop"),
        max_crops_psi=attrs.get("max_crops_psi"),
        selection=selection,
        pareto=attrs["pareto"],
        storage=storage,
        study_name=study.study_name,
        output=output,
        force=force,
        tracking_uri=tracking_uri,
        heldout=attrs.get("heldout", "auto"),
        trust_remote_code=trust_remote_code,
        revision=hub_revision(attrs["revision"]),
    )


def _config_of(trial: optuna.trial.FrozenTrial, model: LoadedModel) -> CalibrationConfig:
    return trial_config(trial, model.spec.pooling, model.spec.padding_side)


def _trial_with(study: optuna.Study, reference: dict[str, object]) -> optuna.trial.FrozenTrial | None:
    return next((t for t in study.trials if is_reference_trial(t, reference) and "hm" in t.user_attrs), None)


def _summary_rows(
    study: optuna.Study,
    best: optuna.trial.FrozenTrial,
    evaluator: Evaluator,
    heldout: list[PositionalDataset],
    settings: TuneSettings,
) -> list[SummaryRow]:
    """No calibration, the paper's default, and the winner; held-out figures with bootstrap intervals."""
    model = evaluator.model
    entries: list[tuple[str, optuna.trial.FrozenTrial | None]] = [("No calibration", None)]
    default = _trial_with(study, PAPER_DEFAULT_PARAMS)
    if default is not None and default.number != best.number:
        entries.append(("Paper default", default))
    entries.append((f"Winner (trial {best.number})", best))
    configs = [(label, trial, _config_of(trial, model) if trial is not None else None) for label, trial in entries]
    starts = starting_layers((c for _, _, c in configs), model.num_layers)
    held: dict[str, dict[str, HeldOut]] = {label: {} for label, _, _ in configs}
    for number, dataset in enumerate(heldout, 1):
        with Phase(
            f"held-out {number}/{len(heldout)}: scoring {len(configs)} configs on {dataset.name} "
            f"({len(dataset.corpus)} documents, {len(dataset.queries)} queries)"
        ):
            scorer = _held_out_scorer(evaluator, dataset, starts, settings)
            baseline = scorer(None)
            for label, _, config in configs:
                result = scorer(config) if config is not None else baseline
                delta = paired_bootstrap(baseline.per_query, result.per_query, settings.bootstrap, settings.seed) if config else None
                held[label][dataset.name] = HeldOut(
                    result.report,
                    delta,
                    result.layer_tokens if config is not None else baseline.layer_tokens,
                    position_profile(result.per_query, settings.bootstrap, settings.seed),
                )
                log.info(
                    "held-out %s: %s scored (%s)",
                    dataset.name,
                    label,
                    delta.summary() if delta else f"nDCG@10 {100 * result.report.ndcg10:.2f}",
                )
    return [
        SummaryRow(label, trial.number if trial else None, config, evaluator.run(config).report, held[label])
        for label, trial, config in configs
    ]


def _held_out_scorer(
    evaluator: Evaluator, dataset: PositionalDataset, starts: Sequence[int], settings: TuneSettings
) -> Callable[[CalibrationConfig | None], Evaluation]:
    """Scores on a held-out set. A held-out part of the tuning corpus (FineWeb-PosQ's) reuses the tuning
    vectors; another corpus gets its own evaluator, whose baseline pass records the inputs of the layers
    where the configs start calibrating, so each config resumes there. Those inputs are gone with the evaluator:
    each study scores a held-out set with a few configs once, and the vectors it keeps serve the next."""
    if dataset.corpus == evaluator.dataset.corpus:
        scorer = Evaluator(evaluator.model, dataset, evaluator.batch_size, batch_tokens=settings.batch_tokens, cache_budget=0)
        return partial(scorer.run_over, evaluator)
    own = Evaluator(
        evaluator.model,
        dataset,
        settings.batch_size,
        show_progress=sys.stderr.isatty(),
        batch_tokens=settings.batch_tokens,
        prefix_layers=starts,
        keep_on_disk=True,
        keep_layer_inputs=False,
    )
    return own.run


@dataclass(frozen=True)
class _Winning:
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


def _export(winning: _Winning, **provenance: object) -> Path:
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
        _config_of(winning.best, winning.model),
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


def _row_dict(row: SummaryRow) -> dict[str, object]:
    return {
        "label": row.label,
        "trial": row.trial,
        "config": row.config.model_dump() if row.config else None,
        "tuning": row.tuning.as_dict(),
        "heldout": {
            name: {
                "metrics": h.report.as_dict(),
                "delta": h.delta.summary() if h.delta else None,
                "intervals": h.delta.intervals() if h.delta else None,  # metric → (estimate, low, high), 0–1 scale
            }
            for name, h in row.heldout.items()
        },
    }


def _export_and_register(winning: _Winning) -> tuple[Path, Registered | None]:
    """Write the YAML and register it as an MLflow model (`tuner.tracking.registry`), each naming the other: the
    registry version is reserved first, so the YAML it carries records it. A registry failure leaves a
    warning and the YAML (without a version), never a lost study."""
    with Phase("export: writing the winner's YAML and registering it in MLflow"):
        registered = None
        try:
            registered = reserve_version(
                winning.tracker,
                winning.model.spec.alias,
                winning.tracker.find_trial_run(winning.study.study_name, winning.best.number) or winning.tracker.parent_id or "",
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
                hm_floor=winning.floor if winning.floor == winning.floor else None,  # NaN: a re-exported study that recorded none
                mlflow_run_id=winning.tracker.parent_id,
                tracking_uri=winning.tracker.uri,
                registered_model=registered.name if registered else None,
                registered_version=registered.version if registered else None,
            )
        except (OSError, OutputRefusedError) as error:  # a full disk, a file put there since the run began: nothing written
            if registered is not None:
                withdraw(winning.tracker, registered)
            refused = not isinstance(error, OSError)
            raise ExportFailedError(
                f"cannot write the winner's YAML {_export_path(winning.settings, winning.study)}: "
                f"{error.strerror or error if isinstance(error, OSError) else error}; nothing exported (no partial file, no "
                f"registry version). {'Choose' if refused else 'Free space or choose'} another --output, then run "
                f"`tune export --study-name {winning.study.study_name} --output ...`"
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
class _Closing:
    """What a caller of `_export_and_close` adds to the common close of the parent run."""

    metrics: dict[str, float] = field(default_factory=dict)
    artifacts: list[Path] = field(default_factory=list)  # logged before the YAML
    tags: dict[str, str] = field(default_factory=dict)


def _export_and_close(
    winning: _Winning,
    *,
    outcome: str,
    exported: Callable[[_Winning, Path], _Closing] = lambda winning, path: _Closing(),
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
        {**_row_metrics(winning.rows), "winner_trial": best.number, **extra.metrics},
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


def _concluded(staging: Path, figures: Sequence[Path], winning: _Winning, path: Path) -> _Closing:
    """What `conclude` does once the winner's YAML is at `path` (`_export_and_close`): record the export for
    later runs (`record_export`), write the summary and held-out table, describe the winner on the study, and
    return what the parent run's close adds (the study's figures and costs, the description)."""
    study, best, rows = winning.study, winning.best, winning.rows
    record_export(study, path)
    summary = staging / "summary.json"
    summary.write_text(json.dumps([_row_dict(r) for r in rows], indent=1), encoding="utf-8")
    heldout_table = staging / "heldout.md"
    heldout_table.write_text(heldout_markdown(rows), encoding="utf-8")
    pictures = [heldout_picture(rows, staging / "heldout.png")] if rows[0].heldout else []
    description = study_conclusion(best, rows, winning.model.num_layers, winning.selection)
    study.set_user_attr(WINNER_ATTR, description)
    dashboard_notes(study, best, winning.selection, winning.model.num_layers)
    return _Closing(
        {
            **display_metrics({"hm_floor": winning.floor}),
            **winner_columns(best, rows),
            **{f"psi_importance/{k}": v for k, v in _importances(study).items()},
            **_structure_metrics(best),
            "cost/layer_tokens": float(study_layer_tokens(study)),
            "cost/heldout_layer_tokens": float(sum(row.heldout_layer_tokens for row in rows)),
            **budget_metrics(study),
            **trial_metrics(study),
        },
        [*figures, *pictures, heldout_table, summary],
        {NOTE: description, "posfair.trials": describe_trials(study), **budget_tags(study)},
    )


def describe_objective(study: optuna.Study, best: optuna.trial.FrozenTrial, floor: float) -> str:
    """What the study optimised, and subject to what, in one line (the YAML's provenance): the constraints its trials
    were checked on, with the study's limits (`study_constraints`)."""
    complete = complete_trials(study)
    checked = [r.name for r in CONSTRAINTS if any(r.name in named_constraints(t) for t in complete)]
    structures = len(best.user_attrs.get("structures", {})) > 1
    return describe_rule(study_constraints(study, floor), checked, bool(study.user_attrs.get("pareto")), structures)


def study_constraints(study: optuna.Study, floor: float) -> Constraints:
    """The limits a study ran under, from its identity attributes (`tuner.tuning.session.prepare`), with `floor` resolved."""
    attrs, defaults = study.user_attrs, Constraints(floor)
    return Constraints(
        floor,
        HmFloor.parse(str(attrs.get("hm_floor", "significant"))).conservative,
        attrs.get("max_ndcg_drop", defaults.max_ndcg_drop),
        attrs.get("max_general_drop"),
        attrs.get("max_crops_psi"),
        attrs.get("max_reversal", defaults.max_reversal),
        attrs.get("max_drift"),
    )


def setup_layer_tokens(study: optuna.Study) -> int:
    """What the study's processes encoded before their trials (baselines, queries), in layer-tokens."""
    return int(sum(v for k, v in study.user_attrs.items() if k.startswith(SETUP_COST_ATTR)))


def study_layer_tokens(study: optuna.Study) -> int:
    """What the study cost in padded tokens × layers run: every process's baselines and queries, and every
    trial, pruned and failed ones included (held-out scoring apart)."""
    return setup_layer_tokens(study) + int(sum(t.user_attrs.get("layer_tokens", 0) for t in study.get_trials(deepcopy=False)))


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


def _structure_metrics(best: optuna.trial.FrozenTrial) -> dict[str, float]:
    """The winner's figures on each tuning structure (PSI, tilt, reversal, drift), as parent-run metrics."""
    shown: dict[str, float] = {}
    for name, row in best.user_attrs.get("structures", {}).items():
        shown |= display_metrics(row, f"tuning/winner/structure/{name}/")
    return shown


def study_conclusion(best: optuna.trial.FrozenTrial, rows: list[SummaryRow], num_layers: int, selection: Selection) -> str:
    """The parent run's description, two sentences: the winner with its config and the rule that chose it,
    then its change against no calibration on each held-out set."""
    params = {**best.params, "layers": best.user_attrs.get("layers"), "basket_shares": trial_basket_shares(best)}
    first = (
        f"Winner: trial {best.number}, {describe_config(params, num_layers)}: {trial_figures(best)}; "
        f"chosen by the {selection.rule} rule: {selection.reason()}."
    )
    return f"{first} {heldout_sentence(rows)}"


def heldout_sentence(rows: list[SummaryRow]) -> str:
    """The winner (the last row) against no calibration on each held-out set, in one sentence."""
    held = [
        f"{name} ΔHM {h.delta.hm.format()}, ΔPSI {h.delta.psi.format(scale=1, digits=3)}, ΔnDCG@10 {h.delta.ndcg10.format()}"
        if h.delta.hm and h.delta.psi
        else f"{name} ΔnDCG@10 {h.delta.ndcg10.format()}"
        for name, h in rows[-1].heldout.items()
        if h.delta is not None
    ]
    if not held:
        return "No held-out set was scored."
    return "Held out, against no calibration (95% paired-bootstrap intervals): " + "; ".join(held) + "."


def version_description(winning: _Winning) -> str:
    """The registered version's description: the study, the trial and its config, its held-out result, why it won,
    and what the pyfunc takes (`tuner.tracking.registry.USAGE`)."""
    best = winning.best
    params = {**best.params, "layers": best.user_attrs.get("layers"), "basket_shares": trial_basket_shares(best)}
    return (
        f"Study {winning.study.study_name}, trial {best.number}: {describe_config(params, winning.model.num_layers)}. "
        f"{heldout_sentence(winning.rows)} Chosen by the {winning.selection.rule} rule: {winning.selection.reason()}. {USAGE}"
    )


def heldout_markdown(rows: list[SummaryRow]) -> str:
    """Every held-out set as Markdown: one table of each config's HM, PSI, nDCG@10 and its change against no
    calibration with the 95% interval (the console's held-out tables), then per set how each config does along the
    passage: nDCG@10 in each position group and the tilt, with intervals, and their change against no calibration."""
    lines = [
        "# Held-out results",
        "",
        "Change against no calibration on the same queries, with 95% paired-bootstrap intervals. "
        "HM and nDCG@10 in points (x100), PSI 0-1 (lower is fairer).",
        "",
        "| set | config | HM | PSI | nDCG@10 | ΔHM | ΔPSI | ΔnDCG@10 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in rows[0].heldout:
        for row in rows:
            r, d = row.heldout[name].report, row.heldout[name].delta
            hm, psi = (f"{100 * r.hm:.2f}", f"{r.psi:.3f}") if r.hm is not None and r.psi is not None else ("–", "–")
            lines.append(
                f"| {name} | {row.label} | {hm} | {psi} | {100 * r.ndcg10:.2f} | "
                f"{d.hm.format() if d and d.hm else '–'} | {d.psi.format(scale=1, digits=3) if d and d.psi else '–'} | "
                f"{d.ndcg10.format() if d else '–'} |"
            )
    lines += [
        "",
        "## Along the passage",
        "",
        "nDCG@10 (points) in each position group of the set, from the beginning of the passage to its end, and the tilt "
        "(the slope of nDCG@10 along the passage over its mean, x100: negative, the beginning is favoured), each with its "
        "95% bootstrap interval; below each config, its change against no calibration (95% paired-bootstrap interval). "
        "The same picture: `heldout.png`.",
    ]
    for name in rows[0].heldout:
        profiles = [(row, row.heldout[name]) for row in rows if row.heldout[name].profile is not None]
        if not profiles:
            continue
        groups = list(profiles[0][1].profile.groups)  # type: ignore[union-attr]
        lines += ["", f"### {name}", "", "| config | " + " | ".join([*groups, "tilt"]) + " |", "|---|" + "---:|" * (len(groups) + 1)]
        for row, held in profiles:
            profile, delta = held.profile, held.delta
            assert profile is not None
            cells = [_interval(profile.groups[g], signed=False) for g in groups] + [_interval(profile.tilt) if profile.tilt else "–"]
            lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
            if delta is not None:
                changes = [delta.groups[g].format() if g in delta.groups else "–" for g in groups]
                lines.append("| Δ vs no calibration | " + " | ".join([*changes, delta.tilt.format() if delta.tilt else "–"]) + " |")
    return "\n".join(lines) + "\n"


def _interval(interval: Interval, signed: bool = True) -> str:
    """'57.31 [55.02, 59.47]' (points), or signed: '-17.4 [-20.1, -14.6]'."""
    if signed:
        return interval.format(digits=1)
    return f"{100 * interval.estimate:.2f} [{100 * interval.low:.2f}, {100 * interval.high:.2f}]"


def heldout_picture(rows: list[SummaryRow], path: Path) -> Path:
    """`heldout_markdown`'s profiles as a picture (`tuner.tracking.plots.heldout_profiles`)."""
    sets = {
        name: [(row.label, row.heldout[name].profile) for row in rows if row.heldout[name].profile is not None] for name in rows[0].heldout
    }
    return heldout_profiles(sets, path)  # type: ignore[arg-type]


def winner_columns(best: optuna.trial.FrozenTrial, rows: list[SummaryRow]) -> dict[str, float]:
    """The winner's figures on the parent run under the trials' own column names (worst_structure_psi, psi, hm_x100,
    feasible, ndcg10_change_vs_uncalibrated_x100), so one set of run-list columns shows them on the study's row too,
    and its change on the first held-out set as `heldout_winner_change_hm_x100` / `_psi`, rounded as shown."""
    metrics = best.user_attrs.get("metrics", {})
    names = ("robust_psi", "psi", "hm", "feasible", "ndcg10_delta")
    columns = {k: v for k, v in display_metrics({k: metrics[k] for k in names if k in metrics}).items()}
    first = next((h.delta for h in rows[-1].heldout.values() if h.delta is not None), None)
    if first is not None and first.hm is not None and first.psi is not None:
        columns |= {"heldout_winner_change_hm_x100": 100 * first.hm.estimate, "heldout_winner_change_psi": first.psi.estimate}
    return {k: round(v, 4) for k, v in columns.items()}


WINNER_HELD_OUT = "Winner held out"
"""The section of the parent run's metrics that holds the winner's held-out figures: logged first (MLflow's run page
lists metrics in the order logged) and capitalised (its charts sort sections by name, capitals first), so they come
before the reference configs' and the costs."""


def _row_metrics(rows: list[SummaryRow]) -> dict[str, float]:
    """The summary table as parent-run metrics: the winner's held-out figures with their intervals first (under
    `WINNER_HELD_OUT`), then every config's tuning figures and the reference configs' held-out ones."""
    labels = ["uncalibrated", *(["paper_default"] if len(rows) > 2 else []), "winner"]
    metrics: dict[str, float] = {}
    for name, held in rows[-1].heldout.items():
        metrics |= summary_metrics(f"{WINNER_HELD_OUT}/{name}", held.report.as_dict(), held.delta.intervals() if held.delta else None)
    for label, row in zip(labels, rows):
        metrics |= summary_metrics(f"tuning/{label}", row.tuning.as_dict(), None)
    for label, row in zip(labels[:-1], rows[:-1]):
        for name, held in row.heldout.items():
            metrics |= summary_metrics(f"heldout/{name}/{label}", held.report.as_dict(), held.delta.intervals() if held.delta else None)
    return metrics


def _importances(study: optuna.Study) -> dict[str, float]:
    """Parameter importance for PSI over the parameters every trial drew; kept on the study for the dashboard."""
    importances = param_importances(study)
    if importances:
        study.set_user_attr("psi_importance (parameters every trial drew)", {k: round(v, 4) for k, v in importances.items()})
    return importances
