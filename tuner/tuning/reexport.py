"""`tune export`: a stored study's winner (or a trial the user chose) exported again, re-scored on every split, with
the model loaded exactly as the study loaded it."""

from __future__ import annotations

import logging
from pathlib import Path

import optuna

from tuner.common.trials import SELECTION_ATTR
from tuner.engine.models import hub_revision
from tuner.evaluation.evaluator import Evaluator
from tuner.tracking.runs import Tracker
from tuner.tuning.candidates import trial_by_number, winner
from tuner.tuning.conclusion import NoFeasibleTrialError
from tuner.tuning.heldout import summary_rows
from tuner.tuning.hm_floor import FLOOR_ATTR
from tuner.tuning.session import reload_tuned
from tuner.tuning.settings import EXPERIMENT, TuneSettings
from tuner.tuning.study import load_stored_study
from tuner.tuning.winner_export import Winning, export_and_close

log = logging.getLogger(__name__)


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
                "study %s records no selection rule (an older posfair ran it): one-se, tune's default; "
                "--selection chooses",
                study_name,
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
    rows = summary_rows(study, best, evaluator, heldout, settings)
    tracker.start_study(
        study_name, params=dict(attrs), tags={"posfair.model": model.spec.alias, "posfair.dataset": tuning.name}
    )
    floor = float(attrs.get(FLOOR_ATTR, float("nan")))
    path, _ = export_and_close(
        Winning(settings, model, study, best, rows, storage, tuning, chosen, tracker, floor), outcome="re-exported"
    )
    return path


def _require_made_by_tune(study_name: str, storage: str, attrs: dict[str, object]) -> None:
    """A study `tune` did not make (it lacks what `tune` records) cannot be exported."""
    lacking = [
        key
        for key in (
            "model_name",
            "pooling",
            "dataset_name",
            "seed",
            "hm_floor",
            "pareto",
            "revision",
            "dataset_fingerprint",
        )
        if key not in attrs
    ]
    if lacking:
        raise ValueError(
            f"study {study_name!r} in {storage} was not made by `tune` (it lacks {', '.join(lacking)}); "
            "only studies that `tune` ran can be exported"
        )


def _stored_settings(
    study: optuna.Study,
    storage: str,
    selection: str,
    *,
    output: Path | None,
    force: bool,
    tracking_uri: str,
    trust_remote_code: bool,
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
