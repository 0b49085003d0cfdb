"""Real services for fault tests: an `mlflow server` process that a test can kill and restart, and fresh
PostgreSQL databases on the server `.ci/run` starts (tests.ci.require_postgres)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from tuner.tracking.ui import ui_environment


def as_logged(value: float, abs: float = 0.0) -> object:
    """`value` as MLflow stores it: four significant digits (half a unit in the fourth: relative 5e-4), plus
    `abs` for a figure derived from other rounded ones."""
    return pytest.approx(value, rel=5e-4, abs=abs)


def dashboard_api(storage: str, path: str) -> dict:
    """optuna-dashboard's JSON API, called in-process through its WSGI app (what its web page reads)."""
    from wsgiref.util import setup_testing_defaults

    optuna_dashboard = pytest.importorskip("optuna_dashboard")
    environ: dict = {"PATH_INFO": path}
    setup_testing_defaults(environ)
    status: list[str] = []
    body = b"".join(optuna_dashboard.wsgi(storage)(environ, lambda code, headers, *rest: status.append(code)))
    assert status[0].startswith("200"), (status, body[:300])
    return json.loads(body)


START_SECONDS = 240  # a cold `mlflow server` on a busy 2-core machine has taken 46 s to answer


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


WATCHDOG = """
import os, signal, subprocess, sys, time

suite, command = int(sys.argv[1]), sys.argv[2:]
server = subprocess.Popen(command)  # in this process group, as its uvicorn worker will be


def end(*_):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(0, signal.SIGKILL)
    sys.exit(server.returncode or 0)


signal.signal(signal.SIGTERM, end)
while server.poll() is None and os.getppid() == suite:
    time.sleep(0.5)
end()
"""
"""Runs the server as its child and ends the process group with it when the test process is gone: pytest
stopped by SIGTERM (as CI runners and schedulers stop `make test`) runs no fixture's teardown, and the server's
own session keeps the signal from reaching it; a killed pytest leaves this parentless, which it notices."""


class MlflowServer:
    """`mlflow server` on loopback, in its own process group so that a kill takes its workers too, under a
    watchdog (`WATCHDOG`) that ends the group when the test process ends, however it ends."""

    def __init__(self, backend: str, artifacts: Path, log: Path, port: int | None = None) -> None:
        self.backend, self.artifacts, self.log = backend, artifacts, log
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server (again, on the same port and store) and wait until it answers."""
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WATCHDOG,
                    str(os.getpid()),
                    sys.executable,
                    "-m",
                    "mlflow",
                    "server",
                    "--backend-store-uri",
                    self.backend,
                    "--artifacts-destination",
                    str(self.artifacts),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--workers",
                    "1",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=ui_environment(os.environ),  # as `tune ui` serves: without MLflow's job runner
            )
        deadline = time.monotonic() + START_SECONDS
        while not self.healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"mlflow server on {self.uri} did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)

    def healthy(self) -> bool:
        try:
            return requests.get(f"{self.uri}/health", timeout=2).ok
        except requests.RequestException:
            return False

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (the server and its workers) and wait for the server to go."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self.process = None

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


@contextmanager
def running_mlflow_server(backend: str, folder: Path) -> Iterator[MlflowServer]:
    server = MlflowServer(backend, folder / "artifacts", folder / "mlflow-server.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def fresh_postgres_database(server_url: str, prefix: str) -> Iterator[str]:
    """A new, empty database on the server of `server_url`, dropped afterwards; yields its URL."""
    import psycopg

    name = f"{prefix}_{os.getpid()}_{time.time_ns()}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlsplit(server_url)._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
