"""Running trials: what every process working on a study does, the coordinating `tune` and its workers alike.

A worker (`tune --worker`, or a local process the coordinator spawns) waits for the coordinator's HM
floor, then draws and runs trials until the study has enough; it never concludes the study.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.process
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.common.scratch import scratch_dir
from tuner.common.trials import complete_trials
from tuner.data import PositionalDataset
from tuner.engine.models import LoadedModel
from tuner.evaluation.evaluator import Evaluator
from tuner.tracking.progress import StudyProgress
from tuner.tuning.objective import SideSet, TrialObjective
from tuner.tuning.search_space import trial_basket_shares
from tuner.tuning.session import FLOOR_ATTR, Session, prepare
from tuner.tuning.settings import TuneSettings
from tuner.tuning.study import TrialsEnd, make_storage, run_trials

log = logging.getLogger(__name__)


def run_as_worker(session: Session) -> None:
    """Run trials of a study another `tune` coordinates, once it has stored the HM floor."""
    settings = session.settings
    workers = start_workers(settings, settings.workers - 1)
    floor = _floor_set_by_coordinator(session.name, session.storage, settings.heartbeat)
    run_session_trials(session, floor, workers)


def run_session_trials(
    session: Session, floor: float, workers: list[multiprocessing.process.BaseProcess],
    conclude: Callable[[Path], object] | None = None,
) -> object:
    """Open the study's parent run, run trials until the study has enough, wait for the local `workers`,
    then `conclude(staging)` (the coordinator's last step) and return what it returns."""
    settings, study, tracker, model = session.settings, session.study, session.tracker, session.model
    evaluator, space, name, storage, tuning = session.evaluator, session.space, session.name, session.storage, session.tuning
    general, identity = session.general, session.identity
    tracker.start_study(
        name,
        params={**identity, "floor_value": floor, "trials": settings.trials, "storage": storage},
        tags={"posfair.model": model.spec.alias, "posfair.dataset": tuning.name},
        description=f"Study {name}: {settings.trials} trials tuning {model.spec.alias} on {tuning.name}; "
                    f"lowest PSI subject to HM >= {100 * floor:.2f} (--hm-floor {settings.hm_floor}).",
    )
    staging = scratch_dir()
    try:
        objective = TrialObjective(
            evaluator, space, replace(settings.constraints(0.0), hm_floor=floor), tracker, name, staging,
            pareto=settings.pareto, general=_side_set(model, settings, general, cache_budget=0),  # short documents
            crops=_side_set(model, settings, session.crops, prefix_layers=evaluator.cache.prefix_layers,
                           cache_budget=settings.cache_budget),
            profile_docs=settings.profile_docs,
        )
        evaluator.show_progress = False  # the trial bar (on a terminal) and the per-trial lines take over
        with StudyProgress(settings.trials, len(complete_trials(study)), bar=not settings.worker, workers=settings.workers) as progress:
            ended = run_trials(study, objective, settings.trials, [partial(_log_trial, progress=progress)])
        for worker in workers:
            worker.join()
        if ended.short:
            _stop_short(ended, session)
        return conclude(staging) if conclude is not None else None
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
        tracker.flush()
        shutil.rmtree(staging, ignore_errors=True)


class StoppedEarlyError(RuntimeError):
    """The study ended short of its trials (Ctrl-C, too many failures): nothing is exported as if complete."""

    def __init__(self, message: str, interrupted: bool) -> None:
        super().__init__(message)
        self.interrupted = interrupted


def _stop_short(ended: TrialsEnd, session: Session) -> None:
    """Say that the study ended short, mark the MLflow parent run, and end with an error: no export."""
    why = "interrupted" if ended.stopped == "interrupted" else f"{ended.failures} trials of this run failed"
    requeued = f"; trial {ended.requeued} was aborted and is queued to run again" if ended.requeued is not None else ""
    message = (f"stopped early ({why}): {ended.complete} of {ended.target} trials complete{requeued}; nothing exported. "
               f"Run the same command again to resume, or `tune export --study-name {session.name}` to export the winner so far")
    if not session.settings.worker:
        session.tracker.finish_study({"complete_trials": ended.complete}, [],
                                     {"posfair.outcome": f"stopped early ({why}): {ended.complete} of {ended.target} trials"},
                                     "KILLED" if ended.stopped == "interrupted" else "FAILED")
    raise StoppedEarlyError(message, interrupted=ended.stopped == "interrupted")


def _floor_set_by_coordinator(name: str, storage: str, heartbeat: int, timeout: float = 3600.0) -> float:
    """A worker waits until the coordinating `tune` has measured the baseline and stored the floor."""
    deadline = time.monotonic() + timeout
    while FLOOR_ATTR not in (attrs := optuna.load_study(study_name=name, storage=make_storage(storage, heartbeat)).user_attrs):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no coordinator set the HM floor of study {name!r}; start `tune` without --worker first")
        time.sleep(2)
    return float(attrs[FLOOR_ATTR])


def start_workers(settings: TuneSettings, count: int) -> list[multiprocessing.process.BaseProcess]:
    """Extra local worker processes on the same study (each loads its own model)."""
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_work, args=(replace(settings, workers=1, worker=True, worker_id=str(i + 1)),), daemon=False)
               for i in range(count)]
    for worker in workers:
        worker.start()
    return workers



def _work(settings: TuneSettings) -> None:
    quiet_libraries()
    logging.basicConfig(level=logging.INFO, format="[worker %(process)d] %(message)s", force=True)
    run_as_worker(prepare(settings))


def quiet_libraries() -> None:
    """Keep the log to posfair's own lines: no load reports, progress bars or library chatter."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for noisy in ("mlflow", "alembic", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)



def _log_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial, progress: StudyProgress) -> None:
    """One readable line per finished trial, with the study's progress (k/N, best so far, elapsed, ETA)."""
    if trial.state == TrialState.COMPLETE:
        attrs = trial.user_attrs
        truncated = int(attrs.get("metrics", {}).get("truncated_documents", 0))
        log.info(
            "trial %d: PSI %.3f ± %.3f  ΔnDCG@10 %+.2f  drift %.4f  %s  (%s)  %.0f s%s", trial.number,
            attrs["psi"], attrs.get("psi_se", 0.0), 100 * attrs["metrics"].get("ndcg10_delta", 0.0), attrs.get("drift", 0.0),
            attrs.get("feasible", "").partition(": ")[2] or f"HM {100 * attrs['hm']:.2f}",
            ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                      for k, v in {**trial.params, "basket_shares": trial_basket_shares(trial)}.items()),
            trial.duration.total_seconds() if trial.duration else 0.0,
            f"  {truncated} passages truncated" if truncated else "",
        )
        log.info("trial %d/%d complete · %s", min(len(complete_trials(study)), progress.total), progress.total, progress.status(study))
    elif not trial.user_attrs.get("surplus"):
        log.warning("trial %d %s: %s", trial.number, trial.state.name, trial.user_attrs.get("failure_reason", "interrupted"))
        log.info("trials %d/%d complete · %s", min(len(complete_trials(study)), progress.total), progress.total, progress.status(study))


def _side_set(model: LoadedModel, settings: TuneSettings, dataset: PositionalDataset | None, **cache: Any) -> SideSet | None:
    """A set scored beside the tuning split every trial, with its uncalibrated report measured once."""
    if dataset is None:
        return None
    evaluator = Evaluator(model, dataset, settings.batch_size, batch_tokens=settings.batch_tokens, **cache)
    return SideSet(evaluator, evaluator.run(None).report)