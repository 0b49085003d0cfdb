"""The fork server runs a `tune` command as a fresh interpreter would: same output, same exit status."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from tests import forkserver


def test_a_command_prints_and_exits_as_it_does_in_a_fresh_interpreter(tmp_path: Path) -> None:
    """An option error (argv reaches the command, its exit status comes back) and a relative path (the
    child works in the command's folder, not the server's)."""
    (tmp_path / "space.yaml").write_text("variant: [nonsense]\n")
    for args in (["run", "--trials", "0"], ["run", "--space", "space.yaml"]):
        command = [*forkserver.TUNE_COMMAND, *args]
        fresh = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        forked = forkserver.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert forkserver.is_tune(command) and fresh.returncode != 0
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_a_signal_ends_the_forked_process_as_it_ends_a_fresh_one(tmp_path: Path) -> None:
    """SIGKILL goes to the command's own pid and comes back as Popen's -9."""
    command = [*forkserver.TUNE_COMMAND, "ui", "--port", "1"]  # waits for nothing that comes: killed first
    process = forkserver.popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert isinstance(process, forkserver.TuneProcess) and process.pid > 0
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL
