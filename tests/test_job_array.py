"""A study run as a scheduler's job array on one journal file: every task starts the same `tune run --job-array`
command, the array index in its environment (Slurm's SLURM_ARRAY_TASK_ID, a Kubernetes Indexed Job's
JOB_COMPLETION_INDEX) makes the first task the coordinator and the others workers."""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from tests import forkserver
from tests.test_accounting import COMPLETE, FAIL, RUNNING, environment, trials_of
from tests.test_study import write_dataset
from tests.test_tracking import dashboard_api
from tests.test_workers import command, done, finished_trial_numbers, study_backend
from tuner.cli.app import app
from tuner.common.options import ArrayTask
from tuner.tracking.registry import registered_name
from tuner.tuning.settings import (
    TuneSettings,
    job_array_task,
    local_worker_identity,
    process_identity,
    settings_in_force,
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("job-array") / "data", docs=10)


@pytest.mark.parametrize(
    ("environ", "index"),
    [
        ({"SLURM_ARRAY_TASK_ID": "0"}, 0),
        ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "0"}, 3),
        ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "1"}, 0),  # sbatch --array=1-4: task 1 is the first
        ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_MIN": "1"}, 3),
        ({"JOB_COMPLETION_INDEX": "2"}, 2),
    ],
)
def test_the_task_index_is_counted_from_the_arrays_first_task(environ: dict[str, str], index: int) -> None:
    task = ArrayTask.from_environment(environ)
    assert task.index == index and task.coordinates == (index == 0)


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        ({}, "no job array index in the environment (SLURM_ARRAY_TASK_ID from sbatch --array, or JOB_COMPLETION_INDEX"),
        ({"SLURM_ARRAY_TASK_ID": "x"}, "SLURM_ARRAY_TASK_ID='x' is not a task index"),
        ({"JOB_COMPLETION_INDEX": "-1"}, "JOB_COMPLETION_INDEX='-1' is not a task index"),
        (
            {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_MIN": "2"},
            "SLURM_ARRAY_TASK_ID=0 is below SLURM_ARRAY_TASK_MIN=2",
        ),
    ],
)
def test_a_missing_or_malformed_array_index_is_named(environ: dict[str, str], said: str) -> None:
    with pytest.raises(ValueError, match="--job-array: ") as error:
        ArrayTask.from_environment(environ)
    assert said in str(error.value)


def test_the_first_task_coordinates_and_every_other_runs_trials_with_a_sampler_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    roles = {}
    for task in ("1", "2", "3"):
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", task)
        monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "1")
        settings = TuneSettings(array_task=job_array_task(True, False))
        roles[task] = (settings.worker, process_identity(settings), settings_in_force(settings)["job_array"])
        assert replace(settings, trials=3).worker == settings.worker  # a changed copy keeps its role
    assert roles == {
        "1": (False, "0", "task 0 of the array (SLURM_ARRAY_TASK_ID=1, first 1): coordinates the study"),
        "2": (True, "array-1", "task 1 of the array (SLURM_ARRAY_TASK_ID=2, first 1): runs trials (as --worker)"),
        "3": (True, "array-2", "task 2 of the array (SLURM_ARRAY_TASK_ID=3, first 1): runs trials (as --worker)"),
    }
    assert job_array_task(False, False) is None and settings_in_force(TuneSettings())["job_array"] == "no"


def test_job_array_and_worker_together_are_refused_before_any_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    result = CliRunner().invoke(app, ["run", "--job-array", "--worker", "--trials", "1"])
    assert (
        result.exit_code == 2
        and "--job-array gives every task its role itself (the first coordinates); drop --worker"
        in " ".join(result.output.split())
    )


def test_local_workers_of_different_processes_never_share_an_identity() -> None:
    """A task of the array with --workers 2 numbered its local worker 1, as the coordinator numbers its own: two
    processes seeded their samplers alike and drew the same trials."""
    processes = ["0", "array-1", "array-2", "host:12"]
    identities = processes + [local_worker_identity(parent, n) for parent in processes for n in (1, 2)]
    assert len(set(identities)) == len(identities)
    assert [local_worker_identity("0", n) for n in (1, 2)] == ["1", "2"]  # the coordinator's, as before


TRIALS = 24  # the workers set up after the coordinator's baseline: with 8 trials of a tiny model on idle cores the
# coordinator finished the study alone before any worker ran a trial
TASKS = 4  # the coordinator and three workers


def killed_outside_a_write(process: subprocess.Popen, lock: Path) -> bool:
    """SIGKILL `process` unless it holds the journal's lock (it is stopped while that is checked): a writer killed
    inside a write stops every process's writes for the lock's grace period (`JOURNAL_LOCK_SECONDS`), which
    costs this test 30 s and is tested where it is decided (tests/test_journal.py)."""
    process.send_signal(signal.SIGSTOP)
    if lock.is_symlink():  # someone holds it, maybe the stopped process: let it go on and try again later
        process.send_signal(signal.SIGCONT)
        return False
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    return True


