"""The study's storage, opened safely by many processes at once: Optuna's RDB storage (SQLite, PostgreSQL,
MySQL) or its journal file (`journal:PATH`, for a shared file system without a database server), both with
heartbeats.

A killed worker's trial is found by its silent heartbeat, failed and re-queued; workers that start together on
a new database race to create Optuna's tables (the loser retries); on SQLite every transaction takes the write
lock at BEGIN, so two processes never claim one queued trial. A journal is an append-only log that every
process replays: Optuna settles a claim of a queued trial by the order of the lines (the first claim wins), and
posfair adds the heartbeats Optuna's journal lacks (`JournalWithHeartbeats`). Kept apart from the study's loop
so that what only opens a storage imports no model code.

A journal is read through before Optuna opens it (`check_journal`): Optuna appends after a last line it cannot
read (a writer killed mid-append leaves one), and then cannot replay the study at all. Such a line is named
with the command that cuts it off; posfair does not cut it itself, since the journal is the user's store and a
writer on another machine may still be finishing that line when its lock says otherwise.

SQLite waits silently for a lock another process holds (a `sqlite3` shell or a database browser with a
transaction open): a wait is said after a few seconds, with the file, and given up after `sqlite_wait()`
seconds with what to do (`StoreLockedError`); a full disk is said with the file and the fix (`StoreFullError`).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import BaseStorage, JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
from optuna.trial import TrialState

from tuner.common.files import JOURNAL, OPTUNA_DB, sqlite_file, storage_file
from tuner.common.messages import UserError, causes, database_locked, disk_full, first_line, root_cause
from tuner.common.options import HEARTBEAT_SECONDS, env_seconds
from tuner.common.recognise import JOURNAL_ENTRY_START, is_sqlite, journal_entry
from tuner.common.stores import OPTUNA, require_own_database
from tuner.tuning.optuna_access import HeartbeatStorage, trial_id

SCHEMA_ATTEMPTS = 5
SQLITE_WAIT_SECONDS = 60.0  # how long a process waits for another's write lock on a SQLite study (POSFAIR_SQLITE_WAIT)
LOCK_NOTICE_SECONDS = 5.0  # a wait this long (at most half the limit) is said
GRACE_HEARTBEATS = 3  # a trial silent for this many heartbeats is stale: failed and re-queued
RETRIES = 2  # how often a stale trial is queued again
JOURNAL_LOCK_SECONDS = 30  # a journal lock left this long by a writer killed mid-write is broken (Optuna's default)
HEARTBEAT_ATTR = "posfair:heartbeat"  # a journal trial's last heartbeat (a system attribute)
JOURNAL_POLL_SECONDS = 0.1  # how often a line another process is still writing is looked at again
LOCK_SUFFIX = ".lock"  # Optuna's symbolic-link lock beside the journal (`JournalFileSymlinkLock`)
EXAMPLES = (
    "sqlite:///mlruns/optuna.db, postgresql://user:pass@host/db, mysql://user:pass@host/db or "
    "journal:/shared/study.journal"
)

log = logging.getLogger(__name__)


class StoreLockedError(UserError, RuntimeError):
    """The study database stayed locked by another process past the time limit."""


class StoreFullError(UserError, RuntimeError):
    """The study database's disk is full: nothing more can be recorded."""


class JournalDamagedError(UserError, ValueError):
    """A study journal holds a line Optuna cannot replay; the message names it and the command that recovers."""


def sqlite_wait() -> float:
    """Seconds to wait for another process's lock on a SQLite study database (`POSFAIR_SQLITE_WAIT`, else 60)."""
    return env_seconds("POSFAIR_SQLITE_WAIT", SQLITE_WAIT_SECONDS, least=0.1)


