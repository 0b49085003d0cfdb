"""docs/tracking.md's screenshots of MLflow and optuna-dashboard, from a fresh store, as a first-time user sees them.

    python docs/screenshots.py                 # plain `tune` in a fresh folder, then shoot
    python docs/screenshots.py --project DIR   # shoot an existing project (a folder holding mlruns/)

`python -m benchmarks.first_tune` runs it on the fresh clone whose run the README describes, so every picture on the
site is that run's (`--figures-only` where no browser is installed: the parent run's pareto.png and heldout.png) and
its record keeps each picture's digest (`--record`), which the suite checks against docs/*.png.

MLflow: the run list (`tune ui`'s link), the study's parent run, the winner's run, a pruned trial's run, the compare
view of the complete trials, the registered model; optuna-dashboard: the study page (history), the trial list and a
pruned trial. What each shows is tested against the stores in the suite (docs/tracking.md says where).

It starts `tune ui` and `optuna-dashboard` on loopback ports, opens each page in a fresh headless Chromium
(no stored browser state: a first visit) through Playwright, and writes docs/*.png. It needs Playwright's
Python package and a Chromium (Debian: `apt-get install -y chromium`; set CHROMIUM to another binary) and
optuna-dashboard (`pip install -e '.[test]'`). Nothing is clicked that a user would not click: the run list
gets its columns from the view `tune ui`'s link opens (an experiment tag posfair writes).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import requests

DOCS = Path(__file__).resolve().parent
CHROMIUM = os.environ.get("CHROMIUM", "/usr/lib/chromium/chromium")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def serving(command: list[str], cwd: Path, health: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A server in its own process group until it answers `health`; the whole group is stopped afterwards."""
    with log.open("wb") as handle:
        process = subprocess.Popen(command, cwd=cwd, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{command[:3]} did not start: {log.read_text(errors='replace')[-2000:]}")
            try:
                if requests.get(health, timeout=2).ok:
                    break
            except requests.RequestException:
                time.sleep(1)
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)


def tune_fresh(folder: Path) -> None:
    """The default run the screenshots show: plain `tune` (MiniLM on WikiPos-dev, its budget, the four held-out
    sets)."""
    subprocess.run([sys.executable, "-m", "tuner.cli"], cwd=folder, check=True)


SCREENSHOTS = (
    "mlflow-runs.png",
    "mlflow-parent-run.png",
    "mlflow-trial.png",
    "mlflow-pruned-trial.png",
    "mlflow-compare.png",
    "mlflow-registered-model.png",
    "optuna-dashboard.png",
    "optuna-dashboard-trials.png",
    "optuna-dashboard-pruned-trial.png",
)
FIGURES = ("pareto.png", "heldout.png")  # the parent run's own, copied as logged


def digest(path: Path) -> str:
    """A picture's SHA-256, as the first-tune record keeps it."""
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def copy_figures(project: Path) -> None:
    """The parent run's pareto.png and heldout.png, as logged, to docs/ (no browser needed)."""
    storage = f"sqlite:///{project / 'mlruns' / 'optuna.db'}"
    (name,) = [n for n in optuna.get_all_study_names(storage) if "~" not in n]
    copy_scatter(project, parent_run(project, name))