def test_a_job_array_on_one_journal_counts_every_trial_once_when_a_worker_is_killed_mid_trial(
    tiny_model_dir, data: Path, tmp_path: Path
) -> None:
    """Four array tasks on one journal file, the same command each; one worker task is SIGKILLed while it runs a
    trial. The others finish the study with exactly the requested trials, the killed one failed and run again
    once with what it had drawn, one MLflow run per complete trial, and one export by the first task."""
    storage, tracking, name = study_backend("journal", tmp_path)
    cmd = command(
        tiny_model_dir("bert"),
        data,
        storage,
        tracking,
        TRIALS,
        "--job-array",
        "--output",
        str(tmp_path / "best.yaml"),
        heartbeat=2,
    )
    lock = tmp_path / "study.journal.lock"
    logs = [tmp_path / f"task-{i}.log" for i in range(TASKS)]
    tasks = []
    for i, log in enumerate(logs):
        with log.open("w") as out:
            env = {**environment(tmp_path), "SLURM_ARRAY_TASK_ID": str(i), "SLURM_ARRAY_TASK_MIN": "0"}
            tasks.append(forkserver.popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT))
    try:
        workers = {task.pid: task for task in tasks[1:]}
        killed, deadline = None, time.monotonic() + 300
        while killed is None:
            assert time.monotonic() < deadline and all(t.poll() is None for t in tasks), (
                "no worker task was caught running a trial"
            )
            for trial in trials_of(storage, name):
                owner = trial.user_attrs.get("owner", {})
                if trial.state == RUNNING and trial.number >= 2 and owner.get("pid") in workers:
                    victim = workers[owner["pid"]]
                    if killed_outside_a_write(victim, lock):
                        killed = trial.number
                        break
            time.sleep(0.05)
        for task in tasks:
            if task is not victim:
                task.wait(timeout=600)
    finally:
        for task in tasks:
            if task.poll() is None:
                task.kill()
    outputs = {i: " ".join(log.read_text().split()) for i, log in enumerate(logs)}
    for i, task in enumerate(tasks):
        if task is not victim:
            assert task.returncode == 0, outputs[i][-3000:]

    trials = trials_of(storage, name)
    assert len({t.number for t in trials}) == len(trials)
    assert trials[killed].state == FAIL
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == killed]
    assert [t.state for t in retried] == [COMPLETE] and trials[killed].params.items() <= retried[0].params.items()
    assert sum(done(t) for t in trials) == TRIALS and not [t for t in trials if t.state == RUNNING]
    assert len({t.user_attrs["worker"] for t in trials if done(t)}) >= 2  # the trials really were shared
    assert finished_trial_numbers(tracking, name) == sorted(t.number for t in trials if t.state == COMPLETE)

    assert [i for i, output in outputs.items() if "exported config:" in output] == [0]  # the first task, once
    assert (tmp_path / "best.yaml").exists()
    client = MlflowClient(tracking, registry_uri=tracking)
    model = registered_name(str(tiny_model_dir("bert")))
    assert (
        len([v for v in client.search_model_versions(f"name = '{model}'") if v.tags.get("posfair.study") == name]) == 1
    )

    # optuna-dashboard reads the journal by its path, as on its command line
    journal = storage.removeprefix("journal:")
    [shown] = [
        s["study_id"] for s in dashboard_api(journal, "/api/studies")["study_summaries"] if s["study_name"] == name
    ]
    assert [(t["number"], t["state"]) for t in dashboard_api(journal, f"/api/studies/{shown}")["trials"]] == [
        (t.number, t.state.name.capitalize()) for t in trials
    ]


def test_a_worker_task_says_what_it_waits_for_and_for_how_long_then_gives_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A task other than the coordinator waited up to an hour without a word when no coordinator came (in the
    Kubernetes example: pods 1-4 after pod 0 failed). It says what it waits for and until when, at once and then
    periodically, and gives up naming the fix."""
    import logging

    import optuna

    from tuner.common.messages import UserError
    from tuner.tuning.hm_floor import await_floor
    from tuner.tuning.storage import make_storage

    storage = f"journal:{tmp_path / 'study.journal'}"
    study = optuna.create_study(study_name="s", storage=make_storage(storage))
    task = TuneSettings(array_task=ArrayTask(2, "JOB_COMPLETION_INDEX=2"))
    start = time.monotonic()
    with caplog.at_level(logging.INFO), pytest.raises(UserError) as error:
        await_floor(study, task, timeout=2.5, every=1.0, poll=0.1)
    said = [record.getMessage() for record in caplog.records if record.name.startswith("tuner")]
    assert said[0] == (
        "waiting for task 0 of the job array (the coordinator) to measure the baseline and set the HM floor of study "
        "'s'; giving up after 2 s"
    ), said
    assert len([line for line in said if line.startswith("still waiting for task 0 of the job array")]) >= 2, said
    assert "no coordinator set the HM floor of study 's'" in str(error.value) and "task 0" in str(error.value)
    assert time.monotonic() - start < 10
    study.set_user_attr("floor_value", 0.25)  # once it is set, the wait ends at once and says nothing
    caplog.clear()
    assert await_floor(study, task, timeout=2.5) == 0.25 and not [
        r for r in caplog.records if r.name.startswith("tuner")
    ]
