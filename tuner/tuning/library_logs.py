"""The libraries' logs kept to posfair's own lines: no load reports, progress bars or chatter, and no traceback for a
stop or for a file or database that went away under the run."""

from __future__ import annotations

import logging
import threading

import optuna

from tuner.common.messages import first_line
from tuner.common.trials import NotRun

log = logging.getLogger(__name__)


def quiet_libraries() -> None:
    """Keep the log to posfair's own lines: no load reports, progress bars or library chatter."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for handler in logging.getLogger("optuna").handlers:  # a stop or a lost store is said in one line, not a traceback
        handler.addFilter(_no_traceback_for_the_environment)
    threading.excepthook = _thread_error  # Optuna's heartbeat thread writing into a deleted store, say
    for noisy in ("mlflow", "alembic", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # SQLAlchemy logs at ERROR only the cleanup failures it swallows (a cursor whose close a stop interrupted, with
    # a traceback); every failure that matters is raised, and a garbage-collected connection also warns
    logging.getLogger("sqlalchemy").setLevel(logging.CRITICAL)
    # MLflow's SQL store logs a failed write's traceback and SQL before it raises; posfair says it in one line
    logging.getLogger("mlflow.store.db.utils").addFilter(_not_a_lost_store)


def _environment_lost(error: BaseException | None) -> bool:
    """A file or database that went away under the run (not a bug), also as the cause of what a library raised
    (Optuna wraps it in StorageInternalError): said in one line, without a traceback."""
    import sqlalchemy.exc

    while error is not None:
        if isinstance(error, (OSError, sqlalchemy.exc.OperationalError)):
            return True
        error = error.__cause__
    return False


def _thread_error(args: threading.ExceptHookArgs) -> None:
    """A background thread's lost file or database in one line; anything else as Python prints it."""
    if _environment_lost(args.exc_value):
        name = args.thread.name if args.thread is not None else "a background thread"
        log.warning("%s stopped: %s", name, first_line(args.exc_value) or repr(args.exc_value))
        return
    threading.__excepthook__(args)


def _not_a_lost_store(record: logging.LogRecord) -> bool:
    """Drop a library's log of a file or database that went away under the run (it raises that error too)."""
    return not (record.exc_info and _environment_lost(record.exc_info[1]))


def _no_traceback_for_the_environment(record: logging.LogRecord) -> bool:
    """Optuna logs a failed trial's traceback. A stop (Ctrl-C, SIGTERM) or a file or database that went away
    under the run is not a bug: its one line (with the error) is enough, and posfair says the cause and the fix.
    A trial that was never run (`NotRun`, recorded FAIL) did not fail: posfair says why it did not run, and Optuna's
    line is dropped. Any other error keeps its traceback."""
    if record.exc_info and isinstance(record.exc_info[1], NotRun):
        return False
    if record.exc_info and (isinstance(record.exc_info[1], KeyboardInterrupt) or _environment_lost(record.exc_info[1])):
        record.exc_info = None
    return True
