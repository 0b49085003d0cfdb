"""Running trials: what every process working on a study does, the coordinating `tune` and its workers alike.

A worker (`tune --worker`, or a local process the coordinator spawns) waits for the coordinator's HM
floor, then draws and runs trials until the study has enough; it never concludes the study.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.process
import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

from tuner.common.budget import study_budget
from tuner.common.scratch import scratch_dir
from tuner.common.trials import SETUP_COST_ATTR, finished
from tuner.tracking.progress import StudyProgress
from tuner.tuning.objective_setup import build_objective, trial_allowance
from tuner.tuning.parent_run import start_parent_run
from tuner.tuning.progress_log import log_trial
from tuner.tuning.session import Session
from tuner.tuning.stopped_early import stop_short
from tuner.tuning.stops import Terminated
from tuner.tuning.storage import storage_error
from tuner.tuning.study_loop import TrialsEnd, run_trials
from tuner.tuning.trial.objective import TrialObjective
from tuner.tuning.watches import local_stores, require_stores, watch_workers


def run_session_trials(
    session: Session,
    floor: float,
    workers: list[multiprocessing.process.BaseProcess],
    conclude: Callable[[Path], object] | None = None,
) -> object:
    """Open the study's parent run, run trials until the study has enough, wait for the local `workers`,
    then `conclude(staging)` (the coordinator's last step) and return what it returns."""
    study, settings = session.study, session.settings
    budget = study_budget(study)  # the coordinator's `--budget`, resolved (`estimate.resolve_budget`)
    constraints = replace(settings.constraints(0.0), hm_floor=floor)
    start_parent_run(session, constraints, budget)
    staging = scratch_dir()
    stop_watching = watch_workers(workers, study)
    try:
        objective = build_objective(session, constraints, staging)
        allowance = objective.pricing.allowance = trial_allowance(session, objective, budget)
        # per process: each one that encodes its baselines pays for them
        if setup := objective.scoring.setup_layer_tokens():
            study.set_user_attr(f"{SETUP_COST_ATTR}{socket.gethostname()}:{os.getpid()}:{time.time_ns()}", setup)
        ended = _run_with_progress(session, objective, allowance)
        _join_workers(ended, workers, stop_watching)
        if ended.short:
            stop_short(ended, session)
        return conclude(staging) if conclude is not None else None
    except KeyboardInterrupt as error:  # Ctrl-C or SIGTERM outside a trial (a side set's baseline, the conclusion)
        stop_short(
            TrialsEnd(
                len(finished(study)), settings.trials, "terminated" if isinstance(error, Terminated) else "interrupted"
            ),
            session,
        )
    finally:
        stop_watching()
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
        session.tracker.flush()
        shutil.rmtree(staging, ignore_errors=True)


def _run_with_progress(session: Session, objective: TrialObjective, allowance: int | None) -> TrialsEnd:
    """Run the trials under the progress bar and lines; a store deleted, full or locked is named as the cause."""
    settings, study, tracker = session.settings, session.study, session.tracker
    session.evaluator.show_progress = False  # the trial bar (on a terminal) and the per-trial lines take over
    with StudyProgress(
        settings.trials,
        len(finished(study)),
        bar=not settings.worker,
        workers=settings.workers,
        allowance=allowance,
        estimate=session.cost,
    ) as progress:
        stores = local_stores(session)
        try:
            return run_trials(
                study,
                objective,
                settings.trials,
                [
                    partial(log_trial, progress=progress, num_layers=session.model.num_layers, after=objective.after),
                    lambda s, trial: require_stores(stores, trial.number),
                ],
                allowance=allowance,
            )
        except (
            Exception
        ) as error:  # whatever the storage raised, a deleted store or a full or locked one is the cause to name
            require_stores(stores, None)
            explained = storage_error(error, session.storage)
            if explained is None:
                raise
            if not settings.worker:
                tracker.finish_study({}, [], {"posfair.outcome": f"stopped: {explained}"}, "FAILED")
            raise explained from None


def _join_workers(
    ended: TrialsEnd, workers: list[multiprocessing.process.BaseProcess], stop_watching: Callable[[], None]
) -> None:
    """Wait for the local workers to finish; a SIGTERM is passed on to them (a scheduler may have told only this
    process)."""
    if ended.stopped == "terminated":
        stop_watching()
        for worker in workers:
            worker.terminate()
    for worker in workers:
        worker.join()
    stop_watching()
