"""Several workers on one study, and the faults a long study meets: kills, failing trials, lost tracking.

Faults are injected into real processes: a worker is SIGKILLed, an MLflow server is SIGKILLed and started
again. The variants on PostgreSQL and on MLflow servers backed by it run when `.ci/run` has started those
services (POSFAIR_TEST_POSTGRES, POSFAIR_TEST_MLFLOW): they skip elsewhere and must run in CI.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from mlflow.tracking import MlflowClient

from tests import forkserver
from tests.ci import require_mlflow_server, require_postgres
from tests.services import as_logged, free_port, fresh_postgres_database, running_mlflow_server
from tests.test_study import write_dataset
from tests.tiny import tiny_tune_options
from tuner.common.trials import DUPLICATE_ATTR, counted, never_ran
from tuner.tracking.store import TrackingUnavailableError
from tuner.tuning.run import TuneSettings, tune
from tuner.tuning.search_space import SearchSpace
from tuner.tuning.storage import make_storage

COMPLETE = optuna.trial.TrialState.COMPLETE


def done(trial: optuna.trial.FrozenTrial) -> bool:
    """A trial that counts towards --trials and has ended: complete (not a repeat of a config already run) or
    pruned between rungs."""
    return counted(trial) and trial.state != optuna.trial.TrialState.RUNNING


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("workers") / "data", docs=10)


def command(
    model: Path,
    data: Path,
    storage: str,
    tracking: str,
    trials: int,
    *extra: str,
    name: str = "shared",
    heartbeat: int = 1,
) -> list[str]:
    """`tune run` on the tiny model; a 1-second heartbeat lets a killed worker's trial be found in 3 s."""
    return [
        *forkserver.TUNE_COMMAND,
        "run",
        *tiny_tune_options(model, data, trials=trials),
        "--storage",
        storage,
        "--tracking-uri",
        tracking,
        "--study-name",
        name,
        "--heartbeat",
        str(heartbeat),
        *extra,
    ]


def trial_runs(tracking: str, name: str = "shared") -> list:
    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name("posfair")
    query = f"tags.`posfair.role` = 'trial' and tags.`posfair.study` = '{name}'"
    return client.search_runs([experiment.experiment_id], query, max_results=1000)


def finished_trial_numbers(tracking: str, name: str = "shared") -> list[int]:
    """Trial numbers of the FINISHED runs of complete trials, sorted (a pruned trial's run is FINISHED too, tagged
    PRUNED): a trial logged twice shows up twice."""
    runs = trial_runs(tracking, name)
    return sorted(
        int(r.data.tags["posfair.trial"])
        for r in runs
        if r.info.status == "FINISHED" and r.data.tags.get("posfair.state") != "PRUNED"
    )


def study_backend(backend: str, tmp_path: Path) -> tuple[str, str, str]:
    """Optuna storage, tracking URI and study name: SQLite files here, an Optuna journal beside a SQLite MLflow
    store, or CI's PostgreSQL and MLflow server (a fresh study name each run, since those servers outlive the test)."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'optuna.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}", "shared"
    if backend == "journal":
        return f"journal:{tmp_path / 'study.journal'}", f"sqlite:///{tmp_path / 'mlflow.db'}", "shared"
    return require_postgres(), require_mlflow_server(), f"shared-{os.getpid()}-{time.time_ns()}"


def coordinator_and_second_machine(
    base: list[str], folder: Path, timeout: float, env: dict[str, str] | None = None
) -> None:
    """`base --workers 2` (exporting to best.yaml) beside a second machine's `base --worker`, both run to their end
    from the fork server; each must exit 0 (its log's tail says why not)."""
    logs = {role: folder / f"{role}.log" for role in ("coordinator", "other")}
    with logs["coordinator"].open("w") as coordinator_log, logs["other"].open("w") as other_log:
        processes = {
            "coordinator": forkserver.popen(
                [*base, "--workers", "2", "--output", str(folder / "best.yaml")],
                cwd=folder,
                env=env,
                stdout=coordinator_log,
                stderr=subprocess.STDOUT,
            ),
            "other": forkserver.popen(
                [*base, "--worker"], cwd=folder, env=env, stdout=other_log, stderr=subprocess.STDOUT
            ),
        }
        for process in processes.values():
            process.wait(timeout=timeout)
    for role, process in processes.items():
        assert process.returncode == 0, logs[role].read_text()[-3000:]


@cache
def polled(url: str) -> optuna.storages.BaseStorage:
    """One storage (one connection pool) per URL for the polling loops: a fresh `load_study(storage=url)` every
    50 ms opens a new pool each time and exhausts PostgreSQL's connection limit. A poll may race the `tune`
    process that is creating the store's tables (both then stamp Optuna's schema version): it tries again.
    A journal is read as `tune` reads it, each poll replaying only what was appended since the last."""
    if url.startswith("journal:"):
        return make_storage(url)
    for _ in range(50):
        try:
            return optuna.storages.RDBStorage(url)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError):  # "already exists", "locked"
            time.sleep(0.1)
    return optuna.storages.RDBStorage(url)


