"""`tune ui`'s server: `mlflow ui` on a store, in its own process group, and the link to the model-training view."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping

from mlflow.tracking import MlflowClient

from tuner.common.files import ARTIFACTS
from tuner.tracking.display import VIEW_KEY, VIEW_TAG
from tuner.tracking.store import local_store


def ui_command(uri: str, host: str, port: int) -> list[str]:
    """`mlflow ui` on a store; started in the working folder, where the default store's relative paths resolve.
    One server worker: the UI serves one person's browser, and each of MLflow's default four imports the whole
    server at start (on 2 cores, four took about twice as long to answer as one)."""
    import sys

    command = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        uri,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    store = local_store(uri)
    if store is not None:
        command += ["--default-artifact-root", str((store.parent / ARTIFACTS.name).resolve())]
    return command


JOB_EXECUTION_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"


def ui_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment `mlflow ui` runs in: MLflow's job runner off unless the user set it. posfair's runs use no
    MLflow job (GenAI scorers, trace roll-ups), and the runner starts eight processes that each import MLflow: the
    UI answered in 10.3 s against 12.8 s with it, having used 10 s of CPU against 35 (`benchmarks/ui_start.py`)."""
    return {**environ, JOB_EXECUTION_ENV: environ.get(JOB_EXECUTION_ENV, "false")}


def serve_ui(command: list[str], grace: float = 10.0) -> int:
    """Run `mlflow ui` in its own process group until it exits or this process gets SIGTERM / SIGINT; then
    stop the whole group (the server and the workers it forks; SIGKILL after `grace` seconds), so no
    worker outlives `tune ui` and keeps the port. Returns the server's exit code (128 + signal if stopped)."""
    import signal

    server = subprocess.Popen(command, start_new_session=True, env=ui_environment(os.environ))
    stopped: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        stopped.append(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while server.poll() is None and not stopped:
            time.sleep(0.2)
        _stop_group(server, grace)
        server.wait()
        return 128 + stopped[0] if stopped else server.returncode
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop_group(leader: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM to every process of the leader's group, SIGKILL to what is left after `grace` seconds; the
    leader is reaped on the way (a zombie would still count as a member)."""
    import signal

    for signum, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        deadline = time.monotonic() + wait
        try:
            os.killpg(leader.pid, signum)
        except ProcessLookupError:
            return
        while time.monotonic() < deadline:
            leader.poll()
            try:
                os.killpg(leader.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def training_view_url(uri: str, host: str, port: int) -> str:
    """The experiment's run list in MLflow's model-training view, with posfair's columns (`VIEW_TAG`).
    MLflow 3.17's UI picks the view from the URL's `workflowType` first, then from the browser's last
    choice (default: GenAI); the experiment's `mlflow.experimentKind` tag does not decide it, so the link
    carries it."""
    found = None
    store = local_store(uri)
    if store is None or store.exists():
        try:
            found = MlflowClient(f"sqlite:///{store.resolve()}" if store else uri).get_experiment_by_name("posfair")
        except Exception:  # noqa: BLE001 - the link is a convenience; the UI itself reports a broken store
            found = None
    if found is None:
        return f"http://{host}:{port}/#/experiments?workflowType=machine_learning"
    view = f"&viewStateShareKey={VIEW_KEY}" if VIEW_TAG in found.tags else ""
    return f"http://{host}:{port}/#/experiments/{found.experiment_id}/runs?workflowType=machine_learning{view}"
