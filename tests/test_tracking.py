"""MLflow and Optuna as their users expect, on a default-like run: `tune` in a fresh folder with every store
default, its output redirected to a file (no terminal).

What a user sees: the model-training view, runs opened when trials start and closed with their state, the
baseline / paper default / infeasible trials / winner marked and described, metrics on the console's
scale, held-out intervals on the parent run, a registered `champion` that loads and serves the same
vectors as `CalibratedEncoder`, a store that survives being copied, a log file with per-trial progress.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import mlflow
import numpy as np
import optuna
import pytest
import requests
import sqlalchemy
import urllib3
import yaml
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INTERNAL_ERROR, INVALID_PARAMETER_VALUE, TEMPORARILY_UNAVAILABLE
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from tests import forkserver
from tests.ci import MLFLOW
from tests.services import as_logged, dashboard_api, free_port, running_mlflow_server
from tests.test_feasibility import named
from tests.test_study import write_dataset
from tests.tiny import random_texts, tiny_tune_options
from tuner.common.trials import counted, named_constraints
from tuner.engine.encoder import CalibratedEncoder
from tuner.engine.exported import load_exported
from tuner.tracking.display import KIND_TAG, NOTE, TRAINING_KIND, describe_config, significant
from tuner.tracking.registry import USAGE, registered_name
from tuner.tracking.runs import Tracker, TrialRecord
from tuner.tracking.store import DEFAULT_TRACKING_URI, TrackingUnavailableError
from tuner.tuning.search_space import trial_basket_shares

TRIALS = 4
TEXTS = random_texts(5, 20, 60, seed=7)


def tune_command(model: Path, data: Path, *extra: str) -> list[str]:
    """Plain `tune` on the tiny model: every store, the study name and the output left to their defaults; held out:
    a set of other passages beside `data`."""
    held = write_dataset(data.parent / "held", seed=1)
    options = tiny_tune_options(model, data, trials=TRIALS, heldout=f"jsonl:{held}", hm_floor="-50%", bootstrap=50)
    return [*forkserver.TUNE_COMMAND, *options, "--selection", "lowest", *extra]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir) -> dict[str, object]:
    root = tmp_path_factory.mktemp("default-run")
    data = write_dataset(root / "data")
    (root / "space.yaml").write_text("basket_sizes: [8, 16, 128]\n", encoding="utf-8")
    work = root / "project"
    work.mkdir()
    log_file = root / "tune.log"
    with log_file.open("w") as handle:
        done = forkserver.run(
            [*tune_command(tiny_model_dir("bert"), data), "--space", str(root / "space.yaml")],
            cwd=work,
            stdout=handle,
            stderr=subprocess.STDOUT,
            timeout=900,
            env={**os.environ, "COLUMNS": "200"},
        )
    log = log_file.read_text(encoding="utf-8")
    assert done.returncode == 0, log[-4000:]
    exports = list((work / "mlruns" / "exports").glob("*.yaml"))
    assert len(exports) == 1, "the default output is mlruns/exports/STUDY.yaml"
    return {"work": work, "log": log, "yaml": exports[0], "model": tiny_model_dir("bert"), "data": data}


def forget_cached_stores() -> None:
    """MLflow keeps one store (lru_cache) and one pooled engine per URI string per process: the relative
    default URI that this file's clients use from another folder earlier in the session would otherwise answer
    from that folder."""
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as TrackingStore
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    _tracking_store_registry._get_store_with_resolved_uri.cache_clear()
    if registry_utils._model_registry_store_registry is not None:
        registry_utils._model_registry_store_registry._get_store_with_resolved_uri.cache_clear()
    for store in (TrackingStore, RegistryStore):
        engine = store._engine_map.pop(DEFAULT_TRACKING_URI, None)
        if engine is not None:
            engine.dispose()


@pytest.fixture
def client(default_run: dict, monkeypatch: pytest.MonkeyPatch) -> MlflowClient:
    """A client on the default store, from its folder, as `models:/` URIs resolve it there too."""
    forget_cached_stores()
    monkeypatch.chdir(default_run["work"])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", DEFAULT_TRACKING_URI)
    return MlflowClient(DEFAULT_TRACKING_URI, registry_uri=DEFAULT_TRACKING_URI)


def runs_of(client: MlflowClient) -> tuple[object, list]:
    experiment = client.get_experiment_by_name("posfair")
    runs = client.search_runs([experiment.experiment_id], "", max_results=100)
    parent = next(r for r in runs if r.data.tags.get("posfair.role") == "study")
    trials = sorted(
        (r for r in runs if r.data.tags.get("posfair.role") == "trial"), key=lambda r: int(r.data.tags["posfair.trial"])
    )
    return parent, trials


def the_study(work: Path) -> optuna.Study:
    storage = f"sqlite:///{work / 'mlruns' / 'optuna.db'}"
    return optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)


def test_the_log_file_shows_each_trial_with_progress_and_every_phase(default_run: dict) -> None:
    """No terminal: after each trial, under Optuna's own number, a line with its config (pruned or not) and a progress
    line (done of --trials, best feasible so far, elapsed, ETA), and a line per phase."""
    log = default_run["log"]
    messages = [
        " ".join(m.split()) for m in re.split(r"\s(?:INFO|WARNING|ERROR)\s", log)
    ]  # a long one wraps in the file
    study = the_study(default_run["work"])
    ran = [t for t in study.trials if counted(t)]
    for k, trial in enumerate(ran, 1):
        line = re.compile(
            rf"after trial {trial.number}: {k} of {TRIALS} trials done · (best feasible so far: "
            r"trial \d+ \(worst-case PSI [\d.]+, "
            r"HM [\d.]+\)|no feasible trial yet) · elapsed [\dhms ]+ · (ETA [\dhms ]+|ETA after the first calibrating "
            r"trial|trials done)"
        )
        assert any(line.match(m) for m in messages), f"no progress line after trial {trial.number}:\n{log[-3000:]}"
        params = {**trial.params, "layers": trial.user_attrs["layers"], "basket_shares": trial_basket_shares(trial)}
        said = [m for m in messages if re.match(rf"trial {trial.number}[: ]", m)]
        assert sum(describe_config(params, 3) in m for m in said) == 1, (trial.number, said)  # the tiny model: 3 layers
    assert re.search(r"baseline: encoding \d+ documents .*done in", log, re.S)
    assert re.search(r"held-out 1/1: scoring \d configs on jsonl:held \(12 documents, 36 queries\) \.\.\.", log)
    assert re.search(r"held-out 1/1: .* done in [\dhms ]+", log)
    assert "export: writing the winner's YAML and registering it in MLflow ... " in log
    assert "\r" not in log  # no progress bar redrawn into a file


def test_the_settings_table_shows_the_defaults_in_force(default_run: dict) -> None:
    settings = default_run["log"].split("tune: settings", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\s*([a-z-]+)\s{2,}(.*?)\s*$", settings, re.M))
    work = default_run["work"]
    assert rows["storage"] == f"sqlite:///{work / 'mlruns' / 'optuna.db'}"
    assert rows["tracking-uri"].startswith(f"sqlite:///mlruns/mlflow.db  ({work / 'mlruns' / 'mlflow.db'}")
    name = f"{default_run['model'].name}--jsonl:{default_run['data']}--seed0"
    assert rows["study-name"] == re.sub(r"[^A-Za-z0-9._-]+", "_", name)
    assert rows["output"] == f"mlruns/exports/{rows['study-name']}.yaml"
    assert "None" not in (rows["storage"], rows["tracking-uri"], rows["output"], rows["study-name"])
    assert "None" not in settings and "SearchSpace(" not in settings, "an unset option says what it means"
    assert rows["general"] == "none: no general-retrieval check"
    assert (
        rows["space"] == "λ 0–1 in steps of 0.05; layers last, 25%, 50%; baskets 8, 16, 128; uniform, cls_soft, "
        "cls_hard (w 0.1–0.5); basket shares equal"
    )


def test_the_experiment_opens_in_the_model_training_view_with_a_description(client: MlflowClient) -> None:
    experiment = client.get_experiment_by_name("posfair")
    assert experiment.tags[KIND_TAG] == TRAINING_KIND == "custom_model_development"
    assert "Position Sensitivity Index" in experiment.tags[NOTE]
    # the selection rule, in the words of the code that applies it, the default marked
    from objectives.selection import RULES, describe_selection_rule
    from tuner.tuning.settings import TuneSettings

    for rule in RULES:
        default = " (the default)" if rule == TuneSettings().selection else ""
        assert f"- {rule}{default}: {describe_selection_rule(rule)}" in experiment.tags[NOTE]


def test_the_run_list_view_tune_ui_links_to_shows_columns_every_finished_run_has(client: MlflowClient) -> None:
    """The shared view's columns are metrics the trials (and the study's row) really carry: none is empty."""
    from tuner.tracking.display import VIEW_TAG
    from tuner.tracking.ui import training_view_url

    experiment = client.get_experiment_by_name("posfair")
    columns = json.loads(experiment.tags[VIEW_TAG])["selectedColumns"]
    parent, trials = runs_of(client)
    for column in columns:
        name = column.removeprefix("metrics.`").removesuffix("`")
        assert name in parent.data.metrics, column
        complete = [t for t in trials if t.data.tags["posfair.state"] == "COMPLETE"]  # a pruned trial's are left empty
        assert name.startswith("heldout_") or all(name in t.data.metrics for t in complete), column
    assert training_view_url(DEFAULT_TRACKING_URI, "127.0.0.1", 5000).endswith(
        f"/#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning&viewStateShareKey=posfair"
    )


def test_runs_mark_baseline_paper_default_infeasible_trials_and_the_winner(
    client: MlflowClient, default_run: dict
) -> None:
    parent, trials = runs_of(client)
    study = the_study(default_run["work"])
    assert [int(r.data.tags["posfair.trial"]) for r in trials] == list(range(TRIALS))
    winner = int(parent.data.metrics["winner_trial"])
    for run in trials:
        number, metrics, name = int(run.data.tags["posfair.trial"]), run.data.metrics, run.info.run_name
        feasible = metrics["feasible"] == 1.0
        assert feasible == all(c <= 0 for c in study.trials[number].constraints.values())
        assert (" · infeasible" in name) == (not feasible) == (run.data.tags["posfair.feasible"] == "no")
        # the role first: the run list cuts long names ("trial-2 · paper d…" hid it)
        assert (
            name.startswith("winner · trial-") == (number == winner) == (run.data.tags.get("posfair.winner") == "yes")
        )
        description = run.data.tags[NOTE]
        attrs = study.trials[number].user_attrs  # the figures the sentence was written from (MLflow's are rounded)
        assert f"PSI {attrs['psi']:.3f} and HM {100 * attrs['hm']:.2f} on the tuning passages" in description
        assert f"worst-case PSI {attrs['robust_psi']:.3f} (on {attrs['worst_structure']}" in description
        assert metrics["psi"] == as_logged(attrs["psi"]) and metrics["hm_x100"] == as_logged(100 * attrs["hm"])
        assert metrics["worst_structure_psi"] == as_logged(study.trials[number].value)
        assert list(metrics)[:2] == ["worst_structure_psi", "psi"], (
            "logged first: what MLflow's compare view plots first"
        )
        assert ("; infeasible: " in description) == (not feasible) == ("; feasible: " not in description), description
        checked = set(named_constraints(study.trials[number]))
        assert named(description) == checked and named(attrs["feasible"]) == checked, (
            "every constraint checked, no other"
        )
    names = [run.info.run_name.removeprefix("winner · ") for run in trials]
    assert names[0].startswith("trial-0 · baseline") and "no calibration (λ 0)" in trials[0].data.tags[NOTE]
    assert names[1].startswith("trial-1 · paper default") and "CLS-Soft, λ 0.50" in trials[1].data.tags[NOTE]
    assert trials[winner].data.tags[NOTE].startswith(f"Winner (trial {winner})")


def test_every_stored_metric_is_rounded_to_what_is_worth_reading(client: MlflowClient) -> None:
    """MLflow's run list and charts print a stored float whole (57.171079012…): the store holds four significant
    digits, and whole numbers (query counts, layer-tokens) every digit."""
    parent, trials = runs_of(client)
    values = [v for run in (parent, *trials) for v in run.data.metrics.values()]
    assert len(values) > 100 and any(v != int(v) for v in values)
    assert all(v == int(v) or float(f"{v:.4g}") == v for v in values), [v for v in values if float(f"{v:.4g}") != v][:5]


def test_a_whole_number_keeps_every_digit_and_a_fraction_four_significant_ones() -> None:
    assert significant(123456.0) == 123456.0 and significant(2_147_483_648.0) == 2_147_483_648.0  # layer-tokens
    assert significant(123456.7) == 123457.0  # past four significant digits, the integer part is kept whole
    assert (
        significant(57.171079012) == 57.17
        and significant(0.26543) == 0.2654
        and significant(-0.000123456) == -0.0001235
    )
    assert significant(0.0) == 0.0 and np.isnan(significant(float("nan")))


def test_trial_runs_open_when_the_trial_starts_and_last_as_long_as_it(client: MlflowClient, default_run: dict) -> None:
    """A run's start and end are the trial's (Optuna's clock, 1 s tolerance), not the moment it was logged."""
    _, trials = runs_of(client)
    study = the_study(default_run["work"])
    for run in trials:
        trial = study.trials[int(run.data.tags["posfair.trial"])]
        assert run.info.status == "FINISHED"
        assert abs(run.info.start_time / 1000 - trial.datetime_start.timestamp()) < 1.0
        assert abs(run.info.end_time / 1000 - trial.datetime_complete.timestamp()) < 1.0
        assert (run.info.end_time - run.info.start_time) / 1000 == pytest.approx(
            trial.duration.total_seconds(), abs=1.0
        )
        assert trial.user_attrs["mlflow_run_id"] == run.info.run_id  # Optuna points at the run


def test_optuna_names_the_objective_and_explains_the_study(default_run: dict) -> None:
    study = the_study(default_run["work"])
    assert study.metric_names == ["worst-case PSI"]  # the objective: the worst PSI over the tuning structures
    assert study.user_attrs["objective"].startswith("minimise the worst PSI over the tuning structures")
    checked = {
        name for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE for name in named_constraints(t)
    }
    assert (
        named(study.user_attrs["constraints"])
        == checked
        == {"hm_floor", "ndcg_drop", "structure_ndcg", "reversal", "drift"}
    )
    importance = study.user_attrs.get("psi_importance (parameters every trial drew)", {})
    assert "weight" not in importance  # CLS-Hard's w is conditional: never ranked


def test_the_parent_run_holds_held_out_figures_with_their_intervals(client: MlflowClient, default_run: dict) -> None:
    """The winner's held-out figures come first: in the order logged (MLflow's run page lists them so) and in a section
    whose name sorts first (its charts sort sections by name, capitals first)."""
    parent, _ = runs_of(client)
    exported = load_exported(default_run["yaml"])
    ((name, intervals),) = exported.provenance.intervals.items()
    metrics = parent.data.metrics
    winners = [k for k in metrics if k.startswith("Winner held out/")]
    assert winners and list(metrics)[: len(winners)] == winners
    assert min({k.rpartition("/")[0] for k in metrics if "/" in k}) == f"Winner held out/{name}"
    for metric, scale, shown in (("hm", 100, "hm_x100"), ("psi", 1, "psi"), ("ndcg10", 100, "ndcg10_x100")):
        estimate, low, high = intervals[metric]
        prefix = f"Winner held out/{name}/change_{shown}"
        assert metrics[prefix] == as_logged(scale * estimate)
        assert metrics[f"{prefix}_ci_low"] == as_logged(scale * low) and metrics[f"{prefix}_ci_high"] == as_logged(
            scale * high
        )
        assert low <= estimate <= high
    held = exported.metrics[f"heldout/{name}"]
    assert metrics[f"Winner held out/{name}/hm_x100"] == as_logged(100 * held["hm"])
    assert metrics[f"heldout/{name}/uncalibrated/hm_x100"] == as_logged(
        100 * exported.metrics[f"heldout_baseline/{name}"]["hm"]
    )
    assert metrics["tuning/winner/psi"] == as_logged(exported.metrics["tuning"]["psi"])


def test_the_parent_run_names_the_winner_and_its_held_out_result(client: MlflowClient, default_run: dict) -> None:
    """Two sentences on the study's run: the winner, its config and rule; its held-out change with intervals."""
    parent, trials = runs_of(client)
    exported = load_exported(default_run["yaml"])
    winner = exported.provenance.trial
    ((name, intervals),) = exported.provenance.intervals.items()
    description = parent.data.tags[NOTE]
    assert (
        description.startswith(f"Winner: trial {winner}, ")
        and f"chosen by the {exported.provenance.selection_rule} rule" in description
    )
    assert (
        ". Held out, against no calibration (95% paired-bootstrap intervals): " in description
        and description.endswith(".")
    )
    hm, psi = intervals["hm"], intervals["psi"]
    assert f"{name} ΔHM {100 * hm[0]:+.2f} [{100 * hm[1]:+.2f}, {100 * hm[2]:+.2f}], ΔPSI {psi[0]:+.3f}" in description
    metrics, winner_metrics = parent.data.metrics, trials[winner].data.metrics
    for column in (
        "worst_structure_psi",
        "psi",
        "hm_x100",
        "feasible",
        "ndcg10_change_vs_uncalibrated_x100",
    ):  # the trials' columns
        assert metrics[column] == pytest.approx(winner_metrics[column], abs=1e-4)
    assert metrics["heldout_winner_change_hm_x100"] == as_logged(100 * hm[0])
    table = (
        Path(client.download_artifacts(parent.info.run_id, "heldout.md", str(default_run["work"] / "dl")))
    ).read_text()
    assert f"| {name} | Winner (trial {winner}) | {100 * exported.metrics[f'heldout/{name}']['hm']:.2f} |" in table


def test_the_parent_run_shows_how_each_config_does_along_the_passage_on_the_held_out_sets(
    client: MlflowClient, default_run: dict
) -> None:
    """heldout.md's profile table (and heldout.png, its picture): per held-out set, each config's nDCG@10 in each
    position group with its interval and its tilt, the winner's figures the YAML's own."""
    parent, _ = runs_of(client)
    exported = load_exported(default_run["yaml"])
    ((name, _),) = exported.provenance.intervals.items()
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"heldout.png", "heldout.md"} <= artifacts
    table = Path(
        client.download_artifacts(parent.info.run_id, "heldout.md", str(default_run["work"] / "dl-profile"))
    ).read_text()
    section = table.split(f"### {name}\n", 1)[1]
    held = exported.metrics[f"heldout/{name}"]
    groups = [k.removeprefix("ndcg10_") for k in held if k.startswith("ndcg10_") and not k.startswith("ndcg10_fifth")]
    assert section.splitlines()[1] == "| config | " + " | ".join([*groups, "tilt"]) + " |"
    winner = next(
        line for line in section.splitlines() if line.startswith(f"| Winner (trial {exported.provenance.trial}) |")
    )
    cells = [cell.strip() for cell in winner.strip("|").split("|")][1:]
    for group, cell in zip(groups, cells):
        assert cell.startswith(f"{100 * held[f'ndcg10_{group}']:.2f} [") and cell.endswith("]"), (group, cell)
    assert cells[-1].startswith(f"{100 * held['tilt']:+.1f} [") if "tilt" in held else cells[-1] == "–"


