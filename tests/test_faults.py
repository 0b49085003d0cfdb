"""Issue 24: a tuner run under a scheduler and beside itself, on real processes with real signals.

SIGTERM (what Slurm, Kubernetes and spot instances send) must stop a run as Ctrl-C does; two identical
`tune` commands on one fresh folder must export once. Each runs on SQLite and, where `.ci/run` provides
them, on PostgreSQL with an MLflow server (the helpers of tests/test_workers.py and tests/test_accounting.py);
SIGTERM also on an Optuna journal.
"""

from __future__ import annotations

import logging
import signal
import subprocess
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests import forkserver
from tests.test_accounting import BACKENDS, COMPLETE, FAIL, WAITING, catch_running, environment, parent_run, trials_of
from tests.test_study import write_dataset
from tests.test_workers import command, done, finished_trial_numbers, polled, study_backend, trial_runs
from tuner.tracking.registry import registered_name
from tuner.tuning.stops import stop_grace
from tuner.tuning.storage import sqlite_wait


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("faults") / "data", docs=10)


def assert_one_finished_run_per_complete_trial(storage: str, tracking: str, name: str) -> None:
    trials = trials_of(storage, name)
    assert finished_trial_numbers(tracking, name) == sorted(t.number for t in trials if t.state == COMPLETE)
    for run in trial_runs(tracking, name):
        number = int(run.data.tags["posfair.trial"])
        if (
            trials[number].state == optuna.trial.TrialState.PRUNED
        ):  # stopped at a rung: its figures there, marked pruned
            assert run.info.status == "FINISHED" and run.data.tags.get("posfair.state") == "PRUNED", (
                number,
                run.info.status,
            )
        elif trials[number].state != COMPLETE:  # an aborted trial's run is closed as failed, without a trial's metrics
            assert run.info.status in ("FAILED", "KILLED") and "psi" not in run.data.metrics, (number, run.info.status)


SIGTERM = (signal.SIGTERM, 143, "terminated by SIGTERM")
STOPS = [(backend, *stop) for backend in BACKENDS for stop in (SIGTERM, (signal.SIGINT, 130, "interrupted"))]
STOPS.append(("journal", *SIGTERM))  # a scheduler's stop of a task on a shared file system


