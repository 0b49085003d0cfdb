"""The suite's own services end with the suite, however it ends: an `mlflow server` (and its uvicorn worker) that
outlived a SIGTERMed `make test` kept running, orphaned, with its store under the pytest temp folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.services import START_SECONDS

ROOT = Path(__file__).resolve().parents[1]

SUITE = """
import os
import time
from pathlib import Path

from tests.services import running_mlflow_server


def test_serves(tmp_path):
    with running_mlflow_server(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path) as server:
        Path(os.environ["SERVER_GROUP_FILE"]).write_text(str(os.getpgid(server.process.pid)))
        time.sleep(600)
"""


def living(group: int) -> list[str]:
    """The processes of process group `group` that have not ended (zombies, ended but not yet reaped, excepted)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # ended while listed
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            found.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return found


def test_the_suites_mlflow_server_ends_when_the_suite_is_stopped_by_sigterm(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(SUITE, encoding="utf-8")
    group_file = tmp_path / "server-group"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "SERVER_GROUP_FILE": str(group_file),
    }
    suite = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_suite.py")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    group = None
    try:
        deadline = time.monotonic() + START_SECONDS + 60
        while not group_file.exists() or not group_file.read_text():
            assert suite.poll() is None and time.monotonic() < deadline, "the inner suite never started its server"
            time.sleep(0.2)
        group = int(group_file.read_text())
        assert any("mlflow" in command for command in living(group)), living(group)
        suite.send_signal(signal.SIGTERM)  # as a CI runner or a scheduler stops `make test`
        suite.wait(timeout=60)
        deadline = time.monotonic() + 30
        while living(group) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not living(group), f"left running after the suite ended: {living(group)}"
    finally:
        if suite.poll() is None:
            suite.kill()
        if group is not None and living(group):
            os.killpg(group, signal.SIGKILL)
