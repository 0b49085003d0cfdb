"""Who runs a trial: each process marks the trials it runs, and the trials of a process that is gone are failed
and queued again, at once on this machine, by the heartbeat check elsewhere."""

from __future__ import annotations

import datetime
import logging
import os
import socket
import time
import warnings
from collections.abc import Sequence

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.trial import FrozenTrial, TrialState

from tuner.tuning.optuna_access import HeartbeatStorage, set_trial_state, storage_of, stored_trial
from tuner.tuning.storage import grace_seconds

log = logging.getLogger(__name__)

OWNER_ATTR = "owner"  # host, pid and number of the process running a trial: a dead local owner is found at once


def this_process() -> dict[str, object]:
    """This process as `OWNER_ATTR` names it: its host and pid."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def process_alive(pid: int) -> bool:
    """Whether process `pid` of this machine is still there."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fail_dead_trials(study: optuna.Study) -> list[int]:
    """RUNNING trials whose process is known to be gone, failed now and re-queued (like a stale heartbeat,
    without waiting for one); returns their numbers. Known gone: its owner is a process of this machine that
    has ended, or it has no owner mark a grace period after it started (`_orphaned`). Trials of live processes
    and of other machines' owners are left to the heartbeat check."""
    here = socket.gethostname()
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get(OWNER_ATTR)
        if owner is None:
            if not _orphaned(study, trial):
                continue
        elif owner.get("host") != here or owner.get("trial") != trial.number or owner.get("pid") == os.getpid():
            continue
        elif process_alive(int(owner["pid"])):
            continue
        try:
            if set_trial_state(study, trial, TrialState.FAIL):
                failed.append(trial)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another process got there first
    requeue(study, failed)
    for trial in failed:
        owner = trial.user_attrs.get(OWNER_ATTR)
        log.warning(
            "trial %d was left RUNNING by %s, which is gone; it is re-run",
            trial.number,
            f"process {owner['pid']}" if owner else "a process that stopped as it began the trial",
        )
    return [t.number for t in failed]


def _orphaned(study: optuna.Study, trial: FrozenTrial) -> bool:
    """Whether an ownerless RUNNING trial is a dead process's. A live posfair process marks its trial's owner
    within milliseconds of Optuna creating it (`run_trials`), and Optuna records no heartbeat before then, so
    a process killed in between leaves a trial that Optuna's stale check never fails. Its start is its last
    sign of life: older than the grace period, it is as stale as a heartbeat that old."""
    grace = grace_seconds(storage_of(study))
    if grace is None or trial.datetime_start is None:
        return False
    return datetime.datetime.now() - trial.datetime_start > datetime.timedelta(seconds=grace)


def requeue(study: optuna.Study, trials: Sequence[FrozenTrial]) -> None:
    """Queue failed trials again with what they had drawn (the storage's retry callback, as for stale ones)."""
    # a storage with heartbeats (`make_storage`; RDB: in Optuna's cache, which passes them on)
    storage = storage_of(study)
    retry = storage.get_heartbeat_stale_trial_callback() if isinstance(storage, HeartbeatStorage) else None
    for trial in trials:
        if retry is not None:
            retry(study, stored_trial(study, trial))


def wait_for_other_processes(study: optuna.Study, poll_seconds: float, announce: bool) -> None:
    """One wait for the trials running in other processes (saying so first when `announce`): sleep a poll, then
    fail and re-queue those whose process is gone here (`fail_dead_trials`) or whose heartbeat stopped."""
    if announce:
        log.info(
            "waiting for %d trial(s) running in other processes",
            len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))),
        )
    time.sleep(poll_seconds)
    fail_dead_trials(study)
    with warnings.catch_warnings():  # marked experimental; Optuna's own trial loop calls it the same way
        warnings.simplefilter("ignore", ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