def test_optuna_dashboard_greys_infeasible_trials_and_the_study_names_the_winner(default_run: dict) -> None:
    """The dashboard reads constraints as a list (0.21), and cuts non-string attributes at 1,024 characters;
    its 'Best Trial' is the lowest PSI whatever the constraints, so the study says which trial won."""
    study = the_study(default_run["work"])
    storage = f"sqlite:///{default_run['work'] / 'mlruns' / 'optuna.db'}"
    detail = dashboard_api(storage, f"/api/studies/{study._study_id}")
    exported = load_exported(default_run["yaml"])
    for shown in detail["trials"]:
        trial = study.trials[shown["number"]]
        if trial.state != optuna.trial.TrialState.COMPLETE:
            continue
        named = list(named_constraints(trial).values())
        assert shown["constraints"] == pytest.approx(named), "the dashboard's feasibility is the study's"
        assert trial.constraints == {str(i): v for i, v in enumerate(named)}, "the samplers read each constraint once"
        attrs = {a["key"]: a["value"] for a in shown["user_attrs"]}
        assert attrs["feasible"].startswith("yes: " if all(v <= 0 for v in named) else "NO: ")
        assert json.loads(attrs["metrics"]) == pytest.approx(trial.user_attrs["metrics"]), "the metrics JSON is not cut"
        assert len(attrs["metrics"]) < 1024 - 200, "room for the metrics of --general and --max-crops-psi"
    study_attrs = {a["key"]: a["value"] for a in detail["user_attrs"]}
    assert study_attrs["winner"].startswith(f"Winner: trial {exported.provenance.trial}, ")
    assert (
        "feasible or not" in study_attrs["best trial in optuna-dashboard"]
        and "`winner` above" in study_attrs["best trial in optuna-dashboard"]
    )
    assert [a["key"] for a in detail["user_attrs"]][:2] == ["winner", "best trial in optuna-dashboard"], (
        "the winner first"
    )
    studies = dashboard_api(storage, "/api/studies")["study_summaries"]
    assert [s["study_name"] for s in studies] == [study.study_name], (
        "no study beside the real one (the export's election)"
    )
    lowest = min((t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE), key=lambda t: t.value)
    assert [t["number"] for t in detail["best_trials"]] == [lowest.number], "what the README says the dashboard shows"
    # the notes, where the dashboard shows them: the study's and the winner's say which won and why
    winner = exported.provenance.trial
    why = f"Chosen by the **{exported.provenance.selection_rule}** rule: "
    assert detail["note"]["body"].startswith(f"## Winner: trial {winner}\n") and why in detail["note"]["body"]
    notes = {t["number"]: t["note"]["body"] for t in detail["trials"]}
    assert notes[winner].startswith(f"## Winner of study {study.study_name}") and why in notes[winner]
    if lowest.number != winner:  # the Best Trial card's trial says why it did not win
        assert (
            notes[lowest.number].startswith("## Lowest objective, not the winner")
            and f"Trial {winner} won" in notes[lowest.number]
        )


