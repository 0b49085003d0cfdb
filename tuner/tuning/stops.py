"""Stopping a run: Ctrl-C or SIGTERM finishes the running trial, then stops; a second signal, or the end of the
grace period after SIGTERM, aborts it, never inside a database write."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import optuna

from tuner.common.options import env_seconds

log = logging.getLogger(__name__)


STOP_GRACE_SECONDS = 20.0
"""After SIGTERM, how long the running trial may take to finish before it is aborted and queued again
(`POSFAIR_STOP_GRACE` overrides it): Slurm and Kubernetes send SIGKILL 30 s after SIGTERM by default."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's stop) outside the trial loop: unwound like Ctrl-C, but named for what it was."""


def stop_grace() -> float:
    """The grace period after SIGTERM, in seconds (`POSFAIR_STOP_GRACE`, else `STOP_GRACE_SECONDS`)."""
    return env_seconds("POSFAIR_STOP_GRACE", STOP_GRACE_SECONDS)


DATABASE_MODULES = ("sqlalchemy", "psycopg", "psycopg2", "pymysql", "sqlite3", "alembic", "optuna.storages")
"""Code that a stop must not interrupt: an exception raised inside a write breaks it (CI, PostgreSQL: inside
psycopg's ping), and Optuna then records a failed trial with a traceback instead of an abort."""

STOP_RETRY_SECONDS = 0.05  # how soon a stop that arrived inside a database call is tried again


def _in_database_call(frame: FrameType | None) -> bool:
    """Whether the interrupted code is, at any depth, inside a database driver or Optuna's storage."""
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if any(module == name or module.startswith(f"{name}.") for name in DATABASE_MODULES):
            return True
        frame = frame.f_back
    return False


def _raise_outside_database(error: type[KeyboardInterrupt], frame: FrameType | None) -> None:
    """Raise `error` where the signal interrupted the process, unless that is inside a database call: then
    try again shortly (SIGALRM), so the call completes and the stop lands after it."""
    if _in_database_call(frame):
        signal.signal(signal.SIGALRM, lambda signum, later: _raise_outside_database(error, later))
        signal.setitimer(signal.ITIMER_REAL, STOP_RETRY_SECONDS)
        return
    raise error


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM handler for the rest of a run: stop as Ctrl-C would (outside a database call)."""
    _raise_outside_database(Terminated, frame)


@contextmanager
def stop_after_current_trial(study: optuna.Study) -> Iterator[Callable[[], str | None]]:
    """Ctrl-C or SIGTERM: finish the running trial, then stop. A second signal aborts the trial at once (once
    out of a database call), and after SIGTERM so does the end of the grace period (`stop_grace`), before the
    scheduler's SIGKILL. The callable says what was asked: None, "interrupted" (SIGINT) or "terminated" (SIGTERM)."""
    requested: str | None = None

    def abort(signum: int, frame: FrameType | None) -> None:
        _raise_outside_database(KeyboardInterrupt, frame)

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal requested
        if requested:
            abort(signum, frame)
            return
        if signum == signal.SIGTERM:
            requested = "terminated"
            grace = stop_grace()
            log.warning(
                "SIGTERM: finishing the current trial within %g s, then stopping (after that it is aborted and "
                "queued to run again)",
                grace,
            )
            signal.signal(signal.SIGALRM, abort)
            signal.setitimer(signal.ITIMER_REAL, max(grace, 1e-3))
        else:
            requested = "interrupted"
            log.warning("interrupt: finishing the current trial, then stopping (Ctrl-C again to abort now)")

    try:
        previous = {number: signal.signal(number, handler) for number in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: leave signals alone
        yield lambda: None
        return
    alarm = signal.getsignal(signal.SIGALRM)
    try:
        yield lambda: requested
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, alarm)
        for number, action in previous.items():
            signal.signal(number, action)
