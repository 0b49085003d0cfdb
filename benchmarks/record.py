"""The JSON record a benchmark leaves in docs/results/: its results with what makes them a measurement.

Every figure the documentation shows is rendered from one of these files (`benchmarks.render`), so each carries
the command that produced it, the commit it ran on, when, and on what machine: a figure is read with its
circumstances, never typed by hand.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tuner.common.files import write_atomically

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
"""Where the records the documentation renders are committed."""


@dataclass(frozen=True)
class Device:
    """The machine a benchmark ran on, as far as its figures depend on it."""

    cpu: str
    cores: int
    memory_gib: float
    gpu: str | None
    torch: str | None
    python: str
    load_average: tuple[float, float, float]  # when the record was written: other jobs slow a shared machine down

    @classmethod
    def here(cls) -> Device:
        import psutil

        try:
            import torch

            version: str | None = torch.__version__
            gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        except ImportError:
            version, gpu = None, None
        return cls(
            cpu=_cpu_model(),
            cores=os.cpu_count() or 0,
            memory_gib=round(psutil.virtual_memory().total / 2**30, 1),
            gpu=gpu,
            torch=version,
            python=platform.python_version(),
            load_average=tuple(round(x, 2) for x in os.getloadavg()),  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class Record:
    """One benchmark run: `results` is the benchmark's own JSON-ready dict."""

    benchmark: str
    command: str
    commit: str
    date: str
    device: Device
    results: dict[str, Any]


def commit(root: Path = ROOT) -> str:
    """The checkout's HEAD, marked `-dirty` when tracked files differ from it (the figures are then not that
    commit's)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def write(path: Path, benchmark: str, command: str, results: dict[str, Any], measured: Path | None = None) -> Record:
    """Write `results` with the command, commit, date (UTC) and device to `path`, whole or not at all; the commit is
    the checkout `measured` (default: this one), where a benchmark ran another checkout."""
    record = Record(
        benchmark,
        command,
        commit(measured or ROOT),
        datetime.now(UTC).isoformat(timespec="seconds"),
        Device.here(),
        results,
    )
    write_atomically(path, json.dumps(asdict(record), indent=1, ensure_ascii=False) + "\n")
    return record


def amend(path: Path, data: dict[str, Any]) -> None:
    """Rewrite a record read with `read` whose results gained figures read from what its run left (stores, files):
    its command, commit, date and device stay those of the measurement."""
    write_atomically(path, json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def read(path: Path) -> dict[str, Any]:
    """A record as written by `write`."""
    return json.loads(path.read_text(encoding="utf-8"))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