def test_the_yaml_records_its_provenance(client: MlflowClient, default_run: dict) -> None:
    parent, _ = runs_of(client)
    text = default_run["yaml"].read_text(encoding="utf-8")
    provenance = load_exported(default_run["yaml"]).provenance
    assert provenance.mlflow_run_id == parent.info.run_id
    assert provenance.registered_model == registered_name(str(default_run["model"]))
    version = client.get_model_version_by_alias(provenance.registered_model, "champion")
    assert provenance.registered_version == int(version.version)
    assert provenance.heldout == ["jsonl:held"]
    assert provenance.hm_floor == pytest.approx(the_study(default_run["work"]).user_attrs["floor_value"])
    assert provenance.hm_floor_rule == "-50%" and provenance.objective.startswith(
        "minimise the worst PSI over the tuning structures"
    )
    study = the_study(default_run["work"])
    checked = {
        name for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE for name in named_constraints(t)
    }
    assert named(provenance.objective) == checked and "at most 2 times as far" in provenance.objective
    winner = study.trials[provenance.trial]
    assert provenance.structures == winner.user_attrs["structures"]  # per structure: the winner's PSI and direction
    # the study's cost: every trial's and what the process encoded before them (baselines, queries)
    setup = [v for k, v in study.user_attrs.items() if k.startswith("setup_layer_tokens/")]
    assert len(setup) == 1 and setup[0] > 0, "one process, which encoded its baselines: nothing was cached"
    assert provenance.layer_tokens == sum(t.user_attrs.get("layer_tokens", 0) for t in study.trials) + setup[0]
    assert set(provenance.versions) == {"posfair", "torch", "transformers"}
    import torch

    assert provenance.versions["torch"] == torch.__version__
    calibration = yaml.safe_load(text)["calibration"]
    assert ("weight" in calibration) == (calibration["variant"] == "cls_hard")


