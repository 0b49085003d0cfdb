"""`tune ui` as a user runs it: a real process serving a real store on a loopback port, stopped by a signal."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests
from mlflow.tracking import MlflowClient

from tests import forkserver
from tests.services import free_port
from tuner.tracking.ui import JOB_EXECUTION_ENV, ui_environment


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_tune_ui_stops_its_whole_process_group_on_a_signal(tmp_path: Path, signum: int) -> None:
    store = tmp_path / "mlruns" / "mlflow.db"
    store.parent.mkdir()
    MlflowClient(f"sqlite:///{store}").create_experiment("posfair")
    port = free_port()
    ui = forkserver.popen(
        [sys.executable, "-m", "tuner.cli", "ui", "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    served: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 180
        while True:
            assert ui.poll() is None and time.monotonic() < deadline, "tune ui did not start serving"
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                    break
            except requests.RequestException:
                time.sleep(1)
        served = psutil.Process(ui.pid).children(recursive=True)
        assert served, "mlflow ui runs as a child"
        mlflow = next(p for p in served if "mlflow" in p.cmdline())
        command = mlflow.cmdline()
        assert command[command.index("--workers") + 1] == "1"  # one server worker, for one browser
        assert mlflow.environ()[JOB_EXECUTION_ENV] == "false"  # and no job runner (eight processes importing MLflow)
        ui.send_signal(signum)
        output, _ = ui.communicate(timeout=60)
        assert ui.returncode == 128 + signum, output
        assert (
            output.splitlines()[0].startswith("MLflow UI: http://127.0.0.1:")
            and "workflowType=machine_learning" in output
        )
        with pytest.raises(requests.RequestException):
            requests.get(f"http://127.0.0.1:{port}/health", timeout=2)
        assert [p.pid for p in served if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == [], (
            "a server process outlived tune ui"
        )
    finally:
        if ui.poll() is None:
            ui.kill()
        for process in served:  # what this test started, by id
            if process.is_running():
                process.kill()


def test_the_ui_runs_without_mlflows_job_runner_unless_the_user_asks_for_it() -> None:
    """posfair's runs use no MLflow job; a user who wants the runner sets the variable and keeps it."""
    assert ui_environment({"PATH": "/bin"}) == {"PATH": "/bin", JOB_EXECUTION_ENV: "false"}
    assert ui_environment({JOB_EXECUTION_ENV: "true"})[JOB_EXECUTION_ENV] == "true"