def shoot(project: Path) -> None:
    from playwright.sync_api import sync_playwright

    os.chdir(project)  # the default store records its artifacts relative to the folder holding mlruns/
    storage = f"sqlite:///{project / 'mlruns' / 'optuna.db'}"
    (name,) = [n for n in optuna.get_all_study_names(storage) if "~" not in n]  # not the export marker (`claim_export`)
    study = optuna.load_study(study_name=name, storage=storage)
    winner = study.user_attrs["winner"]
    mlflow_port, dashboard_port = free_port(), free_port()
    logs = Path(tempfile.mkdtemp(prefix="screenshots-"))
    ui = [sys.executable, "-m", "tuner.cli", "ui", "--port", str(mlflow_port)]
    dashboard = [
        str(Path(sys.executable).with_name("optuna-dashboard")),
        storage,
        "--port",
        str(dashboard_port),
        "--host",
        "127.0.0.1",
    ]
    with (
        serving(ui, project, f"http://127.0.0.1:{mlflow_port}/health", logs / "ui.log"),
        serving(dashboard, project, f"http://127.0.0.1:{dashboard_port}/api/studies", logs / "dashboard.log"),
        sync_playwright() as playwright,
    ):
        link = next(line for line in (logs / "ui.log").read_text().splitlines() if line.startswith("MLflow UI: "))
        runs_url = link.split()[2]
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1700, "height": 900})  # a new context: no stored view or columns
        mlflow_run_list(page, runs_url)
        parent = parent_run(project, name)
        mlflow_parent_run(page, runs_url, parent)
        copy_scatter(project, parent)
        mlflow_winner_and_model(page, runs_url, project, name)
        mlflow_pruned_and_compare(page, runs_url, project, name)
        dashboard_pages(page, f"http://127.0.0.1:{dashboard_port}", study)
        browser.close()
    print(f"winner: {winner}")


def mlflow_run_list(page: object, runs_url: str) -> None:
    """The run list as `tune ui`'s link opens it (model-training view, posfair's shared view with its
    columns), the study's row expanded to show its trials, the assistant panel closed."""
    page.goto(runs_url)
    expand = page.locator("button[data-component-id$='runnamecellrenderer.tsx_46']").first
    expand.wait_for(timeout=60_000)
    close_assistant(page)
    expand.click()
    page.get_by_text("trial-0 · baseline").first.wait_for(timeout=30_000)
    page.wait_for_timeout(1500)
    page.screenshot(path=DOCS / "mlflow-runs.png")


def close_assistant(page: object) -> None:
    close = page.locator("button[data-component-id='mlflow.assistant.chat_panel.close']")
    if close.count():
        close.first.click()


def mlflow_page(page: object, url: str, shown: str, name: str) -> None:
    """One MLflow page, once `shown` is on it and the assistant panel is out of the way, to docs/NAME."""
    page.goto(url)
    page.get_by_text(shown).first.wait_for(timeout=60_000)
    close_assistant(page)
    page.wait_for_timeout(1500)
    page.screenshot(path=DOCS / name)


def mlflow_parent_run(page: object, runs_url: str, parent_id: str) -> None:
    """The study's parent run: its description names the winner and the held-out result."""
    mlflow_page(page, runs_url.replace("/runs?", f"/runs/{parent_id}?"), "Winner: trial", "mlflow-parent-run.png")


def store(project: Path) -> object:
    """A client on the project's default MLflow store."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{project / 'mlruns' / 'mlflow.db'}")


def study_run(project: Path, study: str, tag: str) -> object:
    """The one run of `study` that carries `tag` (e.g. ``tags.`posfair.role` = 'study'``)."""
    client = store(project)
    experiment = client.get_experiment_by_name("posfair")
    (run,) = client.search_runs([experiment.experiment_id], f"tags.`posfair.study` = '{study}' and {tag}")
    return run


def parent_run(project: Path, study: str) -> str:
    """The study's MLflow parent run id."""
    return study_run(project, study, "tags.`posfair.role` = 'study'").info.run_id


def mlflow_winner_and_model(page: object, runs_url: str, project: Path, study: str) -> None:
    """The winner's trial run (its description and duration) and the registered model with its `champion` alias."""
    run = study_run(project, study, "tags.`posfair.winner` = 'yes'")
    mlflow_page(page, runs_url.replace("/runs?", f"/runs/{run.info.run_id}?"), "Winner (trial", "mlflow-trial.png")
    (model,) = store(project).search_registered_models()
    mlflow_page(
        page,
        runs_url.split("#")[0] + f"#/models/{model.name}?workflowType=machine_learning",
        "champion",
        "mlflow-registered-model.png",
    )