def storage_error(error: BaseException, url: str) -> UserError | None:
    """What a failed statement means for the user, when the machine rather than posfair is the cause: the study
    database's disk is full, or another process kept it locked past the limit; None otherwise (also for a full
    disk that a database did not report: another file's)."""
    if not machine_fault(error):
        return None
    where = f"the study database {sqlite_file(url) or url}"
    if disk_full(error):
        return StoreFullError(
            f"{where} is on a full disk ({root_cause(error)}); nothing more can be recorded. Free space on its disk, "
            "then run the same command again to resume: the finished trials are kept"
        )
    if database_locked(error):
        database = sqlite_file(url)
        return StoreLockedError(
            f"{where} stayed locked by another process for {sqlite_wait():g} s; finish or close what holds it "
            f"(a sqlite3 shell or a database browser with a transaction open, say; `fuser {database}` names the "
            "process), then run the same command again. POSFAIR_SQLITE_WAIT sets the wait in seconds"
        )
    return None


def machine_fault(error: BaseException) -> bool:
    """Whether a database reported a full disk or gave up on a lock along `error`'s causes (`storage_error`)."""
    from optuna.exceptions import StorageInternalError

    from_a_database = any(
        isinstance(e, (sqlalchemy.exc.SQLAlchemyError, StorageInternalError, sqlite3.Error)) for e in causes(error)
    )
    return from_a_database and (disk_full(error) or database_locked(error))


class _LockWatch:
    """Says once when a statement on a SQLite study database has waited `notice` seconds: SQLite itself waits
    without a word, up to the connection's timeout. One daemon thread watches every waiting statement."""

    def __init__(self) -> None:
        self._waiting: dict[int, tuple[float, Path]] = {}  # by thread: since when, on which file
        self._said: set[tuple[int, float]] = set()
        self._guard = threading.Lock()
        self._busy = threading.Event()  # set while a statement runs: the thread sleeps otherwise
        self._thread: threading.Thread | None = None

    def start(self, database: Path) -> None:
        with self._guard:
            self._waiting[threading.get_ident()] = (time.monotonic(), database)
            self._busy.set()
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="sqlite-lock-watch", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        with self._guard:
            self._waiting.pop(threading.get_ident(), None)

    def _watch(self) -> None:
        while self._busy.wait():
            time.sleep(0.1)
            limit = sqlite_wait()
            notice = min(LOCK_NOTICE_SECONDS, limit / 2)
            with self._guard:
                if not self._waiting:
                    self._busy.clear()
                late = [
                    (key, since, file)
                    for key, (since, file) in self._waiting.items()
                    if time.monotonic() - since >= notice
                ]
            for key, since, database in late:
                if (key, since) not in self._said:
                    self._said.add((key, since))
                    log.warning(
                        "%s is locked by another process: waited %g s so far, giving up after %g s "
                        "(`fuser %s` names it)",
                        database,
                        notice,
                        limit,
                        database,
                    )


_LOCK_WATCH = _LockWatch()


def _watch_waits(engine: sqlalchemy.engine.Engine, database: Path) -> None:
    """Every statement on `engine` is watched while it runs (`_LockWatch`)."""

    @sqlalchemy.event.listens_for(engine, "before_cursor_execute")
    def _started(*_: Any) -> None:
        _LOCK_WATCH.start(database)

    @sqlalchemy.event.listens_for(engine, "after_cursor_execute")
    def _ended(*_: Any) -> None:
        _LOCK_WATCH.stop()

    @sqlalchemy.event.listens_for(engine, "handle_error")
    def _failed(*_: Any) -> None:
        _LOCK_WATCH.stop()


def _wait_for_the_write_lock(database: Path) -> None:
    """Before Optuna opens an existing SQLite study database: take its write lock once (and let it go), waiting as
    every statement does, so a lock another process holds is said, and given up on, before any work."""
    if not database.is_file():
        return
    connection = sqlite3.connect(database, timeout=sqlite_wait(), isolation_level=None)
    _LOCK_WATCH.start(database)
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("ROLLBACK")
    except sqlite3.OperationalError as error:
        explained = storage_error(error, f"sqlite:///{database}")
        if explained is None:
            raise
        raise explained from None
    finally:
        _LOCK_WATCH.stop()
        connection.close()


def default_storage(database: Path = OPTUNA_DB) -> str:
    """The default study database (created, with its folder, when the study is first opened)."""
    return f"sqlite:///{database.resolve()}"


