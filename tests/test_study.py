"""The tuner end to end on a tiny model: study, MLflow runs, export, resume, seeds, constraints."""

from __future__ import annotations

import datetime
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import optuna
import pytest
from mlflow.tracking import MlflowClient

from objectives.evidence import EVIDENCE_RESAMPLES
from tests.services import as_logged, running_mlflow_server
from tests.tiny import WORDS
from tuner.calibration import CalibrationConfig, ConfigError
from tuner.common.trials import DUPLICATE_ATTR, SCREEN_ATTR, counted, named_constraints, never_ran, objective_resamples
from tuner.data import load_benchmark
from tuner.engine.encoder import CalibratedEncoder
from tuner.engine.exported import load_exported
from tuner.engine.models import load_model
from tuner.evaluation.evaluator import Evaluator
from tuner.tuning.candidates import screen_threshold, winner
from tuner.tuning.owners import OWNER_ATTR, fail_dead_trials
from tuner.tuning.reexport import reexport
from tuner.tuning.run import NoFeasibleTrialError, TuneSettings, tune
from tuner.tuning.search_space import BASELINE_PARAMS, PAPER_DEFAULT_PARAMS, SearchSpace, trial_basket_shares
from tuner.tuning.storage import grace_seconds
from tuner.tuning.study import load_stored_study, open_study
from tuner.tuning.study_loop import run_trials

pytestmark = pytest.mark.usefixtures("module_cache")  # the studies run here, their disk cache not in the checkout

TRIAL_PARAMS = {"lambda_strength", "depth", "basket_size", "variant", "layers", "basket_shares"}
# MLflow's names: on the console's scale (nDCG@10 and HM ×100, PSI 0–1), constraints as margins (>= 0: met)
TRIAL_METRICS = {
    "ndcg10_begin_x100",
    "ndcg10_middle_x100",
    "ndcg10_end_x100",
    "hm_x100",
    "psi",
    "ndcg10_x100",
    "recall10_x100",
    "hm_margin_over_floor_x100",
    "ndcg10_drop_allowance_left_x100",
    "ndcg10_change_vs_uncalibrated_x100",
    "drift_from_uncalibrated_vectors",
    "psi_std_error",
    "feasible",
    "encode_seconds",
    "last_layer_attention_on_first_tenth_pct",
}


