"""What a new user's first `make tune` costs and prints: a fresh clone, `make setup`, then `make tune`.

Run from the repository root (it clones the committed HEAD, so commit first):

    .venv/bin/python -m benchmarks.first_tune                      # → docs/results/first-tune.json

Measured: the wall time of `make setup` and of `make tune`; the peak resident memory of `make tune`'s process
tree (the sum over its processes, sampled every half second); what the run leaves on disk in `mlruns/` and
`.venv/`; and what it printed. Kept from the study: the held-out table of every set (no calibration, the paper
default and the winner, with their 95% paired-bootstrap intervals: the run's `summary.json` artifact), the
trials it ran and the budget that ended it, and the path of the exported YAML. The README's prerequisites,
example output and results table, and the documentation's default-run tables, are rendered from this record, and
the site's pictures of the run (docs/screenshots.py: the screenshots where a browser is installed, the parent run's
figures always) are written into docs/ from the same clone, their digests kept here.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from benchmarks import record

REPOSITORY = Path(__file__).resolve().parent.parent
SAMPLE_SECONDS = 0.5


def tree_rss(process: psutil.Process) -> int:
    """Resident bytes of a process and all its descendants now (0 once it is gone)."""
    total = 0
    try:
        members = [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for member in members:
        try:
            total += member.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def timed(command: list[str], cwd: Path) -> dict[str, Any]:
    """Run `command`, returning its exit status, wall seconds, peak tree memory and both streams."""
    began = time.perf_counter()
    child = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        watched = psutil.Process(child.pid)
        while not done.wait(SAMPLE_SECONDS):
            peak = max(peak, tree_rss(watched))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = child.communicate()
    done.set()
    sampler.join()
    return {
        "returncode": child.returncode,
        "seconds": round(time.perf_counter() - began, 1),
        "peak_rss_bytes": peak,
        "stdout": stdout,
        "stderr": stderr,
    }


def disk_bytes(folder: Path) -> int:
    """Bytes of the files under `folder` (links not followed, each hard-linked file once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            info = os.lstat(os.path.join(root, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    return total


def study_facts(storage: str, name: str | None = None) -> dict[str, Any]:
    """The study a run made in `storage` (its only one, or `name`): its name, its trials by Optuna state and as
    every store counts them (`TrialCounts`: the console, MLflow and optuna-dashboard's notes say the same), and the
    budget record that ended it."""
    import optuna

    from tuner.common.trials import trial_counts

    names = [s.study_name for s in optuna.get_all_study_summaries(storage) if "~" not in s.study_name]
    study = optuna.load_study(study_name=name or names[0], storage=storage)
    states: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False):
        states[trial.state.name] = states.get(trial.state.name, 0) + 1
    return {
        "name": study.study_name,
        "trials_by_state": states,
        "counts": trial_counts(study).to_dict(),
        "user_attrs": {k: v for k, v in study.user_attrs.items() if k.startswith("budget")},
    }


def exported_path(stderr: str) -> str:
    """The export's path as the run printed it (`exported config: PATH`)."""
    for line in stderr.splitlines():
        if "exported config:" in line:
            return line.split("exported config:", 1)[1].strip()
    raise RuntimeError("the run printed no exported config")


CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/lib/chromium/chromium"))


def site_pictures(clone: Path) -> dict[str, str]:
    """The site's pictures of this run, written into docs/ by docs/screenshots.py: every screenshot where Playwright
    and a Chromium are installed, else the parent run's pareto.png and heldout.png alone; their SHA-256 by name."""
    import importlib.util
    import json

    browser = importlib.util.find_spec("playwright") is not None and CHROMIUM.exists()
    with tempfile.TemporaryDirectory(prefix="posfair-pictures-") as folder:
        written = Path(folder) / "pictures.json"
        command = [
            sys.executable,
            str(REPOSITORY / "docs" / "screenshots.py"),
            "--project",
            str(clone),
            "--record",
            str(written),
        ]
        subprocess.run([*command, *([] if browser else ["--figures-only"])], cwd=REPOSITORY, check=True)
        return json.loads(written.read_text(encoding="utf-8"))


def measure(clone: Path) -> dict[str, Any]:
    """Clone, set up and tune as the README says; everything the documentation shows of a first run."""
    import json

    subprocess.run(["git", "clone", "--quiet", str(REPOSITORY), str(clone)], check=True)
    setup = timed(["make", "setup"], clone)
    if setup["returncode"] != 0:
        raise RuntimeError(f"make setup failed:\n{setup['stderr'][-3000:]}")
    tune = timed(["make", "tune"], clone)
    for stream in ("stdout", "stderr"):  # kept beside the clone: what the run printed outlives a failure below
        (clone.parent / f"tune.{stream}").write_text(tune[stream], encoding="utf-8")
    if tune["returncode"] != 0:
        raise RuntimeError(f"make tune failed:\n{tune['stderr'][-3000:]}")
    summaries = sorted((clone / "mlruns").rglob("summary.json"))
    pictures = site_pictures(clone)
    return {
        "setup_seconds": setup["seconds"],
        "tune_seconds": tune["seconds"],
        "tune_peak_rss_bytes": tune["peak_rss_bytes"],
        "mlruns_bytes": disk_bytes(clone / "mlruns"),
        "venv_bytes": disk_bytes(clone / ".venv"),
        "export": exported_path(tune["stderr"]),
        "study": study_facts(f"sqlite:///{clone / 'mlruns' / 'optuna.db'}"),
        "summary": json.loads(summaries[0].read_text(encoding="utf-8")),
        "pictures": pictures,
        "stdout": tune["stdout"],
        "stderr_tail": tune["stderr"].splitlines()[-40:],
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=record.RESULTS / "first-tune.json", help="where the record goes")
    parser.add_argument(
        "--clone", type=Path, help="an empty folder to clone into (default: a temporary one, removed after)"
    )
    args = parser.parse_args(argv)
    command = "python -m benchmarks.first_tune " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.clone is not None:
        results = measure(args.clone)
        record.write(args.json, "first_tune", command.strip(), results, measured=args.clone)
    else:
        with tempfile.TemporaryDirectory(prefix="posfair-first-tune-") as folder:
            results = measure(Path(folder) / "posfair")
            record.write(args.json, "first_tune", command.strip(), results, measured=Path(folder) / "posfair")
    print(f"{args.json}: make setup {results['setup_seconds']:.0f} s, make tune {results['tune_seconds']:.0f} s")


if __name__ == "__main__":
    main()