def complete_count(storage: str, name: str = "shared") -> int:
    try:
        return len(
            optuna.load_study(study_name=name, storage=polled(storage)).get_trials(deepcopy=False, states=(COMPLETE,))
        )
    except KeyError:  # the study does not exist yet
        return 0


def wait_until(condition: Callable[[], bool], process: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the study ended first:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql+server"])
def test_two_workers_on_one_study_finish_exactly_the_requested_trials(
    backend: str, tiny_model_dir, data: Path, tmp_path: Path
) -> None:
    """A coordinator with --workers 2 plus a second machine's --worker: 12 trials, once each, one MLflow run each."""
    storage, tracking, name = study_backend(backend, tmp_path)
    # Nobody is killed here: a heartbeat of 10 s keeps a worker that a busy machine stalls for 3 s from being
    # failed as dead under its own running trial (Optuna then ends that worker: optuna/optuna#5470).
    base = command(tiny_model_dir("bert"), data, storage, tracking, 12, name=name, heartbeat=10)
    coordinator_and_second_machine(base, tmp_path, timeout=600)
    study = optuna.load_study(study_name=name, storage=storage)
    complete = [t for t in study.trials if done(t)]
    assert len(complete) == 12
    assert len({t.number for t in study.trials}) == len(study.trials)
    assert len({t.user_attrs["worker"] for t in complete}) >= 2  # the trials really were shared
    logged = sorted(int(r.data.tags["posfair.trial"]) for r in trial_runs(tracking, name))
    ran = [t for t in study.trials if t.state in (COMPLETE, optuna.trial.TrialState.PRUNED) and not never_ran(t)]
    assert logged == sorted(
        t.number for t in ran
    )  # exactly one run per trial (repeats and pruned ones too), none twice
    assert (tmp_path / "best.yaml").exists()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql+server"])
def test_a_worker_killed_mid_trial_is_detected_and_its_trial_rerun(
    backend: str, tiny_model_dir, data: Path, tmp_path: Path
) -> None:
    """SIGKILL the only worker while trial >= 2 runs; after 3 missed heartbeats the same command resumes."""
    storage, tracking, name = study_backend(backend, tmp_path)
    cmd = command(tiny_model_dir("bert"), data, storage, tracking, 6, name=name)
    victim = forkserver.popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed = None
    deadline = time.monotonic() + 300
    while killed is None and time.monotonic() < deadline and victim.poll() is None:
        time.sleep(0.05)
        try:
            running = optuna.load_study(study_name=name, storage=polled(storage)).get_trials(
                states=(optuna.trial.TrialState.RUNNING,)
            )
        except KeyError:
            continue
        if running and running[0].number >= 2:
            victim.send_signal(signal.SIGKILL)
            killed = running[0].number
    victim.wait(timeout=30)
    assert killed is not None, "no trial was caught running"
    time.sleep(3.5)  # past the grace period of 3 heartbeats
    rerun = forkserver.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    trials = optuna.load_study(study_name=name, storage=storage).trials
    assert len({t.number for t in trials}) == len(trials)  # no trial number twice
    assert trials[killed].state == optuna.trial.TrialState.FAIL
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == killed]
    assert len(retried) == 1 and retried[0].state == COMPLETE  # the killed trial re-run, once
    assert trials[killed].params.items() <= retried[0].params.items()  # with what it had drawn
    assert sum(done(t) for t in trials) == 6
    complete = sorted(t.number for t in trials if t.state == COMPLETE)  # a repeat's run is FINISHED too
    assert finished_trial_numbers(tracking, name) == complete  # nothing lost, nothing logged twice