def write_dataset(folder: Path, docs: int = 12, seed: int = 0, words: int = 45) -> Path:
    """Documents of three `words`-word parts (45: content of ~135 tokens, basket 128 fits); each part's first words are
    a query for its third."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    corpus, queries = [], []
    for d in range(docs):
        parts = [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(3)]
        corpus.append({"id": f"d{d}", "text": " ".join(parts)})
        for group, part in zip(("begin", "middle", "end"), parts):
            queries.append(
                {"id": f"q{d}-{group}", "text": " ".join(part.split()[:5]), "relevant": [f"d{d}"], "group": group}
            )
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps(x) for x in corpus), encoding="utf-8")
    (folder / "queries.jsonl").write_text("\n".join(json.dumps(x) for x in queries), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir) -> dict[str, object]:
    root = tmp_path_factory.mktemp("study")
    dataset, held = write_dataset(root / "data"), write_dataset(root / "held", seed=1)
    settings = TuneSettings(
        model=str(tiny_model_dir("bert")),
        pooling="cls",
        dataset=f"jsonl:{dataset}",
        heldout=f"jsonl:{held}",
        trials=6,
        hm_floor="-50%",
        storage=f"sqlite:///{root / 'optuna.db'}",
        tracking_uri=f"sqlite:///{root / 'mlflow.db'}",
        output=root / "best.yaml",
        study_name="tiny",
        profile_docs=4,
        bootstrap=50,
        space=SearchSpace(basket_sizes=(8, 16, 128)),
        selection="lowest",  # a random model's PSI is noise, so the default one-SE rule keeps it uncalibrated
        prune=False,  # every trial complete, with all it logs (pruned trials: tests/test_pruning.py)
        budget=None,  # --trials alone ends it (a budget's end: tests/test_budget.py)
    )
    return {"root": root, "settings": settings, "outcome": tune(settings)}


def held_name(settings: TuneSettings) -> str:
    return load_benchmark(settings.dataset).name


def trial_runs(settings: TuneSettings) -> list:
    client = MlflowClient(settings.tracking_uri)
    experiment = client.get_experiment_by_name("posfair")
    return client.search_runs([experiment.experiment_id], "tags.`posfair.role` = 'trial'", max_results=1000)


def test_the_cache_keeps_layer_inputs_for_the_tuning_passages_and_only_vectors_for_a_held_out_set(
    workspace: dict, module_cache: Path
) -> None:
    """Every trial resumes from the tuning passages' layer inputs; a held-out set scores a few configs once, so what
    stays of it in the cache is its vectors (the uncalibrated model's, each config's), not gigabytes of inputs."""
    from tuner.evaluation.store import slug

    def folder(source: str) -> Path:
        dataset = load_benchmark(source)
        [found] = module_cache.glob(f"*/{slug(dataset.name)}-{dataset.fingerprint()[:12]}")
        return found

    settings = workspace["settings"]
    tuning, held = folder(settings.dataset), folder(settings.heldout)
    assert list(tuning.glob("layer-input-*")) and list(held.glob("baseline*")) and not list(held.glob("layer-input-*"))


def test_a_six_trial_study_logs_six_nested_runs_with_params_metrics_and_profiles(
    workspace: dict, tmp_path: Path
) -> None:
    """Each trial's run holds what Optuna recorded for it, and its metrics obey the paper's definitions."""
    settings, outcome = workspace["settings"], workspace["outcome"]
    runs = trial_runs(settings)
    client = MlflowClient(settings.tracking_uri)
    study = optuna.load_study(study_name="tiny", storage=settings.storage)
    ran = [t.number for t in study.trials if not never_ran(t)]  # a queued trial the study ended first never ran
    assert sorted(int(r.data.tags["posfair.trial"]) for r in runs) == ran  # one run per trial that ran
    assert sum(counted(t) for t in study.trials) == 6  # repeats of a calibration already run do not count
    floor = study.user_attrs["floor_value"]
    parents = {r.data.tags["mlflow.parentRunId"] for r in runs}
    assert len(parents) == 1
    for run in runs:
        trial = study.trials[int(run.data.tags["posfair.trial"])]
        if DUPLICATE_ATTR in trial.user_attrs:  # λ 0 or a repeated draw: marked, not run, not counted
            earlier = study.trials[trial.user_attrs[DUPLICATE_ATTR]]
            assert trial.value == earlier.value and trial.user_attrs["calibration"] == earlier.user_attrs["calibration"]
            assert (
                run.data.tags["posfair.duplicate_of"] == str(earlier.number)
                and run.data.metrics["cost/layer_tokens"] == 0
            )
            assert "duplicate" in run.info.run_name
            continue
        params, metrics = run.data.params, run.data.metrics
        assert run.info.status == "FINISHED" and trial.state == optuna.trial.TrialState.COMPLETE
        assert TRIAL_PARAMS <= set(params) and TRIAL_METRICS <= set(metrics)
        assert (params["variant"], params["depth"], int(params["basket_size"])) == (
            trial.params["variant"],
            trial.params["depth"],
            trial.params["basket_size"],
        )
        assert float(params["lambda_strength"]) == pytest.approx(trial.params["strength"])
        assert json.loads(params["layers"]) == trial.user_attrs["layers"]
        begin, middle, end = (metrics[f"ndcg10_{g}_x100"] for g in ("begin", "middle", "end"))
        hm = metrics["hm_x100"]
        # MLflow's figures are rounded to four digits, so those derived from others carry their rounding too
        assert hm == as_logged(3 / (1 / begin + 1 / middle + 1 / end), abs=0.01) and hm == as_logged(
            100 * trial.user_attrs["hm"]
        )
        assert metrics["psi"] == as_logged(1 - min(begin, middle, end) / max(begin, middle, end), abs=1e-3)
        # the objective is the worst PSI over the tuning structures (here the set and its length halves)
        structures = trial.user_attrs["structures"]
        assert set(structures) == {
            held_name(settings),
            f"{held_name(settings)}-shorter",
            f"{held_name(settings)}-longer",
        }
        assert metrics["psi"] == as_logged(structures[held_name(settings)]["psi"])
        assert trial.value == pytest.approx(max(s["psi"] for s in structures.values()))
        assert metrics["worst_structure_psi"] == as_logged(trial.value)
        # a relative floor is met by the point estimate (no interval): the margin is HM − floor, in points
        assert metrics["hm_margin_over_floor_x100"] == as_logged(hm - 100 * floor, abs=0.01)
        # the allowance left is the change against the uncalibrated plus the half point `--max-ndcg-drop` allows
        assert metrics["ndcg10_drop_allowance_left_x100"] == as_logged(
            metrics["ndcg10_change_vs_uncalibrated_x100"] + 100 * settings.max_ndcg_drop, abs=0.002
        )
        # feasible: every margin met — the HM floor, nDCG@10 within the allowance, and no structure of the tuning
        # passages with its bias reversed
        reversal = [
            metrics[f"structure/{s}/tilt_reversal_x100"]
            for s in trial.user_attrs["structures"]
            if f"structure/{s}/tilt_reversal_x100" in metrics
        ]
        assert (
            metrics.get("tilt_reversal_allowance_left_x100", 0) == as_logged(-max(reversal, default=0)) or not reversal
        )
        # no other structure loses more than the allowance significantly: the upper ends of their intervals of the
        # change, plus the allowance
        others = [
            metrics[f"structure/{s}/ndcg10_change_upper_bound_x100"] for s in structures if s != held_name(settings)
        ]
        assert metrics["structure_ndcg10_drop_allowance_left_x100"] == pytest.approx(
            min(others) + 100 * settings.max_ndcg_drop, abs=2e-3
        )
        # drift: on every structure, at most --max-drift (2) times the paper default's there; the baseline, which runs
        # before the paper default, moved nothing: 0 times it. The halves are scored from the set's own vectors: the
        # set's drift
        halves = [row["drift"] for s, row in structures.items() if s != held_name(settings)]
        assert halves == pytest.approx([structures[held_name(settings)]["drift"]] * 2)
        reference = study.trials[1].user_attrs["structures"]
        ratio = max(
            (row["drift"] / reference[s]["drift"] for s, row in structures.items() if reference[s]["drift"] > 0),
            default=0.0,
        )
        assert metrics["drift_allowance_left_x_paper_default"] == as_logged(2 - ratio)
        assert metrics["feasible"] == float(
            trial.user_attrs["hm"] >= floor
            and metrics["ndcg10_change_vs_uncalibrated_x100"] >= 0
            and max(reversal, default=0) <= 0
            and min(others) >= 0
            and ratio <= 2
        )
        drift = metrics["drift_from_uncalibrated_vectors"]
        assert drift >= 0 and (trial.params["strength"] > 0 or drift == 0)
        folder = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / run.info.run_id)))
        assert (folder / "attention_profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        profile = json.loads((folder / "attention_profile.json").read_text(encoding="utf-8"))
        for stage in ("before", "after"):  # the pooled row's attention: content bins + isolated tokens = 1
            for bins, isolated in zip(profile[f"{stage}_bins"], profile[f"{stage}_isolated"]):
                assert sum(bins) + sum(isolated) == pytest.approx(1, abs=1e-4)
        assert metrics["last_layer_attention_on_first_tenth_pct"] == as_logged(100 * profile["after_bins"][-1][0])
    parent = client.get_run(parents.pop())
    assert parent.data.tags["posfair.role"] == "study" and parent.data.tags["posfair.study"] == "tiny"
    assert parent.data.metrics["winner_trial"] == outcome.winner_trial
    folder = Path(client.download_artifacts(parent.info.run_id, "", str(tmp_path / "parent")))
    assert (folder / "best.yaml").read_text(encoding="utf-8") == settings.output.read_text(encoding="utf-8")
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    assert summary[0]["trial"] is None and summary[-1]["trial"] == outcome.winner_trial
    assert summary[-1]["tuning"]["psi"] == pytest.approx(study.trials[outcome.winner_trial].user_attrs["psi"])
    for held in summary[-1]["heldout"].values():  # each change as numbers too (the docs render them), the summary's own
        estimate, low, high = held["intervals"]["hm"]
        assert (
            low <= estimate <= high
            and f"ΔHM {100 * estimate:+.2f} [{100 * low:+.2f}, {100 * high:+.2f}]" in held["delta"]
        )
    assert (folder / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_baseline_and_paper_default_are_the_first_trials(workspace: dict) -> None:
    study = optuna.load_study(study_name="tiny", storage=workspace["settings"].storage)
    assert study.trials[0].params == BASELINE_PARAMS
    assert study.trials[1].params == {"strength": 0.5, "depth": "50%", "basket_size": 128, "variant": "cls_soft"}
    # the default space fixes the paper's equal (no parameter); the paper's default calibrates as the paper does
    assert PAPER_DEFAULT_PARAMS["basket_shares"] == trial_basket_shares(study.trials[1]) == "equal"
    assert {trial_basket_shares(t) for t in study.trials[2:]} == {"equal"}
    runs = {
        int(r.data.tags["posfair.trial"]): r.data.params["basket_shares"] for r in trial_runs(workspace["settings"])
    }
    assert set(runs.values()) == {"equal"}


def test_every_complete_trial_keeps_its_worst_case_per_common_resample_and_one_se_pairs_them(workspace: dict) -> None:
    """The resamples are what selection pairs two trials on: one row per common resample for every trial that
    ran (the same count for all), the point worst case among their range, and the one-SE rule judges by them."""
    study = optuna.load_study(study_name="tiny", storage=workspace["settings"].storage)
    ran = [
        t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and DUPLICATE_ATTR not in t.user_attrs
    ]
    rows = {t.number: np.array(objective_resamples(t), dtype=float) for t in ran}
    assert len({len(r) for r in rows.values()}) == 1 and len(next(iter(rows.values()))) == EVIDENCE_RESAMPLES
    for t in ran:
        finite = rows[t.number][np.isfinite(rows[t.number])]
        assert finite.size > 0.9 * EVIDENCE_RESAMPLES and finite.min() <= t.user_attrs["robust_psi"] + 1e-9
    found = winner(study, "one-se")
    assert found is not None and found[1].paired and "one paired standard error" in found[1].describe()


def test_the_export_holds_the_winning_trial(workspace: dict) -> None:
    """The YAML `tune` wrote is the selected trial's, with its tuning and held-out figures."""
    settings, outcome = workspace["settings"], workspace["outcome"]
    winning = optuna.load_study(study_name="tiny", storage=settings.storage).trials[outcome.winner_trial]
    exported = load_exported(settings.output)
    assert exported.provenance.trial == winning.number
    held = f"jsonl:{Path(settings.heldout.removeprefix('jsonl:')).name}"
    assert {"tuning", "tuning_baseline", f"heldout/{held}", f"heldout_baseline/{held}"} <= set(exported.metrics)
    assert exported.metrics["tuning"]["psi"] == pytest.approx(winning.user_attrs["psi"])
    assert exported.calibration.strength == pytest.approx(winning.params["strength"])