def check_storage_url(url: str) -> None:
    """A malformed storage URL, MLflow's store, or a SQLite file another process keeps locked fails at once,
    before any work, without creating a database."""
    if url.startswith(JOURNAL):
        _check_journal(url)
        return
    try:
        sqlalchemy.engine.make_url(url).get_dialect()
    except Exception as error:  # noqa: BLE001 - sqlalchemy raises many kinds for a bad URL
        raise _unusable_storage(url, error) from None
    require_own_database(url, OPTUNA)
    database = sqlite_file(url)
    if database is not None:
        _wait_for_the_write_lock(database)


def _check_journal(url: str) -> None:
    """`journal:PATH` names a file (not a folder, not a SQLite database) that is empty, missing (it is made), or a
    journal every line of which Optuna can replay (`check_journal`)."""
    path = storage_file(url)
    if path is None:
        raise _unusable_storage(url, ValueError("no file named after 'journal:'"))
    if path.is_dir():
        raise _unusable_storage(
            url, ValueError(f"{path} is a folder; name a file in it, e.g. journal:{path / 'study.journal'}")
        )
    if path.is_file() and path.stat().st_size:
        if is_sqlite(path):
            raise ValueError(
                f"study storage {url!r}: {path} is a SQLite database, not a journal; use sqlite:///{path.resolve()}"
            )
        check_journal(url, path)


def check_journal(url: str, path: Path) -> None:
    """Every line of the journal at `path` is an entry Optuna can replay, ending in a line break, except a last
    line another process is still appending (it holds the journal's lock, and the lock is not stale: Optuna
    breaks a lock left `JOURNAL_LOCK_SECONDS`). Else the first line that is not is named, with the command that
    recovers the study; a first line that is no entry means the file is no journal."""
    lines, offset, damaged = _first_unreadable_line(path)
    while damaged is not None and not damaged.endswith(b"\n") and _being_written(path, offset + len(damaged)):
        time.sleep(JOURNAL_POLL_SECONDS)
        lines, offset, damaged = _first_unreadable_line(path)
    if damaged is None:
        return
    number = lines + 1
    if number == 1 and not damaged.startswith(JOURNAL_ENTRY_START):
        not_one = ValueError(f"{path} is not an Optuna journal (its first line is no journal entry)")
        raise _unusable_storage(url, not_one)
    kept = f"every trial in the {lines} line{'s' if lines != 1 else ''} before it"
    where = f"study journal {path}:{number}"
    if not damaged.endswith(b"\n"):
        lock = Path(f"{path}{LOCK_SUFFIX}")
        unlock = f" && rm {lock}" if lock.is_symlink() else ""
        raise JournalDamagedError(
            f"{where}: its last line ends without a line break, which a writer killed while appending leaves: that "
            f"entry never became part of the study. Cut it off to recover {kept}: "
            f"`truncate -s {offset} {path}{unlock}` (copy the file first to keep it), then run the same command again"
        )
    total = lines + 1 + sum(1 for _ in _lines_after(path, offset + len(damaged)))
    if number == total:
        raise JournalDamagedError(
            f"{where}: its last line is not a journal entry ({_why(damaged)}), so the study cannot be read past it. "
            f"Cut it off to recover {kept}: `truncate -s {offset} {path}` (copy the file first to keep it), then run "
            "the same command again"
        )
    raise JournalDamagedError(
        f"{where}: line {number} of {total} is not a journal entry ({_why(damaged)}), so Optuna cannot replay the "
        f"study past it. Delete that line: `sed -i '{number}d' {path}` (copy the file first to keep it), then run the "
        "same command again; if the journal then fails at another line, restore it from a copy"
    )


def _first_unreadable_line(path: Path) -> tuple[int, int, bytes | None]:
    """(whole lines before it, their bytes, the line) for the first line that is not a journal entry ending in a
    line break; (lines, bytes, None) when every line is one."""
    lines = offset = 0
    with path.open("rb") as stream:
        for line in stream:
            if not line.endswith(b"\n") or not journal_entry(line):
                return lines, offset, line
            lines, offset = lines + 1, offset + len(line)
    return lines, offset, None


def _lines_after(path: Path, offset: int) -> Iterator[bytes]:
    with path.open("rb") as stream:
        stream.seek(offset)
        yield from stream