def mlflow_pruned_and_compare(page: object, runs_url: str, project: Path, study: str) -> None:
    """A pruned trial's run (FINISHED, its reason, its figures per structure and under `pruned/`), and MLflow's compare
    view of the complete trials, with the axes a user picks: the knobs and the objective."""
    client = store(project)
    experiment = client.get_experiment_by_name("posfair")
    runs = client.search_runs(
        [experiment.experiment_id], f"tags.`posfair.study` = '{study}' and tags.`posfair.role` = 'trial'"
    )
    pruned = [r for r in runs if r.data.tags.get("posfair.state") == "PRUNED"]
    if pruned:
        first = min(pruned, key=lambda r: int(r.data.tags["posfair.trial"]))
        mlflow_page(
            page, runs_url.replace("/runs?", f"/runs/{first.info.run_id}?"), "pruned after", "mlflow-pruned-trial.png"
        )
    complete = [r.info.run_id for r in runs if r.data.tags.get("posfair.state") == "COMPLETE"]
    ids = ",".join(f'"{run}"' for run in complete)
    base = runs_url.split("#")[0]
    page.goto(
        f'{base}#/compare-runs?runs=[{ids}]&experiments=["{experiment.experiment_id}"]&workflowType=machine_learning'
    )
    page.get_by_text("Parallel Coordinates Plot").first.wait_for(timeout=60_000)
    close_assistant(page)
    page.wait_for_timeout(3000)
    page.screenshot(path=DOCS / "mlflow-compare.png", full_page=True)


def copy_scatter(project: Path, parent_id: str) -> None:
    """The parent run's PSI–HM scatter and held-out profiles, as logged, to docs/pareto.png and docs/heldout.png."""
    client = store(project)
    for name in ("pareto.png", "heldout.png"):
        local = Path(client.download_artifacts(parent_id, name, tempfile.mkdtemp(prefix="figure-")))
        (DOCS / name).write_bytes(local.read_bytes())


def dashboard_pages(page: object, base: str, study: optuna.Study) -> None:
    """The study page (history with pruned trials included, its default; the study attributes, `winner` first), the
    trial list (with the first trial open), and the first pruned trial's page with its `feasible` attribute."""
    page.goto(f"{base}/dashboard/studies/{study._study_id}")
    page.get_by_text("Best Trial").first.wait_for(timeout=60_000)
    page.get_by_text("winner").first.wait_for(timeout=30_000)
    # sticky header
    page.evaluate("document.querySelectorAll('*').forEach(e => { e.scrollTop = 0; }); window.scrollTo(0, 0)")
    page.wait_for_timeout(3000)
    page.screenshot(path=DOCS / "optuna-dashboard.png", full_page=True)
    # "Trials (List)": each trial's state, the first one open
    page.goto(f"{base}/dashboard/studies/{study._study_id}/trials")
    page.get_by_text("Best Trial").first.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)
    page.screenshot(path=DOCS / "optuna-dashboard-trials.png")
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED and "feasible" in t.user_attrs]
    if pruned:
        page.goto(f"{base}/dashboard/studies/{study._study_id}/trials?numbers={pruned[0].number}")
        page.get_by_text(pruned[0].user_attrs["feasible"][:20]).first.wait_for(timeout=60_000)
        page.wait_for_timeout(1500)
        # the metrics JSON is one long line: the viewport only
        page.screenshot(path=DOCS / "optuna-dashboard-pruned-trial.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, help="a folder holding mlruns/ (default: tune one in a fresh folder)")
    parser.add_argument(
        "--figures-only", action="store_true", help="only copy the parent run's pareto.png and heldout.png"
    )
    parser.add_argument("--record", type=Path, help="write {picture: SHA-256} of every picture written here, as JSON")
    args = parser.parse_args()
    project = args.project
    if project is None:
        project = Path(tempfile.mkdtemp(prefix="posfair-screenshots-"))
        tune_fresh(project)
    if args.figures_only:
        copy_figures(project.resolve())
    else:
        shoot(project.resolve())
    if args.record is not None:
        written = FIGURES if args.figures_only else (*SCREENSHOTS, *FIGURES)
        args.record.write_text(json.dumps({name: digest(DOCS / name) for name in written}, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