def test_an_exported_trial_loads_back_and_encodes_as_the_trial_scored(workspace: dict, tmp_path: Path) -> None:
    """The YAML holds the trial's own draws, and encodes exactly as that trial's documents were scored.

    Which trial wins on a random model is noise (float rounding decides it between machines), so this
    exports a calibrating trial by number (`tune export --trial`), through the same export path."""
    settings = workspace["settings"]
    study = optuna.load_study(study_name="tiny", storage=settings.storage)
    chosen = next(t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and t.params["strength"] > 0)
    path = reexport("tiny", settings.storage, tmp_path / "chosen.yaml", settings.tracking_uri, trial=chosen.number)
    exported = load_exported(path)
    assert exported.provenance.trial == chosen.number and "chosen by the user" in exported.provenance.selection
    assert exported.metrics["tuning"]["psi"] == pytest.approx(chosen.user_attrs["psi"])
    calibration = exported.calibration
    assert (calibration.variant, calibration.basket_size) == (chosen.params["variant"], chosen.params["basket_size"])
    assert calibration.strength == pytest.approx(chosen.params["strength"])
    assert calibration.layers == chosen.user_attrs["layers"]  # explicit indices, as the trial resolved them
    if "weight" in chosen.params:  # CLS-Hard's w
        assert calibration.weight == pytest.approx(chosen.params["weight"])
    # The trial's config, built here from what Optuna stored (not through tune's own conversion).
    model = load_model(settings.model, pooling="cls")
    drawn = CalibrationConfig(
        variant=chosen.params["variant"],
        strength=chosen.params["strength"],
        layers=chosen.user_attrs["layers"],
        basket_size=chosen.params["basket_size"],
        pooling="cls",
        basket_shares=trial_basket_shares(chosen),
        **({"weight": chosen.params["weight"]} if "weight" in chosen.params else {}),
    )
    evaluator = Evaluator(model, load_benchmark(settings.dataset), disk_cache=False)
    trial_vectors, _ = evaluator.document_vectors(drawn)
    baseline_vectors, _ = evaluator.document_vectors(None)
    assert (
        np.abs(trial_vectors - baseline_vectors).max() > 1e-4
    )  # the trial does calibrate: the check below means something
    texts = [evaluator.dataset.corpus[d] for d in evaluator.doc_ids]
    assert np.abs(CalibratedEncoder.from_yaml(path).encode(texts) - trial_vectors).max() < 1e-6


