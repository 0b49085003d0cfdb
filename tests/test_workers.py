"""Several workers on one study, and the faults a long study meets: kills, failing trials, lost tracking.

The PostgreSQL + MLflow-server variant runs when `.ci/run` has started those services
(POSFAIR_TEST_POSTGRES, POSFAIR_TEST_MLFLOW); the SQLite variant always runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests.test_study import write_dataset
from tuner.search_space import SearchSpace
from tuner.tracking import Tracker, TrackingUnavailableError, TrialRecord
from tuner.tune import TuneSettings, tune

COMPLETE = optuna.trial.TrialState.COMPLETE


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("workers") / "data", docs=10)


def command(model: Path, data: Path, storage: str, tracking: str, trials: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tuner.cli", "run", "--model", str(model), "--pooling", "cls",
            "--dataset", f"jsonl:{data}", "--heldout", "", "--trials", str(trials), "--hm-floor=-90%",
            "--storage", storage, "--tracking-uri", tracking, "--study-name", "shared", "--profile-docs", "2",
            "--heartbeat", "1", "--bootstrap", "20", *extra]


def trial_runs(tracking: str) -> list[int]:
    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name("posfair")
    runs = client.search_runs([experiment.experiment_id], "tags.`posfair.role` = 'trial' and tags.`posfair.study` = 'shared'", max_results=1000)
    return sorted(int(r.data.tags["posfair.trial"]) for r in runs if r.info.status == "FINISHED")


def backends(tmp_path: Path) -> list[tuple[str, str]]:
    found = [(f"sqlite:///{tmp_path / 'optuna.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}")]
    if os.environ.get("POSFAIR_TEST_POSTGRES") and os.environ.get("POSFAIR_TEST_MLFLOW"):
        found.append((os.environ["POSFAIR_TEST_POSTGRES"], os.environ["POSFAIR_TEST_MLFLOW"]))
    return found


@pytest.mark.parametrize("backend", ["sqlite", "postgresql+server"])
def test_two_workers_on_one_study_finish_exactly_the_requested_trials(backend: str, tiny_model_dir, data: Path, tmp_path: Path) -> None:
    """A coordinator with --workers 2 plus a second machine's --worker: 12 trials, once each, one MLflow run each."""
    available = dict(zip(["sqlite", "postgresql+server"], backends(tmp_path)))
    if backend not in available:
        pytest.skip("PostgreSQL and MLflow server are started by .ci/run (POSFAIR_TEST_POSTGRES / POSFAIR_TEST_MLFLOW)")
    storage, tracking = available[backend]
    base = command(tiny_model_dir("bert"), data, storage, tracking, 12)
    if backend != "sqlite":  # a fresh study name per run on the shared server
        base[base.index("shared")] = f"shared-{os.getpid()}-{time.time_ns()}"
    logs = {name: (tmp_path / f"{name}.log").open("w") for name in ("coordinator", "other")}
    coordinator = subprocess.Popen([*base, "--workers", "2", "--output", str(tmp_path / "best.yaml")], cwd=tmp_path,
                                   stdout=logs["coordinator"], stderr=subprocess.STDOUT)
    other_machine = subprocess.Popen([*base, "--worker"], cwd=tmp_path, stdout=logs["other"], stderr=subprocess.STDOUT)
    for process in (coordinator, other_machine):
        process.wait(timeout=600)
    for name, log in logs.items():
        log.close()
    assert coordinator.returncode == 0, (tmp_path / "coordinator.log").read_text()[-3000:]
    assert other_machine.returncode == 0, (tmp_path / "other.log").read_text()[-3000:]
    name = base[base.index("--study-name") + 1]
    study = optuna.load_study(study_name=name, storage=storage)
    complete = [t for t in study.trials if t.state == COMPLETE]
    assert len(complete) == 12
    assert len({t.number for t in study.trials}) == len(study.trials)
    assert len({t.user_attrs["worker"] for t in complete}) >= 2  # the trials really were shared
    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name("posfair")
    runs = client.search_runs([experiment.experiment_id], f"tags.`posfair.role` = 'trial' and tags.`posfair.study` = '{name}'", max_results=1000)
    logged = sorted(int(r.data.tags["posfair.trial"]) for r in runs)
    assert logged == sorted(t.number for t in complete)  # exactly one run per trial, none twice
    assert (tmp_path / "best.yaml").exists()