@pytest.fixture
def tiny_settings(tiny_model_dir, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TuneSettings:
    """A study run in this process, its stores, output and disk cache under tmp_path."""
    monkeypatch.setenv("POSFAIR_CACHE_DIR", str(tmp_path / "cache"))
    return TuneSettings(
        model=str(tiny_model_dir("bert")),
        pooling="cls",
        dataset=f"jsonl:{data}",
        heldout=None,
        trials=4,
        budget=None,
        hm_floor="-90%",
        storage=f"sqlite:///{tmp_path / 'o.db'}",
        tracking_uri=f"sqlite:///{tmp_path / 'm.db'}",
        output=tmp_path / "best.yaml",
        study_name="shared",
        profile_docs=2,
        bootstrap=20,
        space=SearchSpace(basket_sizes=(8, 128)),
    )


def test_a_trial_that_raises_is_recorded_as_failed_and_the_study_goes_on(
    tiny_settings: TuneSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.evaluation.evaluator import Evaluator

    real_run = Evaluator.run

    def out_of_memory_at_half_strength(self: Evaluator, config: object) -> object:
        if config is not None and getattr(config, "strength", 0) == 0.5:
            raise RuntimeError("CPU out of memory (simulated)")
        return real_run(self, config)

    monkeypatch.setattr(Evaluator, "run", out_of_memory_at_half_strength)
    tune(tiny_settings)
    trials = optuna.load_study(study_name="shared", storage=tiny_settings.storage).trials
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert failed and failed[0].user_attrs["failure_reason"] == "RuntimeError: CPU out of memory (simulated)"
    assert sum(done(t) for t in trials) == 4
    client = MlflowClient(tiny_settings.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name("posfair").experiment_id], "tags.`posfair.state` = 'FAIL'")
    assert runs and runs[0].data.tags["posfair.failure"].startswith("RuntimeError: CPU out of memory")


def test_an_unreachable_tracking_server_fails_before_any_work(tiny_settings: TuneSettings, tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    start = time.monotonic()
    with pytest.raises(TrackingUnavailableError, match=f"http://127.0.0.1:{port} does not answer"):
        tune(replace(tiny_settings, tracking_uri=f"http://127.0.0.1:{port}"))
    assert time.monotonic() - start < 15
    assert not (tmp_path / "o.db").exists()  # no study was started


def test_a_tracking_server_killed_mid_study_and_restarted_loses_no_trial_log(
    tiny_model_dir, data: Path, tmp_path: Path
) -> None:
    """SIGKILL a real MLflow server (backed by a fresh PostgreSQL database) after two trials, let two more
    trials finish while it is down, start it again on the same port and store: the study completes, and
    every trial is in MLflow exactly once, FINISHED, with its metrics and attention profile.

    The study is held (SIGSTOP) only while the server restarts, so that it cannot end before the server is
    back (its last retry is at the end); the outage itself spans whole trials of the running study.
    """
    trials = 8
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    with (
        fresh_postgres_database(require_postgres(), "mlflow_outage") as backend,
        running_mlflow_server(backend, tmp_path) as server,
    ):
        cmd = command(
            tiny_model_dir("bert"), data, storage, server.uri, trials, heartbeat=20
        )  # held below: must not look dead
        log = tmp_path / "tune.log"
        with log.open("w") as out:
            study = forkserver.popen(cmd, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: complete_count(storage) >= 2, study, log)
            server.kill()
            down_at = complete_count(storage)
            assert down_at <= trials - 3, "the study ran too far before the server went down"
            wait_until(lambda: complete_count(storage) >= down_at + 2, study, log)  # trials finish while it is down
            study.send_signal(signal.SIGSTOP)
            try:
                server.start()
            finally:
                study.send_signal(signal.SIGCONT)
            assert study.wait(timeout=600) == 0, log.read_text()[-3000:]
        finally:
            if study.poll() is None:
                study.kill()
        output = " ".join(log.read_text().split())
        assert "MLflow still unreachable" in output and "kept for retry" in output  # the outage was felt

        ended = optuna.load_study(study_name="shared", storage=storage).trials
        assert sum(done(t) for t in ended) == trials  # a repeat of a calibration already run does not count
        logged = {t.number: t for t in ended if done(t) or DUPLICATE_ATTR in t.user_attrs}  # a repeat is logged too
        client = MlflowClient(server.uri)
        runs = trial_runs(server.uri)
        assert sorted(int(r.data.tags["posfair.trial"]) for r in runs) == sorted(logged)  # each once, none lost
        for run in runs:
            trial = logged[int(run.data.tags["posfair.trial"])]
            if trial.state == optuna.trial.TrialState.PRUNED:  # stopped between rungs: finished as designed, tagged so
                assert run.info.status == "FINISHED" and run.data.tags["posfair.state"] == "PRUNED"
                continue
            assert run.info.status == "FINISHED"
            assert run.data.metrics["psi"] == as_logged(trial.user_attrs["psi"])
            assert run.data.metrics["hm_x100"] == as_logged(100 * trial.user_attrs["hm"])
            assert float(run.data.params["lambda_strength"]) == pytest.approx(trial.params["strength"])
            if DUPLICATE_ATTR not in trial.user_attrs:  # a repeat was not run: it has no profile of its own
                assert {"attention_profile.json", "attention_profile.png"} <= {
                    a.path for a in client.list_artifacts(run.info.run_id)
                }
        parent = client.get_run(runs[0].data.tags["mlflow.parentRunId"])
        assert parent.info.status == "FINISHED" and parent.data.tags["posfair.outcome"] == "exported"
        assert "summary.json" in {a.path for a in client.list_artifacts(parent.info.run_id)}