def test_exporting_a_trial_that_is_not_complete_names_the_complete_ones(workspace: dict, tmp_path: Path) -> None:
    settings = workspace["settings"]
    with pytest.raises(
        ValueError, match=r"--trial 99: study 'tiny' has no complete trial 99; complete trials: \[0, 1, 2"
    ):
        reexport("tiny", settings.storage, tmp_path / "none.yaml", settings.tracking_uri, trial=99)
    assert not (tmp_path / "none.yaml").exists()


def test_rerunning_resumes_the_study_without_repeating_trials(workspace: dict) -> None:
    settings = replace(workspace["settings"], trials=8)
    tune(settings)
    study = optuna.load_study(study_name="tiny", storage=settings.storage)
    assert sum(counted(t) for t in study.trials) == 8
    ran = [t.number for t in study.trials if not never_ran(t)]  # a queued trial the study ended first never ran
    assert sorted(int(r.data.tags["posfair.trial"]) for r in trial_runs(settings)) == ran


def test_same_seed_same_trials(workspace: dict, tmp_path: Path) -> None:
    settings = replace(
        workspace["settings"],
        storage=f"sqlite:///{tmp_path / 'again.db'}",
        tracking_uri=f"sqlite:///{tmp_path / 'again-mlflow.db'}",
        output=tmp_path / "again.yaml",
    )
    tune(settings)
    again = optuna.load_study(study_name="tiny", storage=settings.storage).trials
    first = optuna.load_study(study_name="tiny", storage=workspace["settings"].storage).trials[: len(again)]
    assert [t.params for t in again] == [t.params for t in first]