def test_the_registered_version_comes_from_the_winner_s_trial_run_and_says_why_once(
    client: MlflowClient, default_run: dict
) -> None:
    """The winner's run is the version's source (its Registered models panel shows it), as its description says."""
    _, trials = runs_of(client)
    provenance = load_exported(default_run["yaml"]).provenance
    version = client.get_model_version_by_alias(registered_name(str(default_run["model"])), "champion")
    winner_run = trials[provenance.trial]
    assert version.run_id == winner_run.info.run_id
    assert f"Registered as models:/{version.name}@champion (version {version.version})" in winner_run.data.tags[NOTE]
    assert version.description.startswith(f"Study {provenance.study}, trial {provenance.trial}: ")
    assert version.description.count(f"trial {provenance.trial}") == 1, version.description
    # its config and held-out result, as the winner's run and the parent run say them, and what the pyfunc takes
    config = winner_run.data.tags[NOTE].removeprefix(f"Winner (trial {provenance.trial}): ").split(":")[0]
    assert version.description.startswith(
        f"Study {provenance.study}, trial {provenance.trial}: {config}. Held out, against"
    )
    parent, _ = runs_of(client)
    note = parent.data.tags[NOTE]
    held = note[note.index("Held out, against no calibration") :]  # the parent run's second sentence
    assert f"{config}. {held} Chosen by the " in version.description
    assert version.description.endswith(USAGE) and "`text` column" in USAGE and "params.kind" in USAGE
    # the version's page shows an input example: texts, with the kind it takes as a parameter
    from mlflow.models import Model

    folder = Path(mlflow.artifacts.download_artifacts(f"models:/{version.name}/{version.version}"))
    model = Model.load(folder)
    assert model.load_input_example(folder) == ["A passage to index.", "Another passage."]
    assert model.load_input_example_params(folder) == {"kind": "document"}
    assert model.signature.inputs is None, "no input schema: MLflow would hand the model a frame's first column"