def _being_written(path: Path, size: int) -> bool:
    """Whether another process may still be appending to the journal, which ends in an unfinished line at `size`
    bytes: the file has grown since, or a writer holds the lock and the file changed within the lock's grace."""
    try:
        now = path.stat()
    except FileNotFoundError:
        return False
    lock = Path(f"{path}{LOCK_SUFFIX}")
    return now.st_size != size or (lock.is_symlink() and time.time() - now.st_mtime <= JOURNAL_LOCK_SECONDS)


def _why(line: bytes) -> str:
    """What is wrong with a line that is no journal entry, in a few words."""
    try:
        entry = json.loads(line)
    except ValueError as error:
        return f"not JSON: {first_line(error)}"
    return "a JSON object without an op_code" if isinstance(entry, dict) else f"JSON, but a {type(entry).__name__}"


def _unusable_storage(url: str, error: BaseException) -> ValueError:
    """What a storage URL that cannot be opened is told: the cause's first line and what a URL looks like."""
    cause = first_line(error)
    return ValueError(f"cannot open study storage {url!r}{f': {cause}' if cause else ''}. Use e.g. {EXAMPLES}")


def make_storage(url: str, heartbeat: int = HEARTBEAT_SECONDS) -> BaseStorage:
    """Open a study storage with heartbeats, so that a killed worker's trial is failed and retried.

    Workers starting together on a new database race to create Optuna's tables; the loser retries. MLflow's
    store is refused before anything is written to it. A SQLite storage takes its write lock at the start of
    every transaction, so two processes never take the same queued trial.

    Args:
        url: `sqlite:///PATH`, a database server's URL (`postgresql://USER:PASS@HOST/DB`, `mysql+pymysql://…`),
            or `journal:PATH` for a file system that machines share without a database server.
        heartbeat: Seconds between a running trial's heartbeats.

    Returns:
        Optuna's `RDBStorage`, or its `JournalStorage` with heartbeats of posfair's own.

    Raises:
        ValueError: The URL cannot be opened, or names MLflow's store, a read-only file or folder, a folder, or
            a file that is no journal (the message shows what a URL looks like).
        JournalDamagedError: A journal holds a line Optuna cannot replay; the message names it and how to
            recover the study.
        StoreLockedError: Another process keeps the SQLite database locked past `POSFAIR_SQLITE_WAIT` seconds.
        StoreFullError: The database's disk is full.
    """
    if url.startswith(JOURNAL):
        _check_journal(url)
    else:
        require_own_database(url, OPTUNA)
    store = storage_file(url)
    database = sqlite_file(url)
    if store is not None:  # SQLite and the journal create their file, not its folder
        store.parent.mkdir(parents=True, exist_ok=True)
        for path in (
            store,
            store.parent,
        ):  # both write beside the file (SQLite's journal, the journal's lock): both must be writable
            if path.exists() and not os.access(path, os.W_OK):
                raise ValueError(
                    f"study storage {path} is read-only{' (its folder)' if path != store else ''}, so no trial "
                    f"could be recorded; make it writable (chmod u+w {path}) or choose another --storage"
                )
    if url.startswith(JOURNAL) and store is not None:  # checked: a journal names its file
        return _journal_storage(url, store, heartbeat)
    if database is not None:
        _wait_for_the_write_lock(database)
    attempt = 0
    while True:
        try:
            with warnings.catch_warnings():  # heartbeats and the retry callback are marked experimental
                warnings.simplefilter("ignore", ExperimentalWarning)
                storage = RDBStorage(
                    url,
                    heartbeat_interval=heartbeat,
                    grace_period=GRACE_HEARTBEATS * heartbeat,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=RETRIES),
                    engine_kwargs={
                        "pool_pre_ping": True,
                        **({"connect_args": {"timeout": sqlite_wait()}} if url.startswith("sqlite") else {}),
                    },
                )
                if url.startswith("sqlite"):
                    _take_the_write_lock_first(storage.engine)
                if database is not None:
                    _watch_waits(storage.engine, database)
                return storage
        except Exception as error:  # noqa: BLE001 - sqlalchemy raises many kinds for a bad URL
            explained = storage_error(error, url)
            if explained is not None:
                raise explained from None
            attempt += 1
            racing = any(sign in str(error) for sign in ("already exists", "duplicate key", "UNIQUE constraint failed"))
            if not racing or attempt == SCHEMA_ATTEMPTS:
                raise _unusable_storage(url, error) from None
            time.sleep(attempt)


