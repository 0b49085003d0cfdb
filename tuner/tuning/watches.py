"""What a running study watches besides its trials: its local stores (one deleted under the run stops it with the
cause) and its local workers (one that dies is said at once, and its trial failed and queued again)."""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.process
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner.common.messages import UserError
from tuner.tracking.store import local_store
from tuner.tuning.owners import OWNER_ATTR, fail_dead_trials
from tuner.tuning.session import Session
from tuner.tuning.storage import storage_file

log = logging.getLogger(__name__)


class StoreLostError(UserError, RuntimeError):
    """A local store (the study database, MLflow's) was deleted while the study ran: nothing more can be recorded."""


def local_stores(session: Session) -> dict[Path, int]:
    """The study's files (Optuna's SQLite database or journal, MLflow's SQLite store) with their inodes, watched
    while trials run."""
    stores = [storage_file(session.storage), local_store(session.tracker.uri)]
    return {store.resolve(): store.stat().st_ino for store in stores if store is not None and store.exists()}


def require_stores(stores: dict[Path, int], trial: int | None) -> None:
    """After each trial, and when the storage fails: a store deleted under the run (`rm -rf mlruns/`) stops it
    with the cause, not with what Optuna or MLflow say about the empty database they create in its place."""
    for store, inode in stores.items():
        try:
            same = store.stat().st_ino == inode
        except FileNotFoundError:
            same = False
        if not same:
            raise StoreLostError(
                f"{store} was deleted while the study ran (was {store.parent.name}/ removed?), so nothing more can be "
                f"recorded; stopped{f' after trial {trial}' if trial is not None else ''}. Restore it (from a backup "
                "or the trash) and run the same command again to resume, or start afresh in an empty folder"
            ) from None


def watch_workers(workers: list[multiprocessing.process.BaseProcess], study: optuna.Study) -> Callable[[], None]:
    """Say at once when a local worker ends other than normally (which one, its pid, its signal or exit code, the
    trial it ran) and fail and re-queue that trial (`fail_dead_trials`), rather than leave it to the heartbeat
    check; returns the call that stops watching (before the workers are stopped on purpose)."""
    stopped = threading.Event()

    def watch() -> None:
        alive = {worker.sentinel: (number, worker) for number, worker in enumerate(workers, start=1)}
        while alive and not stopped.is_set():
            for sentinel in multiprocessing.connection.wait(list(alive), timeout=0.5):
                number, worker = alive.pop(sentinel)  # type: ignore[arg-type]
                worker.join(5)  # reaped (its pipe closes a moment before it can be): a zombie would count as alive
                if stopped.is_set() or not worker.exitcode:
                    continue
                code = worker.exitcode or 0
                how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                running = [
                    t.number
                    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                    if (t.user_attrs.get(OWNER_ATTR) or {}).get("pid") == worker.pid
                ]
                ran = f" while it ran trial {running[0]}" if running else " between trials"
                log.warning("local worker %d (pid %s) %s%s; the study goes on without it", number, worker.pid, how, ran)
                fail_dead_trials(study)

    thread = threading.Thread(target=watch, name="worker-watch", daemon=True)
    if workers:
        thread.start()

    def stop() -> None:
        stopped.set()
        if thread.is_alive():
            thread.join()

    return stop
