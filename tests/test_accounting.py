"""A study's trial accounting under interruption and scale-out, tested on real processes with real signals.

Issue 13's cases: a SIGKILLed run rerun at once (3), old failures counted against a fixed rerun (4), workers
that drew the same trials (5), Ctrl-C twice (9; once: beside SIGTERM in tests/test_faults.py). Each runs on
SQLite and, where `.ci/run` provides them, on PostgreSQL with an MLflow server (the helpers of
tests/test_workers.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from tests import forkserver
from tests.test_study import write_dataset
from tests.test_workers import (
    command,
    coordinator_and_second_machine,
    done,
    finished_trial_numbers,
    polled,
    study_backend,
)
from tuner.cli.app import app
from tuner.tuning.storage import make_storage
from tuner.tuning.study import enqueue_once, open_study

COMPLETE, RUNNING, FAIL, WAITING = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.RUNNING,
    optuna.trial.TrialState.FAIL,
    optuna.trial.TrialState.WAITING,
)
BACKENDS = ["sqlite", "postgresql+server"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("accounting") / "data", docs=10)


ROOT = Path(__file__).resolve().parents[1]


def environment(tmp_path: Path) -> dict[str, str]:
    """The processes' own temp folder, to see what a killed one leaves there; this checkout's code first on
    the path (a relative PYTHONPATH would point into the processes' working folder)."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    path = os.pathsep.join([str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    return {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "PYTHONPATH": path}


def trials_of(storage: str, name: str) -> list[optuna.trial.FrozenTrial]:
    try:
        return optuna.load_study(study_name=name, storage=polled(storage)).get_trials(deepcopy=False)
    except KeyError:
        return []


def catch_running(process: subprocess.Popen, storage: str, name: str, at_least: int) -> int:
    """The number of the first trial >= `at_least` seen RUNNING, once its owner is recorded (or it has run for
    half a second: code that records no owner is caught too)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        running = [
            t
            for t in trials_of(storage, name)
            if t.state == RUNNING
            and t.number >= at_least
            and ("owner" in t.user_attrs or (datetime.now() - t.datetime_start).total_seconds() > 0.5)
        ]
        if running:
            return running[0].number
        time.sleep(0.05)
    raise AssertionError(f"no trial >= {at_least} was caught running (exit {process.poll()})")


class Output:
    """A process's (merged) output, read as it comes, so that a test can wait for a line instead of sleeping."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self._reader = threading.Thread(
            target=lambda: self.lines.extend(iter(process.stdout.readline, "")), daemon=True
        )
        self._reader.start()

    def wait_for(self, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while text not in "".join(self.lines):
            if time.monotonic() > deadline or not self._reader.is_alive():
                raise AssertionError(f"{text!r} never printed:\n{''.join(self.lines)[-3000:]}")
            time.sleep(0.02)

    def all(self, process: subprocess.Popen, timeout: float) -> str:
        """Everything the process printed until it ended, whitespace collapsed (rich wraps long lines)."""
        process.wait(timeout=timeout)
        self._reader.join(timeout=30)
        return " ".join("".join(self.lines).split())


def parent_run(tracking: str, name: str):
    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name("posfair")
    query = f"tags.`posfair.study` = '{name}' and tags.`posfair.role` = 'study'"
    return client.search_runs([experiment.experiment_id], query, max_results=1)[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_killed_mid_trial_and_rerun_at_once_reruns_the_trial_and_cleans_its_temp_folder(
    backend: str, tiny_model_dir, data: Path, tmp_path: Path
) -> None:
    """Case 3: rerun within the heartbeat window (20 s, 3 beats), the old code ended with 3 COMPLETE + 1 RUNNING of
    4, exported from 3, exited 0, and left the killed process's temp folder behind."""
    storage, tracking, name = study_backend(backend, tmp_path)
    cmd = command(
        tiny_model_dir("bert"),
        data,
        storage,
        tracking,
        4,
        "--output",
        str(tmp_path / "best.yaml"),
        name=name,
        heartbeat=20,
    )
    victim = forkserver.popen(
        cmd, cwd=tmp_path, env=environment(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    killed = catch_running(victim, storage, name, at_least=2)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    assert list((tmp_path / "tmp").glob("posfair-*")), "the killed run had no temp folder to leave"
    rerun = forkserver.run(cmd, cwd=tmp_path, env=environment(tmp_path), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    trials = optuna.load_study(study_name=name, storage=storage).trials
    assert trials[killed].state == FAIL
    assert [t.state for t in trials if t.system_attrs.get("failed_trial") == killed] == [COMPLETE]
    assert sorted(t.number for t in trials if t.state == COMPLETE) == finished_trial_numbers(tracking, name)
    assert sum(done(t) for t in trials) == 4 and not [t for t in trials if t.state == RUNNING]
    assert list((tmp_path / "tmp").glob("posfair-*")) == []  # the killed run's folder is gone, the rerun's too
    assert f"trial {killed} was left RUNNING by process {victim.pid}, which is gone; it is re-run" in " ".join(
        rerun.stderr.split()
    )
    assert (tmp_path / "best.yaml").exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_ctrl_cs_abort_the_trial_and_the_rerun_runs_it_again(
    backend: str, tiny_model_dir, data: Path, tmp_path: Path
) -> None:
    """Case 9: after two Ctrl-Cs the interrupted trial was left FAILED, never re-run, and gone from the summary.

    The trial must outlast the round trip between the two signals: a trial pruned after its first rung ended
    in milliseconds, between them, so these runs are unpruned (`tiny_tune_options`)."""
    storage, tracking, name = study_backend(backend, tmp_path)
    cmd = command(
        tiny_model_dir("bert"), data, storage, tracking, 4, "--output", str(tmp_path / "best.yaml"), name=name
    )
    run = forkserver.popen(
        cmd, cwd=tmp_path, env=environment(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    aborted = catch_running(run, storage, name, at_least=2)  # caught as it starts: a whole trial ahead
    printed = Output(run)
    run.send_signal(signal.SIGINT)
    printed.wait_for("interrupt: finishing the current trial")  # the first is handled: the second aborts
    run.send_signal(signal.SIGINT)
    output = printed.all(run, timeout=300)
    assert run.returncode == 130, output[-3000:]
    trials = trials_of(storage, name)
    assert trials[aborted].state != COMPLETE, "the trial ended between two signals sent milliseconds apart"
    assert f"trial {aborted} was aborted and is queued to run again" in output
    assert trials[aborted].state == FAIL
    queued = [t for t in trials if t.system_attrs.get("failed_trial") == aborted]
    assert [t.state for t in queued] == [WAITING] and queued[0].params == trials[aborted].params

    again = forkserver.run(cmd, cwd=tmp_path, env=environment(tmp_path), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    trials = trials_of(storage, name)
    assert trials[queued[0].number].state == COMPLETE  # re-run before any new trial
    assert sum(done(t) for t in trials) == 4 and (tmp_path / "best.yaml").exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_failures_of_an_earlier_run_do_not_stop_a_fixed_rerun(
    backend: str, tiny_model_dir, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Case 4: after a first attempt whose trials failed, the fixed rerun stopped on the old failures, ran one trial
    and exported from 1 of 2 with exit 0."""
    from tuner.evaluation.evaluator import Evaluator

    storage, tracking, name = study_backend(backend, tmp_path)
    monkeypatch.chdir(tmp_path)
    args = command(
        tiny_model_dir("bert"), data, storage, tracking, 4, "--output", str(tmp_path / "best.yaml"), name=name
    )[3:]
    real_run = Evaluator.run

    def broken(self: Evaluator, config: object) -> object:  # the first attempt's mistake: every calibrated trial fails
        if config is not None and getattr(config, "strength", 0) > 0:
            raise RuntimeError("a bad first attempt (simulated)")
        return real_run(self, config)

    monkeypatch.setattr(Evaluator, "run", broken)
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 4, first.output
    assert "stopped early: 4 trials of this run failed;" in " ".join(first.output.split())
    assert not (tmp_path / "best.yaml").exists()
    monkeypatch.setattr(Evaluator, "run", real_run)

    fixed = CliRunner().invoke(app, args)
    assert fixed.exit_code == 0, fixed.output
    trials = trials_of(storage, name)
    assert sum(t.state == FAIL for t in trials) == 4 and sum(done(t) for t in trials) == 4
    assert (tmp_path / "best.yaml").exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_workers_draw_twelve_distinct_configurations(
    backend: str, tiny_model_dir, data: Path, tmp_path: Path
) -> None:
    """Case 5: every process seeded its sampler alike, so workers drew identical trials (2 = 3, 4 = 5)."""
    storage, tracking, name = study_backend(backend, tmp_path)
    (tmp_path / "space.yaml").write_text("strength_step: 0.01\nbasket_sizes: [8, 16, 32, 64, 128]\n", encoding="utf-8")
    base = command(
        tiny_model_dir("bert"),
        data,
        storage,
        tracking,
        12,
        "--seed",  # seed 0's workers draw one config at once: the later trial waits for the earlier and repeats it
        "1",  # (tests/test_repeat_race.py); this test is about different draws, not that wait
        "--space",
        str(tmp_path / "space.yaml"),
        "--no-bisect",  # the draws of the samplers are what this test is about, not the trials bisection queues
        "--no-paper-siblings",  # nor the queued start
        name=name,
        heartbeat=10,
    )
    # The coordinator's trials take under a second here, and its local worker (`--workers 2`) is a fresh interpreter:
    # on a loaded machine the coordinator took all twelve before that worker started (CI, both backends). A second
    # machine's `--worker` from the fork server starts at once, so at least two processes draw, whatever the load.
    coordinator_and_second_machine(base, tmp_path, timeout=900, env=environment(tmp_path))
    complete = [t for t in optuna.load_study(study_name=name, storage=storage).trials if done(t)]
    assert len(complete) == 12 and len({t.user_attrs["worker"] for t in complete}) >= 2
    drawn = [tuple(sorted(t.params.items())) for t in complete if "fixed_params" not in t.system_attrs]
    assert len(drawn) == 10 and len(set(drawn)) == 10  # the two enqueued references aside, no configuration twice


def test_a_reference_queued_but_not_yet_run_is_not_queued_again(tmp_path: Path) -> None:
    """Case 5: a second `tune` on the study queued the paper default again while the first one's copy was
    waiting (a waiting trial's parameters are not yet its `params`), so it ran twice."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = open_study("queued", storage, seed=0, pareto=False, identity={"k": 1})
    enqueue_once(study, {"x": 0.5}, {"basket_shares": "equal"})
    enqueue_once(
        open_study("queued", storage, seed=0, pareto=False, identity={"k": 1}), {"x": 0.5}, {"basket_shares": "equal"}
    )
    assert len(study.trials) == 1


def test_workers_seed_their_samplers_apart_and_reproducibly() -> None:
    from tuner.tuning.study import sampler_seed

    assert sampler_seed(7, "0") == 7  # a single process draws as it always did
    assert len({sampler_seed(7, str(i)) for i in range(8)}) == 8
    assert sampler_seed(7, "3") == sampler_seed(7, "3") != sampler_seed(8, "3")


def test_two_processes_on_one_study_draw_different_first_trials(tmp_path: Path) -> None:
    """Case 5, the cause: every process seeded its sampler with --seed alone, so two processes drew the same
    random start-up trials."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    draws = []
    for worker in ("0", "1"):
        study = open_study("seeds", storage, seed=0, pareto=False, identity={"k": 1}, worker=worker)
        draws.append(study.ask().suggest_float("x", 0, 1))
    assert draws[0] != draws[1]


POP_ALL = """
import json, sys, time
from pathlib import Path
import optuna
from tuner.tuning.storage import make_storage
optuna.logging.set_verbosity(optuna.logging.ERROR)
study = optuna.load_study(study_name="queue", storage=make_storage(sys.argv[1]))
Path(sys.argv[2]).touch()
while not Path(sys.argv[3]).exists():
    time.sleep(0.01)
taken = []
while (trial_id := study._pop_waiting_trial_id()) is not None:
    taken.append(trial_id)
print(json.dumps(taken))
"""


@pytest.mark.parametrize("backend", ["sqlite", "journal"])
def test_two_processes_draining_one_queue_never_take_the_same_trial(backend: str, tmp_path: Path) -> None:
    """Optuna claims a queued trial by reading WAITING and then writing RUNNING under SELECT ... FOR UPDATE,
    which SQLite ignores: before `make_storage` took the write lock at BEGIN, two processes started together
    took 7 of 300 queued trials both (and ran them twice: 'Cannot tell a COMPLETE trial'), and 4, 9 and 11 of
    the 100 queued here in three runs. (Each claim reads every waiting trial: 300 took 20 s to drain, 100 take 4 s.)
    On a journal, every process appends its claim and the first claim in the file wins."""
    import json
    import sys

    url = f"sqlite:///{tmp_path / 'queue.db'}" if backend == "sqlite" else f"journal:{tmp_path / 'queue.journal'}"
    study = optuna.create_study(study_name="queue", storage=make_storage(url))
    for i in range(100):
        study.enqueue_trial({"x": i}, skip_if_exists=False)
    go = tmp_path / "go"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", POP_ALL, url, str(tmp_path / f"ready-{i}"), str(go)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready-{i}").exists() for i in range(2)):  # both loaded: start them together
        assert time.monotonic() < deadline and all(p.poll() is None for p in processes)
        time.sleep(0.05)
    go.touch()
    taken = [json.loads(p.communicate(timeout=300)[0]) for p in processes]
    assert sorted(taken[0] + taken[1]) == sorted(t._trial_id for t in study.get_trials())  # every trial, each once