@pytest.mark.parametrize(
    ("backend", "stop", "code", "reason"),
    STOPS,
    ids=[f"{'sigterm' if stop == signal.SIGTERM else 'ctrl-c'}-{backend}" for backend, stop, *_ in STOPS],
)
def test_one_stop_finishes_the_trial_says_so_exits_non_zero_exports_nothing_and_the_rerun_completes(
    backend: str, stop: signal.Signals, code: int, reason: str, tiny_model_dir, data: Path, tmp_path: Path
) -> None:
    """SIGTERM (a scheduler's stop) exited 143 with no message, left the trial and the parent run RUNNING and the
    temp folder behind; one Ctrl-C (issue 13, case 9) exported the winner of 2 of 4 trials, marked the parent
    FINISHED and exited 0. Both now stop alike."""
    storage, tracking, name = study_backend(backend, tmp_path)
    cmd = command(
        tiny_model_dir("bert"), data, storage, tracking, 5, "--output", str(tmp_path / "best.yaml"), name=name
    )
    run = forkserver.popen(
        cmd, cwd=tmp_path, env=environment(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    stopped = catch_running(run, storage, name, at_least=1)
    run.send_signal(stop)
    output = " ".join(run.communicate(timeout=300)[0].split())
    assert run.returncode == code, output[-3000:]
    trials = trials_of(storage, name)
    assert trials[stopped].state == COMPLETE  # the trial under way was finished (for SIGTERM: within the grace period)
    complete = sum(done(t) for t in trials)
    assert f"stopped early: {reason}; {complete} of 5 trials complete; nothing exported" in output
    assert "Traceback" not in output
    assert not (tmp_path / "best.yaml").exists()
    parent = parent_run(tracking, name)
    assert parent.info.status == "KILLED"
    assert parent.data.tags["posfair.outcome"] == f"stopped early ({reason}): {complete} of 5 trials"
    winner = optuna.load_study(study_name=name, storage=polled(storage)).user_attrs["winner"]
    assert winner == f"none yet: the study stopped early ({reason}): {complete} of 5 trials complete", (
        "not 'the study is running'"
    )
    assert list((tmp_path / "tmp").glob("posfair-*")) == []

    again = forkserver.run(
        cmd, cwd=tmp_path, env=environment(tmp_path), capture_output=True, text=True, timeout=600, check=False
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert sum(done(t) for t in trials_of(storage, name)) == 5 and (tmp_path / "best.yaml").exists()
    assert parent_run(tracking, name).info.status == "FINISHED"
    assert_one_finished_run_per_complete_trial(storage, tracking, name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigterm_past_the_grace_period_aborts_the_trial_and_the_rerun_runs_it_once(
    backend: str, tiny_model_dir, data: Path, tmp_path: Path
) -> None:
    """A trial longer than the grace period is aborted (its run FAILED, not FINISHED with metrics) and queued
    again; after the rerun MLflow holds one FINISHED run per complete trial."""
    storage, tracking, name = study_backend(backend, tmp_path)
    cmd = command(
        tiny_model_dir("bert"), data, storage, tracking, 4, "--output", str(tmp_path / "best.yaml"), name=name
    )
    env = {**environment(tmp_path), "POSFAIR_STOP_GRACE": "0"}
    run = forkserver.popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    aborted = catch_running(run, storage, name, at_least=1)
    run.send_signal(signal.SIGTERM)
    output = " ".join(run.communicate(timeout=300)[0].split())
    assert run.returncode == 143, output[-3000:]
    assert "Traceback" not in output, output[output.index("Traceback") - 500 :][:3000]
    trials = trials_of(storage, name)
    if trials[aborted].state == COMPLETE:
        pytest.skip("the trial finished before the signal was handled; nothing was aborted")
    assert trials[aborted].state == FAIL and f"trial {aborted} was aborted and is queued to run again" in output
    assert [t.state for t in trials if t.system_attrs.get("failed_trial") == aborted] == [WAITING]
    assert parent_run(tracking, name).info.status == "KILLED"
    assert list((tmp_path / "tmp").glob("posfair-*")) == []

    again = forkserver.run(
        cmd, cwd=tmp_path, env=environment(tmp_path), capture_output=True, text=True, timeout=600, check=False
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert sum(done(t) for t in trials_of(storage, name)) == 4
    assert_one_finished_run_per_complete_trial(storage, tracking, name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_identical_tunes_on_one_fresh_folder_export_once(
    backend: str, tiny_model_dir, data: Path, tmp_path: Path
) -> None:
    """Both exported and registered two versions; one exporter is now elected through the study storage."""
    storage, tracking, name = study_backend(backend, tmp_path)
    cmd = command(
        tiny_model_dir("bert"),
        data,
        storage,
        tracking,
        6,
        "--output",
        str(tmp_path / "best.yaml"),
        name=name,
        heartbeat=10,
    )
    runs = [
        forkserver.popen(
            cmd, cwd=tmp_path, env=environment(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    outputs = [" ".join(run.communicate(timeout=600)[0].split()) for run in runs]
    for run, output in zip(runs, outputs):
        assert run.returncode == 0, output[-3000:]
        assert "Traceback" not in output
    assert sum(done(t) for t in trials_of(storage, name)) == 6
    assert sum("exported config:" in output for output in outputs) == 1, outputs
    assert any("exported by the other process" in output for output in outputs)
    assert (tmp_path / "best.yaml").exists()
    client = MlflowClient(tracking, registry_uri=tracking)
    model = registered_name(str(tiny_model_dir("bert")))
    versions = [v for v in client.search_model_versions(f"name = '{model}'") if v.tags.get("posfair.study") == name]
    assert len(versions) == 1
    assert_one_finished_run_per_complete_trial(storage, tracking, name)


def test_the_store_creation_race_on_alembic_version_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes creating one SQLite store in the same millisecond: the loser's `UNIQUE constraint failed:
    alembic_version` was not retried and ended in advice to fix the URL."""
    import sqlalchemy.exc

    import tuner.tuning.storage

    real, calls = tuner.tuning.storage.RDBStorage, []

    def racing(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise sqlalchemy.exc.IntegrityError(
                "INSERT INTO alembic_version", {}, Exception("UNIQUE constraint failed: alembic_version.version_num")
            )
        return real(*args, **kwargs)

    monkeypatch.setattr(tuner.tuning.storage, "RDBStorage", racing)
    monkeypatch.setattr(tuner.tuning.storage.time, "sleep", lambda seconds: None)
    assert isinstance(tuner.tuning.storage.make_storage(f"sqlite:///{tmp_path / 'o.db'}"), real) and len(calls) == 2


def test_mlruns_deleted_mid_run_stops_with_a_clear_error(tiny_model_dir, data: Path, tmp_path: Path) -> None:
    """Deleting mlruns/ mid-run ended in `AssertionError: Should not reach.` (a traceback)."""
    import shutil
    import time

    cmd = command(
        tiny_model_dir("bert"), data, "", "", 6, "--output", str(tmp_path / "best.yaml"), name="deleted", heartbeat=3600
    )
    for flag in ("--storage", "--tracking-uri"):  # the defaults: both stores under ./mlruns
        del cmd[cmd.index(flag) : cmd.index(flag) + 2]
    run = forkserver.popen(
        cmd, cwd=tmp_path, env=environment(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    storage = f"sqlite:///{tmp_path / 'mlruns' / 'optuna.db'}"
    deadline = time.monotonic() + 300
    while not (tmp_path / "mlruns" / "optuna.db").exists() or sum(done(t) for t in trials_of(storage, "deleted")) < 2:
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0][-3000:]
        time.sleep(0.1)
    while (tmp_path / "mlruns").exists():  # as `rm -rf mlruns` does, whatever the run writes meanwhile
        shutil.rmtree(tmp_path / "mlruns", ignore_errors=True)
    output = " ".join(run.communicate(timeout=300)[0].split())
    assert run.returncode == 2, output[-3000:]
    # no "Should not reach", no traceback (Optuna's log of the trial whose writes hit the vanished database is
    # one line), the cause, and the fix
    assert "Should not reach" not in output and "Traceback" not in output, output[-3000:]
    assert "was deleted while the study ran" in output and "run the same command again" in output
    assert not (tmp_path / "best.yaml").exists()


def test_optunas_log_of_a_trial_that_lost_its_store_is_one_line_and_a_bug_keeps_its_traceback() -> None:
    """Which write of a trial hits a deleted `mlruns/` first is timing: when it is Optuna's, Optuna logs the
    trial's traceback. The console handler's filter keeps such records to their line; a bug's stays whole."""
    import sys

    import optuna
    import sqlalchemy.exc

    from tuner.tuning.library_logs import quiet_libraries

    quiet_libraries()
    handler = next(h for h in logging.getLogger("optuna").handlers if h.filters)

    def logged(error: BaseException) -> logging.LogRecord:
        try:
            raise error
        except BaseException:  # noqa: BLE001 - the record carries whatever was raised
            record = logging.LogRecord(
                "optuna", logging.WARNING, __file__, 1, "Trial 3 failed because of %r", (error,), sys.exc_info()
            )
        handler.filter(record)
        return record

    assert logged(sqlalchemy.exc.OperationalError("INSERT", {}, Exception("no such table: trials"))).exc_info is None
    assert logged(FileNotFoundError(2, "No such file or directory")).exc_info is None
    wrapped = optuna.exceptions.StorageInternalError("An exception is raised during the commit.")
    wrapped.__cause__ = sqlalchemy.exc.OperationalError("INSERT", {}, Exception("attempt to write a readonly database"))
    assert logged(wrapped).exc_info is None  # as Optuna's heartbeat thread raises it when mlruns/ is gone
    assert logged(KeyboardInterrupt()).exc_info is None
    assert logged(ValueError("a bug")).exc_info is not None
    assert optuna.logging.get_verbosity() == optuna.logging.WARNING


def test_a_cursor_close_that_a_stop_interrupted_is_not_logged_as_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """SIGTERM's alarm (or Ctrl-C) can land inside SQLAlchemy's cursor close; SQLAlchemy swallows that and logs
    "Error closing cursor" with a traceback through its pool's logger, which CI saw beside posfair's stop line."""
    import sqlalchemy

    from tuner.tuning.library_logs import quiet_libraries

    engine = sqlalchemy.create_engine("sqlite://")
    quiet_libraries()
    try:
        raise AttributeError("'NoneType' object has no attribute 'close'") from KeyboardInterrupt()
    except AttributeError:
        engine.pool.logger.error("Error closing cursor", exc_info=True)  # SQLAlchemy's own call, on its own logger
    assert "Error closing cursor" not in caplog.text and "Traceback" not in caplog.text


STOPS = {  # the signals sent from inside a write, and whether the trial loop's handler (else the run's) takes them
    "two Ctrl-Cs": ((signal.SIGINT, signal.SIGINT), True),
    "SIGTERM past its grace": ((signal.SIGTERM,), True),
    "SIGTERM outside the trial loop": ((signal.SIGTERM,), False),
}


@pytest.mark.parametrize("stop", list(STOPS))
def test_a_stop_that_lands_inside_a_database_write_waits_for_the_write_and_then_aborts(
    stop: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI (PostgreSQL): the abort landed inside psycopg's ping; the broken write reached Optuna as a
    StorageInternalError, which it logged with a traceback as an ordinary failed trial, so the trial was never
    queued again. Signals sent from inside a write must leave the write whole and stop the run right after it."""
    import os
    import time
    from contextlib import ExitStack

    import sqlalchemy

    from tuner.tuning.stops import raise_terminated, stop_after_current_trial

    signals, in_the_trial_loop = STOPS[stop]
    monkeypatch.setenv("POSFAIR_STOP_GRACE", "0")
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    study = optuna.create_study(storage=storage)
    trial = study.ask()
    sent: list[int] = []

    @sqlalchemy.event.listens_for(storage.engine, "before_cursor_execute")
    def stop_now(*args: object) -> None:  # runs inside SQLAlchemy, before the statement reaches the database
        if not sent:
            sent.extend(signals)
            for number in signals:
                os.kill(os.getpid(), number)
            time.sleep(0.01)  # the grace period's alarm (0 s) fires here too

    stopped_after_a_whole_write = False
    with ExitStack() as scope:
        scope.callback(signal.signal, signal.SIGALRM, signal.getsignal(signal.SIGALRM))  # the retry's alarm handler
        if in_the_trial_loop:
            scope.enter_context(stop_after_current_trial(study))
        else:
            scope.callback(signal.signal, signal.SIGTERM, signal.signal(signal.SIGTERM, raise_terminated))
        try:
            trial.set_user_attr("written", True)
            time.sleep(5)
        except KeyboardInterrupt:
            stopped_after_a_whole_write = bool(sent) and study.trials[0].user_attrs == {"written": True}
    assert stopped_after_a_whole_write, "the stop broke the database write (or never came)"


def test_mlflows_own_log_of_a_write_into_a_deleted_store_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    """Which write hits a deleted `mlruns/` first is timing: when it is MLflow's, its SQL store logged the
    traceback and the SQL statement (`_logger.exception`) before raising what posfair reports in one line."""
    import sqlalchemy.exc

    from tuner.tuning.library_logs import quiet_libraries

    quiet_libraries()
    mlflow_store = logging.getLogger("mlflow.store.db.utils")  # the logger of MLflow's make_managed_session
    for error in (
        sqlalchemy.exc.OperationalError("INSERT INTO runs", {}, Exception("attempt to write a readonly database")),
        ValueError("a bug"),
    ):
        try:
            raise error
        except Exception as caught:  # noqa: BLE001 - the record carries whatever was raised
            mlflow_store.exception("SQLAlchemy database error. The following exception is caught.\n%s", caught)
    assert "readonly database" not in caplog.text and "a bug" in caplog.text


def test_a_background_thread_that_lost_its_store_says_so_in_one_line(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture
) -> None:
    """Optuna's heartbeat thread writing into a deleted `mlruns/` printed a traceback beside posfair's message."""
    import threading

    import sqlalchemy.exc

    from tuner.tuning.library_logs import quiet_libraries

    saved = threading.excepthook
    try:
        quiet_libraries()
        for error in (
            sqlalchemy.exc.OperationalError("UPDATE", {}, Exception("no such table: trial_heartbeats")),
            ValueError("a bug"),
        ):

            def fail(error: Exception = error) -> None:
                raise error

            worker = threading.Thread(target=fail, name="heartbeat")
            worker.start()
            worker.join()
    finally:
        threading.excepthook = saved
    assert "heartbeat stopped: (builtins.Exception) no such table: trial_heartbeats" in caplog.text
    printed = capsys.readouterr().err  # Python's own report of a thread's error (and any log handler's lines)
    assert printed.count("Traceback") == 1 and "ValueError: a bug" in printed  # the bug's, whole
    assert "OperationalError" not in printed  # the lost store's: one log line, no traceback


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
@pytest.mark.parametrize("end", ["SIGKILL", "exit 0"])
def test_a_local_worker_that_dies_is_reported_with_its_signal_and_its_trial_rerun(
    end: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A local worker of `tune --workers N` killed mid-trial was never mentioned by the coordinator; its trial
    waited for the heartbeat check. A worker that ends normally is not reported."""
    import multiprocessing
    import os
    import socket
    import time

    from tuner.tuning.owners import OWNER_ATTR
    from tuner.tuning.storage import make_storage
    from tuner.tuning.watches import watch_workers

    caplog.set_level(logging.INFO)
    study = optuna.create_study(storage=make_storage(f"sqlite:///{tmp_path / 'study.db'}", heartbeat=3600))
    context = multiprocessing.get_context("fork")
    worker = context.Process(target=time.sleep, args=(60 if end == "SIGKILL" else 0,))
    worker.start()
    trial = study.ask({"strength": optuna.distributions.FloatDistribution(0, 1)})
    trial.set_user_attr(OWNER_ATTR, {"host": socket.gethostname(), "pid": worker.pid, "trial": trial.number})
    stop = watch_workers([worker], study)
    try:
        if end == "SIGKILL":
            os.kill(worker.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while worker.exitcode is None or (end == "SIGKILL" and "re-run" not in caplog.text):
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.05)
    finally:
        stop()
    if end == "SIGKILL":
        assert (
            f"local worker 1 (pid {worker.pid}) was killed by SIGKILL while it ran trial {trial.number}" in caplog.text
        )
        assert (
            f"trial {trial.number} was left RUNNING by process {worker.pid}, which is gone; it is re-run" in caplog.text
        )
        trials = study.get_trials(deepcopy=False)
        assert trials[trial.number].state == FAIL
        assert [t.state for t in trials if t.system_attrs.get("failed_trial") == trial.number] == [WAITING]
    else:
        assert "local worker" not in caplog.text
        assert study.get_trials(deepcopy=False)[trial.number].state == optuna.trial.TrialState.RUNNING


@pytest.mark.parametrize(
    ("read", "variable", "default", "least"),
    [(sqlite_wait, "POSFAIR_SQLITE_WAIT", 60.0, 0.1), (stop_grace, "POSFAIR_STOP_GRACE", 20.0, 0.0)],  # docs/faults.md
)
def test_a_wait_set_in_the_environment_is_read_in_seconds_and_a_bad_one_said(
    read, variable: str, default: float, least: float, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for text, seconds in (("2.5", 2.5), ("-3", least), ("", default)):
        monkeypatch.setenv(variable, text)
        assert read() == seconds, text
    monkeypatch.setenv(variable, "soon")
    with caplog.at_level(logging.WARNING):
        assert read() == default
    assert f"{variable}='soon' is not a number of seconds; using {default:g}" in caplog.text
