"""What MLflow's job runner costs `tune ui`: the MLflow server with and without it, side by side.

Run from the repository root:

    .venv/bin/python -m benchmarks.ui_start --repeats 2

Each start serves a fresh SQLite store on a loopback port with `tune ui`'s command (`ui_command`), in the
environment `tune ui` gives it (`ui_environment`: the runner off) or with `MLFLOW_SERVER_ENABLE_JOB_EXECUTION=true`,
alternating. Reported per start: seconds until `/health` answers, the processes of its group a few seconds later,
and the CPU seconds they have used by then (processes that already exited are not counted, so it is a floor).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

from tuner.tracking.ui import JOB_EXECUTION_ENV, ui_command, ui_environment


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start(runner: bool, settle: float) -> tuple[float, int, float]:
    """(seconds until /health answers, processes in the server's group, their CPU seconds) for one start."""
    folder = Path(tempfile.mkdtemp(prefix="ui-start-"))
    port = _free_port()
    environ = ui_environment({**os.environ, **({JOB_EXECUTION_ENV: "true"} if runner else {})})
    began = time.perf_counter()
    server = subprocess.Popen(
        ui_command(f"sqlite:///{folder / 'mlflow.db'}", "127.0.0.1", port),
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError("the MLflow server exited before it answered") from None
                time.sleep(0.2)
        answered = time.perf_counter() - began
        time.sleep(settle)
        leader = psutil.Process(server.pid)
        group = [leader, *leader.children(recursive=True)]
        cpu = sum(sum(p.cpu_times()[:2]) for p in group if p.is_running())
        return answered, len(group), cpu
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="starts of each kind, alternating")
    parser.add_argument("--settle", type=float, default=8.0, help="seconds after /health before counting processes")
    args = parser.parse_args()
    runs: dict[bool, list[tuple[float, int, float]]] = {True: [], False: []}
    for _ in range(args.repeats):
        for runner in (True, False):
            runs[runner].append(start(runner, args.settle))
            answered, processes, cpu = runs[runner][-1]
            print(
                f"job runner {'on ' if runner else 'off'}: answered in {answered:.1f} s, {processes} processes, "
                f"{cpu:.1f} s CPU",
                flush=True,
            )
    for runner, label in ((True, "on (MLflow's default)"), (False, "off (tune ui)")):
        answered = statistics.median(r[0] for r in runs[runner])
        cpu = statistics.median(r[2] for r in runs[runner])
        print(f"median, job runner {label}: answered in {answered:.1f} s, {cpu:.1f} s CPU")


if __name__ == "__main__":
    main()