def test_a_floor_no_trial_reaches_ends_without_an_export(workspace: dict, tmp_path: Path) -> None:
    settings = replace(
        workspace["settings"],
        trials=2,
        hm_floor="0.999",
        study_name="unreachable",
        storage=f"sqlite:///{tmp_path / 'o.db'}",
        tracking_uri=f"sqlite:///{tmp_path / 'm.db'}",
        output=tmp_path / "none.yaml",
    )
    with pytest.raises(
        NoFeasibleTrialError,
        match=r"no trial met the constraints; nothing exported. every trial misses the HM floor \(the closest, "
        r"trial \d: HM [\d.]+ < 99.90\)",
    ):
        tune(settings)
    assert not (tmp_path / "none.yaml").exists()
    said = optuna.load_study(study_name="unreachable", storage=settings.storage).user_attrs["winner"]
    assert said.startswith("none: no trial met the constraints; nothing exported. every trial misses the HM floor")


def add_trial(
    study: optuna.Study, psi: float, hm: float, floor_gap: float, screen: dict[str, float] | None = None
) -> None:
    """A complete trial; `screen`: its figures on the pooled screen (None: not screened)."""
    user_attrs: dict[str, object] = {"psi": psi, "hm": hm} | ({SCREEN_ATTR: screen} if screen is not None else {})
    trial = optuna.trial.create_trial(
        params={}, distributions={}, value=psi, user_attrs=user_attrs, system_attrs={"constraints:hm_floor": floor_gap}
    )
    study.add_trial(trial)


def test_the_winner_is_the_feasible_trial_with_lowest_psi_ties_to_higher_hm() -> None:
    study = optuna.create_study()
    add_trial(study, psi=0.05, hm=0.40, floor_gap=0.02)  # lowest PSI but below the floor
    add_trial(study, psi=0.10, hm=0.50, floor_gap=-0.01)
    add_trial(study, psi=0.10, hm=0.55, floor_gap=-0.06)  # same PSI, higher HM
    add_trial(study, psi=0.20, hm=0.60, floor_gap=-0.11)
    chosen, selection = winner(study, "lowest")
    assert chosen.number == 2 and selection.rule == "lowest"