def _take_the_write_lock_first(engine: sqlalchemy.engine.Engine) -> None:
    """Open every SQLite transaction with BEGIN IMMEDIATE. Optuna claims a queued trial by reading its state and
    then writing RUNNING, under SELECT ... FOR UPDATE, which SQLite ignores: two processes could both read
    WAITING and both run the trial (docs/scaling.md, *Study storages*). Taking the write lock at BEGIN makes the
    read and the write one step."""

    @sqlalchemy.event.listens_for(engine, "connect")
    def _no_implicit_begin(connection: Any, _record: Any) -> None:
        connection.isolation_level = None  # the driver's own deferred BEGIN would come first

    @sqlalchemy.event.listens_for(engine, "begin")
    def _begin_immediate(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened while the tables were made predate the listeners


def grace_seconds(storage: BaseStorage) -> float | None:
    """How long a running trial may stay silent before it counts as dead (None: a storage without heartbeats)."""
    if isinstance(storage, JournalWithHeartbeats):
        return storage.grace_seconds
    interval = storage.get_heartbeat_interval() if isinstance(storage, HeartbeatStorage) else None
    return None if interval is None else GRACE_HEARTBEATS * interval


def _journal_storage(url: str, path: Path, heartbeat: int) -> JournalWithHeartbeats:
    """The journal at `path`, locked by a symbolic link beside it (`PATH.lock`): the lock Optuna documents for
    every NFS version (its open-file lock needs NFSv3 or later), and the one optuna-dashboard takes too."""
    lock = JournalFileSymlinkLock(str(path), grace_period=JOURNAL_LOCK_SECONDS)
    try:
        return JournalWithHeartbeats(JournalFileBackend(str(path), lock), heartbeat)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:  # a line Optuna cannot replay
        raise _unusable_storage(
            url, ValueError(f"{path} is not an Optuna journal ({first_line(error) or type(error).__name__})")
        ) from None


class JournalWithHeartbeats(JournalStorage, HeartbeatStorage):
    """Optuna's journal storage with the heartbeats of its RDB storage (Optuna's journal has none).

    A beat is a trial system attribute holding the trial's id and the writer's clock, an operation every reader
    of the journal replays (optuna-dashboard too); a trial re-queued with its attributes carries an old beat
    under its old id, which does not count for it. Age is measured on the reader's clock, so the machines'
    clocks must agree to well within the grace period (NTP), as Optuna's start times already assume.

    A writer killed while it holds the journal's lock stops every write, beats included, until the lock is broken
    (`JOURNAL_LOCK_SECONDS`): so a trial is stale only once it has been silent for longer than that and a beat.
    """

    def __init__(self, backend: JournalFileBackend, heartbeat: int) -> None:
        super().__init__(backend)
        self._heartbeat = heartbeat
        self.grace_seconds = max(GRACE_HEARTBEATS * heartbeat, JOURNAL_LOCK_SECONDS + heartbeat)
        with warnings.catch_warnings():  # the retry callback is marked experimental
            warnings.simplefilter("ignore", ExperimentalWarning)
            self._retry = RetryHeartbeatStaleTrialCallback(max_retry=RETRIES)

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, {"trial_id": trial_id, "at": time.time()})
        except UpdateFinishedTrialError:
            pass  # another process failed it meanwhile (its heartbeat looked stale): the trial loop finds out

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        now = time.time()
        stale = []
        for trial in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            beat = trial.system_attrs.get(HEARTBEAT_ATTR)
            if beat and beat["trial_id"] == trial_id(trial) and now - beat["at"] > self.grace_seconds:
                stale.append(trial_id(trial))
        return stale

    def get_heartbeat_interval(self) -> int:
        return self._heartbeat

    def get_heartbeat_stale_trial_callback(self) -> RetryHeartbeatStaleTrialCallback:
        return self._retry