def test_the_winner_is_registered_and_loads_as_the_calibrated_encoder(client: MlflowClient, default_run: dict) -> None:
    name = registered_name(str(default_run["model"]))
    model = mlflow.pyfunc.load_model(f"models:/{name}@champion")  # the default store, as `tune` left it
    encoder = CalibratedEncoder.from_yaml(default_run["yaml"])
    assert np.abs(np.asarray(model.predict(TEXTS)) - encoder.encode(TEXTS)).max() < 1e-6
    queries = np.asarray(model.predict(TEXTS[:2], params={"kind": "query"}))
    assert np.abs(queries - encoder.encode_query(TEXTS[:2])).max() < 1e-6


def test_a_copied_store_keeps_its_artifacts_and_models(
    default_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copy the project folder, take the original away, and read artifacts and the model from the copy."""
    copy = tmp_path / "moved"
    shutil.copytree(default_run["work"], copy)
    original = default_run["work"]
    hidden = original.with_name(original.name + "-away")
    original.rename(hidden)
    try:
        forget_cached_stores()
        monkeypatch.chdir(copy)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", DEFAULT_TRACKING_URI)
        client = MlflowClient(DEFAULT_TRACKING_URI, registry_uri=DEFAULT_TRACKING_URI)
        parent, trials = runs_of(client)
        summary = Path(client.download_artifacts(parent.info.run_id, "summary.json", str(tmp_path)))
        assert json.loads(summary.read_text(encoding="utf-8"))[-1]["trial"] == int(parent.data.metrics["winner_trial"])
        profile = Path(client.download_artifacts(trials[0].info.run_id, "attention_profile.png", str(tmp_path)))
        assert profile.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        name = registered_name(str(default_run["model"]))
        vectors = mlflow.pyfunc.load_model(f"models:/{name}@champion").predict(TEXTS[:2])
        assert np.asarray(vectors).shape[0] == 2
    finally:
        hidden.rename(original)


def test_tune_ui_names_the_store_and_refuses_to_invent_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.cli.app import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["ui"])
    assert result.exit_code == 2
    assert "no MLflow store at" in result.output and str(tmp_path / "mlruns" / "mlflow.db") in result.output.replace(
        "\n", ""
    )
    assert not (tmp_path / "mlruns").exists()


@pytest.mark.parametrize("written_by", ["an older MLflow", "a newer MLflow", "Optuna"])
def test_tune_ui_checks_the_store_s_schema_before_it_prints_a_link(
    written_by: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a store of another MLflow schema `tune ui` printed its link, then the server's traceback (which, for a
    newer store, advised `mlflow db upgrade`); on a study database the server added MLflow's tables to it."""
    import sqlite3

    import optuna

    import tuner.tracking.ui
    from tuner.cli.app import app

    served: list[list[str]] = []
    monkeypatch.setattr(tuner.tracking.ui, "serve_ui", lambda command: served.append(command) or 0)
    store = tmp_path / "mlflow.db"
    if written_by == "Optuna":
        optuna.storages.RDBStorage(f"sqlite:///{store}")
    else:
        MlflowClient(f"sqlite:///{store}").search_experiments()
        version = (
            "451aebb31d03" if written_by == "an older MLflow" else "ffffffffffff"
        )  # MLflow 1.0's first; none of its
        with sqlite3.connect(store) as connection:
            connection.execute("UPDATE alembic_version SET version_num = ?", (version,))
    before = store.read_bytes()
    result = CliRunner().invoke(app, ["ui", "--tracking-uri", f"sqlite:///{store}"])
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and served == [] and "MLflow UI:" not in output, output
    assert store.read_bytes() == before
    with pytest.raises((TrackingUnavailableError, ValueError)) as refused:  # `tune run` and `tune export` too
        _ = Tracker(f"sqlite:///{store}", "posfair").experiment_id
    assert "Start the server" not in str(refused.value)
    assert store.read_bytes() == before
    if written_by == "an older MLflow":
        assert "was written by an older MLflow (schema 451aebb31d03; MLflow " in output
        assert f"back it up, then upgrade it: mlflow db upgrade sqlite:///{store}" in output
    elif written_by == "a newer MLflow":
        assert "schema ffffffffffff, unknown to this MLflow" in output and "a newer MLflow wrote it" in output
        assert "mlflow db upgrade" not in output
    else:
        assert "is an Optuna study database" in output


def test_a_failed_start_leaves_no_store_behind(tiny_model_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model is there but its data cannot be read: the run fails, and no mlruns/ (no DB, no experiment) is left."""
    from tuner.tuning.run import TuneSettings, tune

    data = write_dataset(tmp_path / "data")
    (data / "queries.jsonl").write_text("{not json\n", encoding="utf-8")
    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(ValueError):
        tune(
            TuneSettings(
                model=str(tiny_model_dir("bert")), pooling="cls", dataset=f"jsonl:{data}", heldout=None, trials=2
            )
        )
    assert list(work.iterdir()) == []


def test_tune_has_short_help_and_a_version() -> None:
    from tuner import __version__
    from tuner.cli.app import app

    runner = CliRunner()
    assert runner.invoke(app, ["--version"]).output.strip() == f"posfair {__version__}"
    for args in (["-h"], ["run", "-h"], ["ui", "-h"], ["encode", "-h"], ["evaluate", "-h"], ["export", "-h"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0 and "Usage" in result.output, args


def test_every_option_has_help_and_every_command_an_example() -> None:
    import typer.main

    from tuner.cli.app import app

    group = typer.main.get_command(app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        assert "Example:" in (command.help or ""), name
        for param in command.params:
            if param.name not in ("help",):
                assert getattr(param, "help", None), f"{name} --{param.name} has no help"


@pytest.fixture(scope="module")
def server_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir) -> dict[str, object]:
    """The same run against a real `mlflow server` (CI's if .ci/run started one, else one started here)."""
    root = tmp_path_factory.mktemp("server-run")
    data = write_dataset(root / "data")
    (root / "space.yaml").write_text("basket_sizes: [8, 16, 128]\n", encoding="utf-8")

    def run(uri: str) -> dict[str, object]:
        done = forkserver.run(
            [
                *tune_command(tiny_model_dir("bert"), data),
                "--space",
                str(root / "space.yaml"),
                "--tracking-uri",
                uri,
                "--storage",
                f"sqlite:///{root / 'optuna.db'}",
                "--study-name",
                f"served-{os.getpid()}-{time.time_ns()}",
                "--output",
                str(root / "best.yaml"),
            ],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return {"uri": uri, "yaml": root / "best.yaml", "model": tiny_model_dir("bert"), "root": root}

    if MLFLOW:
        yield run(MLFLOW)
        return
    with running_mlflow_server(f"sqlite:///{root / 'mlflow-server.db'}", root) as server:
        yield run(server.uri)


def test_the_champion_loads_from_the_server_and_is_served_over_rest(
    server_run: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """models:/NAME@champion through the tracking server, then `mlflow models serve` answering a real POST."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server_run["uri"])
    name = registered_name(str(server_run["model"]))
    uri = f"models:/{name}@champion"
    encoder = CalibratedEncoder.from_yaml(server_run["yaml"])
    want = encoder.encode(TEXTS)
    assert np.abs(np.asarray(mlflow.pyfunc.load_model(uri).predict(TEXTS)) - want).max() < 1e-6
    port = free_port()
    log = (server_run["root"] / "serve.log").open("w")
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "models",
            "serve",
            "-m",
            uri,
            "--env-manager",
            "local",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={
            **os.environ,
            "MLFLOW_TRACKING_URI": server_run["uri"],  # the venv's uvicorn, as when activated
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        },
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/ping", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            assert serve.poll() is None and time.monotonic() < deadline, (server_run["root"] / "serve.log").read_text()[
                -3000:
            ]
            time.sleep(1)
        answer = requests.post(f"http://127.0.0.1:{port}/invocations", json={"inputs": TEXTS}, timeout=120)
        assert answer.ok, answer.text
        assert np.abs(np.asarray(answer.json()["predictions"], dtype=np.float64) - want).max() < 1e-6
        queries = requests.post(
            f"http://127.0.0.1:{port}/invocations", json={"inputs": TEXTS[:2], "params": {"kind": "query"}}, timeout=120
        )
        assert np.abs(np.asarray(queries.json()["predictions"]) - encoder.encode_query(TEXTS[:2])).max() < 1e-6
    finally:
        os.killpg(serve.pid, 15)
        serve.wait(timeout=30)
        log.close()


def test_two_runs_in_two_folders_of_one_process_log_to_their_own_stores(
    tiny_model_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default store is named by a relative URI (portable), but MLflow caches stores per URI string: a second
    `tune()` in another folder of the same process must still log to its own folder's store."""
    from tuner.tuning.run import TuneSettings, tune
    from tuner.tuning.search_space import SearchSpace

    data = write_dataset(tmp_path / "data")
    forget_cached_stores()  # what this file's own clients left open
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        tune(
            TuneSettings(
                model=str(tiny_model_dir("bert")),
                pooling="cls",
                dataset=f"jsonl:{data}",
                heldout=None,
                trials=1,
                hm_floor="-90%",
                max_ndcg_drop=None,
                study_name=f"study-{folder}",
                profile_docs=1,
                bootstrap=10,
                space=SearchSpace(basket_sizes=(8,)),
                selection="lowest",
            )
        )
    # A user's own client on the relative default, in a third folder, sees that folder's (empty) store: no
    # connection of the runs above may stay open by a relative path (MLflow keeps engines per URI string).
    (tmp_path / "c").mkdir()
    monkeypatch.chdir(tmp_path / "c")
    assert MlflowClient(DEFAULT_TRACKING_URI).get_experiment_by_name("posfair") is None
    forget_cached_stores()
    for folder in ("a", "b"):
        client = MlflowClient(f"sqlite:///{tmp_path / folder / 'mlruns' / 'mlflow.db'}")
        runs = client.search_runs(
            [client.get_experiment_by_name("posfair").experiment_id], "tags.`posfair.role` = 'study'"
        )
        assert [r.info.run_name for r in runs] == [f"study-{folder}"]


def test_a_refused_log_is_dropped_with_its_error_and_the_later_logs_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One log MLflow refuses (here: a param on a run that does not exist) would fail the same way at every retry;
    it must not hold back the logs behind it."""
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "refusals")
    done: list[str] = []
    tracker._submit("a param", lambda: tracker.client.log_param("0" * 32, "strength", "0.5"))
    tracker._submit("the next log", lambda: done.append("the next log"))
    assert done == ["the next log"] and tracker.flush()
    assert (
        "MLflow refused a param, dropped (MlflowException: Run with id=00000000000000000000000000000000 not found"
        in caplog.text
    )


@pytest.mark.parametrize("outage", ["connection refused", "connection cut mid-answer", "database locked"])
def test_an_outage_keeps_the_logs_in_order_until_the_store_answers(
    outage: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What MLflow raises when the server is gone (a wrapped ConnectionError), is killed while it answers (the
    request may have been carried out: a wrapped ChunkedEncodingError, seen when a trial's run was created and
    its params were then never logged) or its database is locked (503)."""
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "outages")
    up, done = [False], []

    def first() -> None:
        if not up[0]:
            if outage == "database locked":
                raise MlflowException(
                    "(sqlite3.OperationalError) database is locked", error_code=TEMPORARILY_UNAVAILABLE
                )
            cut = "Connection broken: IncompleteRead(0 bytes read, 1189 more expected)"
            try:
                if outage == "connection cut mid-answer":
                    raise requests.exceptions.ChunkedEncodingError(urllib3.exceptions.ProtocolError(cut))
                raise requests.ConnectionError("[Errno 111] Connection refused")
            except requests.RequestException as error:  # as mlflow.utils.rest_utils wraps it
                raise MlflowException(f"API request to http://127.0.0.1:1 failed with exception {error}")  # noqa: B904
        done.append("first")

    tracker._submit("first", first)
    tracker._submit("second", lambda: done.append("second"))
    assert done == [] and not tracker.flush()
    said = (
        f"MLflow's store sqlite:///{tmp_path}/mlflow.db" if outage == "database locked" else "MLflow still unreachable"
    )
    assert said in caplog.text and ("is locked by another process" in caplog.text) == (outage == "database locked")
    up[0] = True
    assert tracker.flush() and done == ["first", "second"]


def refusal() -> MlflowException:
    return MlflowException("Invalid value for the artifact (simulated refusal)", error_code=INVALID_PARAMETER_VALUE)


def store_error(message: str) -> MlflowException:
    """What MLflow's SQL store raises for a failed statement: MlflowException(TEMPORARILY_UNAVAILABLE) from
    SQLAlchemy's OperationalError (`mlflow.store.db.utils.make_managed_session`), whatever the cause."""
    import sqlite3

    import sqlalchemy.exc

    cause = sqlalchemy.exc.OperationalError("INSERT INTO metrics", {}, sqlite3.OperationalError(message))
    try:
        raise MlflowException(message=cause, error_code=TEMPORARILY_UNAVAILABLE) from cause
    except MlflowException as error:
        return error


@pytest.mark.parametrize("refused", ["log_artifact", "log_batch"])
def test_one_refused_log_of_a_trial_s_close_drops_only_that_log(
    refused: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The close of a trial was one action: a refused artifact (or metric batch) dropped it whole, and the run
    stayed RUNNING without its metrics, tags or name."""
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "closes")
    tracker.start_study("closes", {}, {})
    tracker.start_trial("closes", 2, {"strength": 0.5}, "a trial", [])
    profile = tmp_path / "attention_profile.json"
    profile.write_text("{}", encoding="utf-8")
    real = getattr(tracker.client, refused)

    def refuse(*args: object, **kwargs: object) -> object:
        if refused == "log_batch" and not kwargs.get("metrics"):
            return real(*args, **kwargs)  # only the batch that carries the metrics is refused
        raise refusal()

    monkeypatch.setattr(tracker.client, refused, refuse)
    record = TrialRecord(
        2, "COMPLETE", {"strength": 0.5}, {"psi": 0.25}, {"posfair.verdict": "feasible"}, [profile], "done", ["winner"]
    )
    tracker.finish_trial("closes", record)
    assert tracker.flush()
    run = tracker.client.get_run(tracker.trial_run_id(2))
    assert run.info.status == "FINISHED" and run.info.run_name == "winner · trial-2"
    assert run.data.tags["posfair.verdict"] == "feasible" and run.data.tags["posfair.state"] == "COMPLETE"
    assert ("psi" in run.data.metrics) == (refused != "log_batch")
    assert [a.path for a in tracker.client.list_artifacts(run.info.run_id)] == (
        [] if refused == "log_artifact" else [profile.name]
    )
    assert "simulated refusal" in caplog.text


def test_a_permanent_store_error_is_reported_once_and_holds_back_no_later_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`no such column` reaches posfair as MLflow's "temporarily unavailable" (503) over SQLAlchemy's
    OperationalError: it was taken for an outage, every later log was held behind it and the warning repeated."""
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "permanent")
    tracker.start_study("permanent", {}, {})
    real = tracker.client.log_batch

    def broken_metrics(*args: object, **kwargs: object) -> object:
        if kwargs.get("metrics"):
            raise store_error("no such column: metrics.is_nan")
        return real(*args, **kwargs)

    monkeypatch.setattr(tracker.client, "log_batch", broken_metrics)
    for number in range(3):
        tracker.start_trial("permanent", number, {"strength": 0.5}, "", [])
        tracker.finish_trial("permanent", TrialRecord(number, "COMPLETE", {"strength": 0.5}, {"psi": 0.25}))
    assert tracker.flush()
    assert [tracker.client.get_run(tracker.trial_run_id(n)).info.status for n in range(3)] == ["FINISHED"] * 3
    assert caplog.text.count("no such column: metrics.is_nan") == 1 and "unreachable" not in caplog.text


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (lambda: store_error("database is locked"), "outage"),
        (
            lambda: MlflowException(
                "(sqlite3.OperationalError) database is locked", error_code=TEMPORARILY_UNAVAILABLE
            ),
            "outage",
        ),
        (
            lambda: MlflowException(
                "API request to http://h:5000 failed: 502 Bad Gateway", error_code=TEMPORARILY_UNAVAILABLE
            ),
            "outage",
        ),
        (lambda: MlflowException("Internal server error", error_code=INTERNAL_ERROR), "outage"),
        (lambda: requests.ConnectionError("[Errno 111] Connection refused"), "outage"),
        (lambda: store_error("no such column: runs.lifecycle_stage"), "refused"),
        (lambda: store_error("no such table: metrics"), "refused"),
        (lambda: store_error("attempt to write a readonly database"), "refused"),
        (
            lambda: MlflowException("(sqlite3.OperationalError) no such column: x", error_code=TEMPORARILY_UNAVAILABLE),
            "refused",
        ),
        (lambda: refusal(), "refused"),
        (lambda: store_error("database or disk is full"), "disk full"),
        (lambda: OSError(28, "No space left on device"), "disk full"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_outages_are_told_from_permanent_errors_and_a_full_disk(error: Callable[[], BaseException], kind: str) -> None:
    """An outage (connection refused or cut, a 5xx answer, a locked database) is kept for retry; an error that
    will recur at every retry (a schema MLflow does not know, a read-only store, a refusal) is dropped; a full
    disk is kept, and said with its fix."""
    from tuner.tracking.failures import classify_failure

    assert classify_failure(error()) == kind


@contextmanager
def full_sqlite_disk(engine: sqlalchemy.engine.Engine) -> Iterator[None]:
    """SQLite's own "database or disk is full" (SQLITE_FULL, what a full disk gives) on every write that grows the
    file: each connection may hold no more pages than the file has now (`PRAGMA max_page_count`)."""

    def capped(connection: object, _record: object) -> None:
        cursor = connection.cursor()  # type: ignore[attr-defined]
        pages = cursor.execute("PRAGMA page_count").fetchone()[0]
        cursor.execute(f"PRAGMA max_page_count = {pages}")
        cursor.close()

    sqlalchemy.event.listen(engine, "connect", capped)
    engine.dispose()
    try:
        yield
    finally:
        sqlalchemy.event.remove(engine, "connect", capped)
        engine.dispose()


def test_a_full_disk_under_the_mlflow_store_keeps_the_logs_says_so_with_the_file_and_they_land_once_space_is_freed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk under MLflow's store was an "outage" ("MLflow still unreachable"), naming neither the file nor the
    fix."""
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "full")
    tracker.start_study("full", {}, {})
    engine = tracker.client._tracking_client.store.engine
    with full_sqlite_disk(engine):
        for number in range(3):
            tracker.start_trial("full", number, {"strength": 0.5, "padding": "x" * 2000}, "", [])
            tracker.finish_trial("full", TrialRecord(number, "COMPLETE", {"strength": 0.5}, {"psi": 0.25}))
        assert not tracker.flush()
    assert f"MLflow cannot write sqlite:///{tmp_path}/mlflow.db" in caplog.text
    assert (
        "the disk is full (" in caplog.text
        and "database or disk is full" in caplog.text
        and "free space on that disk" in caplog.text
    )
    assert "unreachable" not in caplog.text
    assert tracker.flush()  # space freed: every kept log lands, in order
    for number in range(3):
        run = tracker.client.get_run(tracker.trial_run_id(number))
        assert run.info.status == "FINISHED" and run.data.metrics["psi"] == 0.25


def test_a_trial_run_logged_late_keeps_the_trial_s_own_start_and_end(tmp_path: Path) -> None:
    """After an outage a trial is logged long after it ran: its run spans the trial, not the moment of logging
    (a default run logs each trial within a second of its end, so it cannot tell the two apart)."""
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "late")
    tracker.start_study("late-study", {}, {})
    hour_ago = int(time.time() * 1000) - 3_600_000
    record = TrialRecord(
        number=3,
        state="COMPLETE",
        params={"strength": 0.5},
        metrics={"psi": 0.1},
        start_ms=hour_ago,
        end_ms=hour_ago + 90_000,
    )
    tracker.finish_trial("late-study", record)
    run = tracker.client.get_run(tracker.trial_run_id(3))
    assert (run.info.status, run.info.start_time, run.info.end_time) == ("FINISHED", hour_ago, hour_ago + 90_000)


def test_a_complete_trial_logs_each_figure_once_on_one_scale() -> None:
    """The crops are a tuning structure: their PSI and HM are `structure/NAME/psi` and `…/hm_x100` (HM ×100, as the
    console prints it), not a second time as 0–1 `crops_*` figures beside them."""
    from types import SimpleNamespace

    from tuner.tracking.display import display_metrics
    from tuner.tuning.trial.record import complete_metrics

    report = SimpleNamespace(as_dict=lambda: {"psi": 0.2, "hm": 0.55, "ndcg10": 0.6})
    row = {"psi": 0.25, "hm": 0.5, "ndcg10": 0.52}
    scored = SimpleNamespace(
        evidence=SimpleNamespace(hm_low=0.5, objective_se=0.01, ndcg_delta=0.0),
        tuning=SimpleNamespace(report=report, drift=0.01, encode_seconds=1.0, truncated=0),
        robust=SimpleNamespace(objective=0.25, objective_se=0.02, per_structure=lambda: {"dev-crops": row}),
        screen=None,
        crops=SimpleNamespace(psi=0.25, hm=0.5, ndcg10=0.52),
        layer_tokens=100,
    )
    shown = display_metrics(complete_metrics(scored, {"hm_floor": -0.01}, 0.5, None))  # type: ignore[arg-type]
    assert shown["structure/dev-crops/hm_x100"] == 50.0 and shown["structure/dev-crops/psi"] == 0.25
    assert not [name for name in shown if name.startswith("crops")], "the crops' figures once, on the console's scale"


@pytest.mark.parametrize(
    ("structure", "as_stored"),
    [
        ("wikipos-dev+titles-crops", "wikipos-dev_titles-crops"),
        ("probe:/data/set-shorter", "probe:/data/set-shorter"),
        ("jsonl:my data (v2)-longer", "jsonl:my data _v2_-longer"),
    ],
)
def test_a_structure_named_by_any_dataset_name_logs_under_a_name_mlflow_accepts(
    tmp_path: Path, structure: str, as_stored: str
) -> None:
    """A set's name reaches metric names (`structure/<name>/psi`); MLflow refuses some characters (`+`), and a refused
    batch drops the trial's every figure. Each character MLflow refuses is stored as `_`, the rest as it is."""
    from tuner.tracking.display import stored_metrics

    (stored,) = stored_metrics({f"structure/{structure}/psi": 0.25}, 0)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("names")).info.run_id
    client.log_batch(run, metrics=[stored])
    assert client.get_run(run).data.metrics == {f"structure/{as_stored}/psi": 0.25}