def test_the_screen_threshold_is_the_best_feasible_screen_psi_plus_its_standard_error() -> None:
    study = optuna.create_study()
    add_trial(study, psi=0.10, hm=0.50, floor_gap=-0.01)  # feasible, not screened: no screen figure to compare with
    assert screen_threshold(study) is None
    add_trial(study, psi=0.12, hm=0.50, floor_gap=-0.01, screen={"psi": 0.20, "psi_se": 0.02, "hm": 0.6})
    add_trial(study, psi=0.15, hm=0.50, floor_gap=-0.01, screen={"psi": 0.25, "psi_se": 0.01, "hm": 0.6})
    add_trial(study, psi=0.05, hm=0.40, floor_gap=0.02, screen={"psi": 0.05, "psi_se": 0.01, "hm": 0.5})  # infeasible
    assert screen_threshold(study) == pytest.approx(0.20 + 0.02)


@pytest.fixture(params=["sqlite", "journal"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A study database, or an Optuna journal."""
    return f"sqlite:///{tmp_path / 's.db'}" if request.param == "sqlite" else f"journal:{tmp_path / 's.journal'}"


def test_ctrl_c_stops_after_the_current_trial_and_a_rerun_completes(storage: str) -> None:
    calls = []

    def objective(trial: optuna.Trial) -> float:
        calls.append(trial.number)
        if trial.number == 1:
            os.kill(os.getpid(), signal.SIGINT)  # as if the user pressed Ctrl-C mid-trial
        x = trial.suggest_float("x", 0, 1)
        trial.set_user_attr("psi", x)
        trial.set_user_attr("hm", 1 - x)
        trial.set_constraint("hm_floor", -1.0)
        return x

    study = open_study("interrupt", storage, seed=0, pareto=False, identity={"k": 1})
    run_trials(study, objective, 5)
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE] * 2  # trial 1 finished, nothing after it
    run_trials(open_study("interrupt", storage, seed=0, pareto=False, identity={"k": 1}), objective, 5)
    assert [t.state for t in load_stored_study("interrupt", storage).trials] == [optuna.trial.TrialState.COMPLETE] * 5


def test_a_trial_failed_as_stale_by_another_process_does_not_kill_this_worker(storage: str) -> None:
    """optuna#5470: when another worker's heartbeat check fails our running trial, Optuna's tell raises
    "Cannot tell a FAIL trial" out of `optimize`; the worker must go on to the requested count."""
    study = open_study("stale", storage, seed=0, pareto=False, identity={"k": 1})

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", 0, 1)
        trial.set_user_attr("psi", x)
        trial.set_user_attr("hm", 1 - x)
        trial.set_constraint("hm_floor", -1.0)
        if trial.number == 1:  # what `fail_stale_trials` in another process does to a trial it thinks dead
            study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
        return x

    run_trials(study, objective, 3)
    states = [t.state for t in load_stored_study("stale", storage).trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 3 and states[1] == optuna.trial.TrialState.FAIL


def test_a_trial_left_running_by_a_dead_local_process_is_rerun_before_any_new_trial(storage: str) -> None:
    """README: a run killed and started again at once re-runs the interrupted trial, with what it had drawn,
    before any new one (not only once the new ones have filled the study)."""
    study = open_study("dead", storage, seed=0, pareto=False, identity={"k": 1})
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process of this machine that has ended: the killed run
    orphan = study.ask()
    drawn = orphan.suggest_float("x", 0, 1)
    orphan.set_user_attr(OWNER_ATTR, {"host": socket.gethostname(), "pid": gone.pid, "trial": orphan.number})
    seen: list[float] = []

    def objective(trial: optuna.Trial) -> float:
        seen.append(x := trial.suggest_float("x", 0, 1))
        trial.set_user_attr("psi", x)
        trial.set_user_attr("hm", 1 - x)
        trial.set_constraint("hm_floor", -1.0)
        return x

    run_trials(study, objective, 3)
    assert seen[0] == drawn and len(seen) == 3
    states = [t.state for t in load_stored_study("dead", storage).trials]
    assert states == [optuna.trial.TrialState.FAIL] + [optuna.trial.TrialState.COMPLETE] * 3


@pytest.mark.timeout(120)
def test_a_trial_whose_process_died_before_its_first_heartbeat_is_rerun_not_waited_for(
    storage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A process killed between Optuna creating its trial and the first heartbeat (or posfair's owner mark)
    leaves a RUNNING trial that Optuna's stale check never fails (it has no heartbeat to go stale). Once it is
    older than the grace period it is failed and re-queued, instead of being waited for forever (CI hung
    600 s on this when the kill landed in that window)."""
    study = open_study("orphan", storage, seed=0, pareto=False, identity={"k": 1}, heartbeat=1)
    started = datetime.datetime.now() - datetime.timedelta(
        seconds=grace_seconds(study._storage) + 7
    )  # past the grace period
    template = optuna.trial.FrozenTrial(
        number=0,
        state=optuna.trial.TrialState.RUNNING,
        value=None,
        datetime_start=started,
        datetime_complete=None,
        params={},
        distributions={},
        user_attrs={},
        system_attrs={},
        intermediate_values={},
        trial_id=0,
    )
    study._storage.create_new_trial(study._study_id, template_trial=template)

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr("psi", x := trial.suggest_float("x", 0, 1))
        trial.set_user_attr("hm", 1 - x)
        trial.set_constraint("hm_floor", -1.0)
        return x

    with caplog.at_level(logging.WARNING, logger="tuner.tuning.owners"):
        end = run_trials(study, objective, 1, poll_seconds=0.2)
    assert end.complete == 1
    states = [t.state for t in load_stored_study("orphan", storage).trials]
    assert states == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE]
    assert (
        "trial 0 was left RUNNING by a process that stopped as it began the trial, which is gone; it is re-run"
        in caplog.text
    )


def test_a_trial_just_created_by_a_live_process_is_not_taken_for_an_orphan(storage: str) -> None:
    """The counterpart: an ownerless RUNNING trial younger than the grace period may be a live process's
    trial a moment before its owner mark, so it is left alone."""
    study = open_study("young", storage, seed=0, pareto=False, identity={"k": 1}, heartbeat=20)
    young = study.ask()
    assert fail_dead_trials(study) == []
    assert study._storage.get_trial(young._trial_id).state == optuna.trial.TrialState.RUNNING


def test_a_real_mlflow_server_serves_the_trials_for_comparison(workspace: dict, tmp_path: Path) -> None:
    """Start `mlflow server` on the study's store and read the runs back over its REST API."""
    import requests

    with running_mlflow_server(workspace["settings"].tracking_uri, tmp_path) as server:
        base = f"{server.uri}/api/2.0/mlflow"
        experiment = requests.get(f"{base}/experiments/get-by-name", params={"experiment_name": "posfair"}, timeout=10)
        experiment_id = experiment.json()["experiment"]["experiment_id"]
        found = requests.post(
            f"{base}/runs/search",
            json={
                "experiment_ids": [experiment_id],
                "filter": "tags.`posfair.role` = 'trial' and tags.`posfair.study` = 'tiny'",
                "max_results": 100,
            },
            timeout=10,
        ).json()["runs"]
    assert len(found) >= 6
    for run in found:
        params = {p["key"] for p in run["data"]["params"]}
        metrics = {m["key"] for m in run["data"]["metrics"]}
        assert TRIAL_PARAMS <= params and {"hm_x100", "psi"} <= metrics  # what parallel coordinates compare


def test_basket_sizes_no_passage_fills_leave_the_search(workspace: dict) -> None:
    """A basket longer than every passage calibrates nothing (§3): such trials would repeat the baseline."""
    assert SearchSpace().fitting(300).basket_sizes == (64, 128, 256)
    with pytest.raises(ConfigError, match="none fits the longest passage .50 content tokens.*<= 50"):
        SearchSpace().fitting(50)
    settings = workspace["settings"]
    model = load_model(settings.model, pooling="cls")
    longest = (
        Evaluator(model, load_benchmark(settings.dataset), 4, disk_cache=False).batches().longest - 1
    )  # less [CLS]
    study = optuna.load_study(study_name="tiny", storage=settings.storage)
    drawn = {t.params["basket_size"] for t in study.trials if not never_ran(t)}
    assert drawn <= {b for b in (8, 16, 128) if b <= longest} and drawn


def test_each_trial_is_constrained_by_its_psi_on_the_crops_against_the_uncalibrated_one(
    tiny_model_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a crops view, every trial records crops_psi = PSI_crops(config) − 1 × PSI_crops(uncalibrated),
    recomputed here with a separate Evaluator from the configs Optuna stored."""
    import tuner.tuning.study_data

    crops = replace(load_benchmark(f"jsonl:{write_dataset(tmp_path / 'crops', docs=8, seed=5)}"), name="tiny-crops")
    monkeypatch.setattr(tuner.tuning.study_data, "load_structures", lambda name, tuning=None: [crops])
    settings = TuneSettings(
        model=str(tiny_model_dir("bert")),
        pooling="cls",
        dataset=f"jsonl:{write_dataset(tmp_path / 'data')}",
        heldout=None,
        trials=3,
        hm_floor="-90%",
        max_ndcg_drop=None,
        storage=f"sqlite:///{tmp_path / 'o.db'}",
        tracking_uri=f"sqlite:///{tmp_path / 'm.db'}",
        output=tmp_path / "best.yaml",
        study_name="crops",
        profile_docs=2,
        bootstrap=20,
        space=SearchSpace(basket_sizes=(8, 16)),
        selection="lowest",
        max_crops_psi=1.0,
        prune=False,
    )
    tune(settings)
    model = load_model(settings.model, pooling="cls")
    evaluator = Evaluator(model, crops, disk_cache=False)
    uncalibrated = evaluator.run(None).report.psi
    study = optuna.load_study(study_name="crops", storage=settings.storage)
    for trial in study.trials[1:]:  # trial 0 is the uncalibrated model itself
        if DUPLICATE_ATTR in trial.user_attrs:
            continue
        config = CalibrationConfig(
            variant=trial.params["variant"],
            strength=trial.params["strength"],
            layers=trial.user_attrs["layers"],
            basket_size=trial.params["basket_size"],
            pooling="cls",
            **({"weight": trial.params["weight"]} if "weight" in trial.params else {}),
        )
        psi = evaluator.run(config).report.psi
        assert trial.user_attrs["structures"]["tiny-crops"]["psi"] == pytest.approx(
            psi, rel=1e-5
        )  # the crops are a structure
        assert named_constraints(trial)["crops_psi"] == pytest.approx(psi - uncalibrated, abs=1e-9)


def test_a_process_opening_the_study_while_its_creator_writes_the_identity_is_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two identical `tune`s on one fresh folder: the second read the identity key by key while the first was
    still writing it, then saw the first's baseline trial, and refused the study as "created with other
    settings" (CI, `test_two_identical_tunes_on_one_fresh_folder_export_once[sqlite]`)."""
    import tuner.tuning.study

    identity = {"model_name": "m", "dataset": "d", "hm_floor": "significant", "seed": 0, "bisect": True}
    storage = optuna.storages.InMemoryStorage()
    creator = optuna.create_study(study_name="race", storage=storage)
    pending = sorted(identity)  # the creator writes in sorted order, one key at a time, then queues its baseline

    def creator_step() -> None:
        if pending:
            key = pending.pop(0)
            creator.set_user_attr(key, identity[key])
        elif not creator.trials:
            creator.enqueue_trial({"x": 0.0})

    class Interleaved(optuna.storages.InMemoryStorage):
        """The second process's storage: before each of its reads of the study's attributes or trials, the
        creator writes one more key (or, once done, queues its baseline)."""

        def __getattribute__(self, name: str) -> object:
            attr = object.__getattribute__(storage, name)
            if name in ("get_study_user_attrs", "get_all_trials"):

                def read(*args: object, **kwargs: object) -> object:
                    creator_step()
                    return attr(*args, **kwargs)

                return read
            return attr

    monkeypatch.setattr(tuner.tuning.study, "make_storage", lambda url, heartbeat: Interleaved())
    opened = open_study("race", "sqlite:///unused.db", seed=0, pareto=False, identity=identity)
    while pending or not creator.trials:
        creator_step()
    assert {k: opened.user_attrs[k] for k in identity} == identity