def test_a_worker_killed_mid_trial_is_detected_and_its_trial_rerun(tiny_model_dir, data: Path, tmp_path: Path) -> None:
    storage, tracking = backends(tmp_path)[0]
    cmd = command(tiny_model_dir("bert"), data, storage, tracking, 6)
    victim = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed = None
    deadline = time.monotonic() + 300
    while killed is None and time.monotonic() < deadline:
        time.sleep(0.05)
        try:
            running = optuna.load_study(study_name="shared", storage=storage).get_trials(states=(optuna.trial.TrialState.RUNNING,))
        except KeyError:
            continue
        if running and running[0].number >= 2:
            victim.send_signal(signal.SIGKILL)
            killed = running[0].number
    victim.wait(timeout=30)
    assert killed is not None, "no trial was caught running"
    time.sleep(3.5)  # past the grace period of 3 heartbeats
    rerun = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    trials = optuna.load_study(study_name="shared", storage=storage).trials
    assert trials[killed].state == optuna.trial.TrialState.FAIL
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == killed]
    assert retried and retried[0].state == COMPLETE
    assert trials[killed].params.items() <= retried[0].params.items()  # re-run with what it had drawn
    complete = sorted(t.number for t in trials if t.state == COMPLETE)
    assert len(complete) == 6
    assert trial_runs(tracking) == complete  # nothing lost, nothing logged twice


@pytest.fixture
def tiny_settings(tiny_model_dir, data: Path, tmp_path: Path) -> TuneSettings:
    return TuneSettings(
        model=str(tiny_model_dir("bert")), pooling="cls", dataset=f"jsonl:{data}", heldout=None, trials=4,
        hm_floor="-90%", storage=f"sqlite:///{tmp_path / 'o.db'}", tracking_uri=f"sqlite:///{tmp_path / 'm.db'}",
        output=tmp_path / "best.yaml", study_name="shared", profile_docs=2, bootstrap=20,
        space=SearchSpace(basket_sizes=(8, 128)),
    )


def test_a_trial_that_raises_is_recorded_as_failed_and_the_study_goes_on(tiny_settings: TuneSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.evaluation import Evaluator

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
    assert sum(t.state == COMPLETE for t in trials) == 4
    client = MlflowClient(tiny_settings.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name("posfair").experiment_id], "tags.`posfair.state` = 'FAIL'")
    assert runs and runs[0].data.tags["posfair.failure"].startswith("RuntimeError: CPU out of memory")


def test_an_unreachable_tracking_server_fails_before_any_work(tiny_settings: TuneSettings, tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(TrackingUnavailableError, match=f"http://127.0.0.1:{port} does not answer"):
        tune(replace(tiny_settings, tracking_uri=f"http://127.0.0.1:{port}"))
    assert time.monotonic() - start < 15
    assert not (tmp_path / "o.db").exists()  # no study was started


def test_trial_logs_survive_a_tracking_outage_and_are_flushed_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tracker = Tracker(f"sqlite:///{tmp_path / 'm.db'}", "posfair")
    tracker.start_study("outage", {}, {})
    real_create = tracker.client.create_run
    down = {"calls": 0}

    def flaky(*args: object, **kwargs: object) -> object:
        if 1 <= down["calls"] < 3:
            down["calls"] += 1
            raise ConnectionError("tracking server unreachable")
        down["calls"] += 1
        return real_create(*args, **kwargs)

    tracker.client.create_run = flaky  # type: ignore[method-assign]
    for number in range(4):
        tracker.log_trial("outage", TrialRecord(number, "COMPLETE", {"strength": 0.1 * number}, {"psi": 0.1}))
    assert "kept for retry" in caplog.text
    assert tracker.flush()
    client = MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")
    runs = client.search_runs([client.get_experiment_by_name("posfair").experiment_id], "tags.`posfair.role` = 'trial'")
    assert sorted(int(r.data.tags["posfair.trial"]) for r in runs) == [0, 1, 2, 3]
