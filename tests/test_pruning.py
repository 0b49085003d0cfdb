"""Pruned trials through a real study: counted towards --trials, PRUNED in Optuna with no value (so no plot ranks
them among complete trials), visibly pruned in MLflow (FINISHED as designed, named `pruned`, tagged with the rung and
reason, their figures never under a complete trial's names), never selected or exported, and counted right on resume."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient
from optuna.trial import FrozenTrial

import tuner.tuning.study_data
import tuner.tuning.trial.scoring
from objectives.robustness import prune_reason
from tests.services import as_logged, dashboard_api
from tests.test_study import write_dataset
from tuner.common.trials import DUPLICATE_ATTR, PRUNED_ATTR, SCREEN_ATTR, counted, named_constraints
from tuner.data import load_benchmark
from tuner.engine.exported import load_exported
from tuner.tuning.candidates import candidates
from tuner.tuning.run import TuneSettings, tune
from tuner.tuning.search_space import SearchSpace

pytestmark = pytest.mark.usefixtures("module_cache")  # the studies run here, their disk cache not in the checkout


def tiny_study(model: Path, data: Path, folder: Path, name: str, **changes: object) -> TuneSettings:
    """A 4-trial study of the tiny model on `data`, with every constraint but the HM floor (−90%) lifted; the sampler
    draws every trial after the references (no queued siblings), which are what pruning is about."""
    defaults: dict[str, object] = dict(
        model=str(model),
        pooling="cls",
        dataset=f"jsonl:{data}",
        heldout=None,
        trials=4,
        hm_floor="-90%",
        max_ndcg_drop=None,
        max_reversal=None,
        max_drift=None,
        storage=f"sqlite:///{folder / 'o.db'}",
        tracking_uri=f"sqlite:///{folder / 'm.db'}",
        output=folder / "best.yaml",
        study_name=name,
        profile_docs=2,
        bootstrap=20,
        space=SearchSpace(basket_sizes=(8, 16, 128)),  # 128: the references are in the space
        selection="lowest",
        paper_siblings=False,
    )
    return TuneSettings(**(defaults | changes))  # type: ignore[arg-type]


def trial_run(settings: TuneSettings, number: int) -> Run:
    """Trial `number`'s MLflow run."""
    client = MlflowClient(settings.tracking_uri)
    experiment = client.get_experiment_by_name("posfair")
    return client.search_runs([experiment.experiment_id], f"tags.`posfair.trial` = '{number}'")[0]


def assert_logged_apart(settings: TuneSettings, pruned: list[FrozenTrial], complete: FrozenTrial) -> None:
    """No pruned trial's run logs a figure (its constraint margins so far among them) under a name the `complete`
    trial's run logs, but for its cost and its per-structure figures (complete for each structure scored)."""
    logged = set(trial_run(settings, complete.number).data.metrics)
    complete_names = {name for name in logged if name != "cost/layer_tokens" and not name.startswith("structure/")}
    assert {"psi", "hm_x100", "hm_margin_over_floor_x100"} <= complete_names, "a complete run, as this check needs"
    for trial in pruned:
        metrics = trial_run(settings, trial.number).data.metrics
        assert complete_names.isdisjoint(metrics), f"trial {trial.number}: a partial figure under a complete one's name"


@pytest.fixture()
def pruning_study(tiny_model_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture):
    """A tiny study with one extra structure (8 passages against the tuning passages' 12), scored first (a random
    model's bias decides no order worth testing here; the order has its own test), in which every non-reference
    trial is pruned at its first rung (the rule is the real one with a threshold nothing can beat)."""
    structure = replace(
        load_benchmark(f"jsonl:{write_dataset(tmp_path / 'other', docs=8, seed=3)}"), name="tiny-openings"
    )
    monkeypatch.setattr(tuner.tuning.study_data, "load_structures", lambda name, tuning=None: [structure])
    monkeypatch.setattr(
        tuner.tuning.trial.scoring, "corpus_rungs", lambda tuning, uncalibrated, structures: [*structures, None]
    )
    monkeypatch.setattr(
        tuner.tuning.trial.scoring, "selection_threshold", lambda study, rule: -1.0
    )  # nothing can beat it
    settings = tiny_study(tiny_model_dir("bert"), write_dataset(tmp_path / "data"), tmp_path, "pruning")
    caplog.set_level("INFO", logger="tuner")  # what the console says (a test reads the setup's records)
    return settings, tune(settings)


def test_pruned_trials_count_stay_out_of_selection_and_are_marked_in_both_stores(pruning_study) -> None:
    settings, outcome = pruning_study
    study = optuna.load_study(study_name="pruning", storage=settings.storage)
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned and all(t.number > 1 for t in pruned)  # the baseline and the paper default always run every rung
    assert sum(counted(t) for t in study.trials) == 4  # pruned trials were run (one rung) and count
    references = [t for t in study.trials if t.number == 1]  # the paper default: every rung, as a complete trial
    for trial in pruned:
        record = trial.user_attrs[PRUNED_ATTR]
        # the structure is the first rung: the trial stopped before the tuning passages were encoded
        assert record["rung"] == 0 and record["of"] == 2 and record["scored"] == ["tiny-openings"]
        assert "worst-case PSI" in record["reason"]
        assert trial.value is None and not trial.intermediate_values  # no partial figure in a complete one's place
        assert (
            trial.user_attrs["feasible"]
            == f"NO: pruned after tiny-openings (rung 0 of 2): {record['reason']}; never a candidate"
        )
        assert "metrics" not in trial.user_attrs and "psi" not in trial.user_attrs  # nothing of the tuning split
        assert list(trial.user_attrs["structures"]) == ["tiny-openings"]
        assert 0 < trial.user_attrs["layer_tokens"] < references[0].user_attrs["layer_tokens"] / 2  # 8 passages of 20
    assert {c.trial_number for c in candidates(study)}.isdisjoint(t.number for t in pruned)
    assert outcome.winner_trial not in {t.number for t in pruned}
    assert load_exported(settings.output).provenance.trial == outcome.winner_trial
    assert_logged_apart(settings, pruned, references[0])
    for trial in pruned:
        run = trial_run(settings, trial.number)
        assert run.info.status == "FINISHED" and run.info.run_name == f"trial-{trial.number} · pruned"
        assert run.data.tags["posfair.state"] == "PRUNED" and run.data.tags["posfair.pruned"].startswith(
            "rung 0 of 2: worst-case PSI"
        )
        assert run.data.metrics["cost/layer_tokens"] == trial.user_attrs["layer_tokens"]
        row = trial.user_attrs["structures"]["tiny-openings"]
        assert run.data.metrics["pruned/structure/tiny-openings/psi"] == as_logged(
            row["psi"]
        )  # complete, for that structure
        assert run.data.metrics["pruned/worst_psi_of_the_structures_scored"] == as_logged(row["psi"])


@pytest.fixture()
def flattering_first_rung(tiny_model_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`pruning_study`'s study, with the first rung (an extra structure) scoring every calibrated trial at PSI 0.001:
    what a calibration that over-flattens a structure shows there. Each drawn trial is pruned after it, its worst case
    so far 0.001, far below any complete trial's value (the tuning passages' PSI counts for those)."""
    structure = replace(
        load_benchmark(f"jsonl:{write_dataset(tmp_path / 'other', docs=8, seed=3)}"), name="tiny-openings"
    )
    monkeypatch.setattr(tuner.tuning.study_data, "load_structures", lambda name, tuning=None: [structure])
    monkeypatch.setattr(
        tuner.tuning.trial.scoring, "corpus_rungs", lambda tuning, uncalibrated, structures: [*structures, None]
    )
    monkeypatch.setattr(
        tuner.tuning.trial.scoring, "selection_threshold", lambda study, rule: -1.0
    )  # nothing can beat it
    real, on_structure = tuner.tuning.trial.scoring.trial_evidence, len(structure.queries)

    def flattered(baseline, candidate, *args, **kwargs):  # type: ignore[no-untyped-def]
        found = real(baseline, candidate, *args, **kwargs)
        calibrated = candidate.ndcg10.tolist() != baseline.ndcg10.tolist()
        return replace(found, objective=0.001) if len(candidate.query_ids) == on_structure and calibrated else found

    monkeypatch.setattr(tuner.tuning.trial.scoring, "trial_evidence", flattered)
    settings = tiny_study(tiny_model_dir("bert"), write_dataset(tmp_path / "data"), tmp_path, "flattering")
    return settings, tune(settings)


def test_a_pruned_trial_fairer_so_far_than_the_winner_is_ranked_above_it_nowhere(flattering_first_rung) -> None:
    """Optuna gives a pruned trial the last intermediate value it reported as its value. A worst case over fewer
    structures is a lower bound, so it would stand below the winner's value: optuna-dashboard's history (pruned trials
    included, its default) and distribution plots would draw it as the fairest. Here it has no value: Optuna's best
    trial is a complete one, and the dashboard's history data (its API) holds no pruned trial to rank."""
    settings, outcome = flattering_first_rung
    study = optuna.load_study(study_name="flattering", storage=settings.storage)
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    winner = study.trials[outcome.winner_trial]
    assert pruned and all(t.user_attrs["structures"]["tiny-openings"]["psi"] == 0.001 < winner.value for t in pruned), (
        "the study this test needs: every pruned trial fairer so far than the winner is in the end"
    )
    assert all(t.value is None for t in pruned)
    assert study.best_trial.state == optuna.trial.TrialState.COMPLETE and study.best_value <= winner.value
    detail = dashboard_api(settings.storage, f"/api/studies/{study._study_id}")
    plotted = [
        t for t in detail["trials"] if t["state"] in ("Complete", "Pruned") and "values" in t
    ]  # the history's trials
    assert {t["number"] for t in plotted}.isdisjoint(t.number for t in pruned)
    assert min(t["values"][0] for t in plotted) == study.best_value
    assert [t["number"] for t in detail["best_trials"]] == [study.best_trial.number]
    for trial in (
        t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and DUPLICATE_ATTR not in t.user_attrs
    ):
        steps = trial.intermediate_values
        assert steps[max(steps)] == trial.value, "a complete trial's intermediate values end at its value"
        assert list(steps.values()) == sorted(steps.values()), "a worst case over more structures never falls"


def test_a_resumed_study_counts_its_pruned_trials_and_adds_only_what_is_missing(pruning_study) -> None:
    settings, _ = pruning_study
    tune(replace(settings, trials=6))
    study = optuna.load_study(study_name="pruning", storage=settings.storage)
    assert sum(counted(t) for t in study.trials) == 6


def test_the_pruning_rule_the_study_used_is_the_one_specified() -> None:
    """The study calls `objectives.robustness.prune_reason` itself, not a copy of it."""
    assert tuner.tuning.trial.scoring.prune_reason is prune_reason


def test_a_trial_that_cannot_pass_the_pooled_screen_stops_there_at_a_fraction_of_the_cost(
    tiny_model_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """100 passages, one query per group in the screen: the pool holds at most 3 + 3 × 10 passages; rungs: the
    screen, the tuning split and its two length halves. With a
    screen threshold nothing can beat, every trial but the references stops after the screen, PRUNED, its rung
    and reason recorded; the references run every rung and carry their screen figures."""
    monkeypatch.setattr(tuner.tuning.trial.scoring, "screen_threshold", lambda study: -1.0)
    settings = tiny_study(
        tiny_model_dir("bert"), write_dataset(tmp_path / "data", docs=100), tmp_path, "screen", screen_queries=1
    )
    with caplog.at_level("INFO"):
        tune(settings)
    screen_line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("pooled screen:"))
    passages = int(screen_line.split(" over ")[1].split(" of ")[0])
    assert screen_line.startswith("pooled screen: 3 queries over ") and passages <= 33
    assert screen_line.endswith(f"of jsonl:data's 100 passages ({passages}%), scored first in every trial")
    study = optuna.load_study(study_name="screen", storage=settings.storage)
    references = [t for t in study.trials if t.number < 2]
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned and all(t.number > 1 for t in pruned)
    assert all(t.state == optuna.trial.TrialState.COMPLETE and SCREEN_ATTR in t.user_attrs for t in references)
    full_cost = max(t.user_attrs["layer_tokens"] for t in references)
    for trial in pruned:
        record = trial.user_attrs[PRUNED_ATTR]
        assert record["rung"] == 0 and record["of"] == 4 and record["scored"] == ["jsonl:data-pool"]
        assert "pooled screen" in record["reason"] and SCREEN_ATTR in trial.user_attrs
        assert 0 < trial.user_attrs["layer_tokens"] < full_cost / 2  # the pool, not the corpus
    client = MlflowClient(settings.tracking_uri)
    run = client.search_runs(
        [client.get_experiment_by_name("posfair").experiment_id], f"tags.`posfair.trial` = '{pruned[0].number}'"
    )[0]
    screened = pruned[0].user_attrs[SCREEN_ATTR]
    assert "psi" not in pruned[0].user_attrs and "psi" not in run.data.metrics  # the pool's PSI is not the split's
    assert run.data.metrics["pruned/screen/psi"] == as_logged(screened["psi"])
    assert run.data.metrics["pruned/screen/hm_x100"] == as_logged(100 * screened["hm"])
    tag = run.data.tags["posfair.pruned"]
    assert run.info.status == "FINISHED" and tag.startswith("rung 0 of 4: ") and "pooled screen" in tag


def test_a_constraint_the_tuning_split_decides_prunes_the_trial_before_its_other_structures(
    tiny_model_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nDCG@10 constraint is the tuning split's own point figure, final once that split is scored: a trial that
    loses nDCG@10 there is infeasible whatever its other structures show, so it stops after the tuning split, even
    when the upper end of its nDCG@10 interval is above the limit (not "beyond noise", but decided). A trial that
    keeps nDCG@10 goes on (no PSI threshold prunes here). The tuning passages are the first rung here."""
    structure = replace(
        load_benchmark(f"jsonl:{write_dataset(tmp_path / 'other', docs=16, seed=3)}"), name="tiny-openings"
    )
    monkeypatch.setattr(tuner.tuning.study_data, "load_structures", lambda name, tuning=None: [structure])
    monkeypatch.setattr(
        tuner.tuning.trial.scoring, "corpus_rungs", lambda tuning, uncalibrated, structures: [None, *structures]
    )
    monkeypatch.setattr(
        tuner.tuning.trial.scoring, "selection_threshold", lambda study, rule: None
    )  # nothing to beat: PSI never prunes
    settings = tiny_study(
        tiny_model_dir("bert"),
        write_dataset(tmp_path / "data"),
        tmp_path,
        "decided",
        trials=8,
        max_ndcg_drop=0.0,
        bisect=False,
    )  # without λ bisection, whose chains after an nDCG@10 loss would fill the study (tests/test_bisection.py)
    judged = []  # the resamples each trial's evidence drew: one seed for all, so a config is judged alike in any trial
    real = tuner.tuning.trial.scoring.trial_evidence
    monkeypatch.setattr(
        tuner.tuning.trial.scoring,
        "trial_evidence",
        lambda *args, **kwargs: judged.append(kwargs) or real(*args, **kwargs),
    )
    tune(settings)
    assert judged and all(kwargs == {} for kwargs in judged), "trial_evidence's own fixed seed, not one per trial"
    trials = [
        t
        for t in optuna.load_study(study_name="decided", storage=settings.storage).trials
        if counted(t) and t.number > 1
    ]
    lost = [t for t in trials if t.user_attrs["structures"]["jsonl:data"]["ndcg10_delta"] < 0]
    kept = [t for t in trials if t.user_attrs["structures"]["jsonl:data"]["ndcg10_delta"] >= 0]
    assert lost and kept, "the tiny study must draw both kinds for this test to say anything"
    for trial in lost:
        assert trial.state == optuna.trial.TrialState.PRUNED
        record = trial.user_attrs[PRUNED_ATTR]
        delta = trial.user_attrs["structures"]["jsonl:data"]["ndcg10_delta"]
        assert record["scored"] == ["jsonl:data"] and record["reason"] == (
            f"loses nDCG@10 on the tuning passages (nDCG@10 {100 * delta + 0.0:+.2f} vs uncalibrated, "
            "< +0.00 allowed), "
            "which no remaining structure can undo"
        )
        assert named_constraints(trial)["ndcg_drop"] > 0  # filed as infeasible for TPE
    assert all(
        t.state == optuna.trial.TrialState.COMPLETE and "tiny-openings" in t.user_attrs["structures"] for t in kept
    )


def test_a_trial_that_moves_the_vectors_further_than_the_drift_limit_stops_on_its_first_rung(
    tiny_model_dir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--max-drift k: on every structure, a trial's drift (mean 1 − cosine to the uncalibrated vectors) may be at most k
    times the paper default's there. Drift needs no bootstrap, and the largest ratio over the structures can only
    grow, so a trial over the limit on its first rung is pruned there, filed infeasible for TPE; the paper default's
    own value is 1 − k (itself its yardstick); a trial within the limit on every structure completes."""
    structure = replace(
        load_benchmark(f"jsonl:{write_dataset(tmp_path / 'other', docs=16, seed=3)}"), name="tiny-openings"
    )
    monkeypatch.setattr(tuner.tuning.study_data, "load_structures", lambda name, tuning=None: [structure])
    monkeypatch.setattr(
        tuner.tuning.trial.scoring, "corpus_rungs", lambda tuning, uncalibrated, structures: [*structures, None]
    )
    monkeypatch.setattr(
        tuner.tuning.trial.scoring, "selection_threshold", lambda study, rule: None
    )  # nothing to beat: PSI never prunes
    settings = tiny_study(
        tiny_model_dir("bert"),
        write_dataset(tmp_path / "data"),
        tmp_path,
        "drift",
        trials=10,
        max_drift=1.0,
        bisect=False,
    )
    tune(settings)
    trials = optuna.load_study(study_name="drift", storage=settings.storage).trials
    reference = {name: row["drift"] for name, row in trials[1].user_attrs["structures"].items()}
    assert all(value > 0 for value in reference.values()) and named_constraints(trials[1])["drift"] == pytest.approx(
        0.0
    )
    drawn = [t for t in trials if counted(t) and t.number > 1]
    over = [t for t in drawn if t.user_attrs["structures"]["tiny-openings"]["drift"] > reference["tiny-openings"]]
    within = [t for t in drawn if t not in over]
    assert over and within, "the tiny study must draw both kinds for this test to say anything"
    for trial in over:
        assert trial.state == optuna.trial.TrialState.PRUNED and list(trial.user_attrs["structures"]) == [
            "tiny-openings"
        ]
        ratio = trial.user_attrs["structures"]["tiny-openings"]["drift"] / reference["tiny-openings"]
        assert trial.user_attrs[PRUNED_ATTR]["reason"] == (
            f"is over the drift limit (tiny-openings: {ratio:.2f}× the paper default's drift, > 1×), "
            "which no remaining structure can undo"
        )
        assert named_constraints(trial)["drift"] == pytest.approx(ratio - 1.0)
    assert_logged_apart(settings, over, within[0])  # the margins so far, never under a complete trial's names
    for trial in within:
        assert trial.state == optuna.trial.TrialState.COMPLETE
        rows = trial.user_attrs["structures"]
        assert rows["jsonl:data"]["drift"] == pytest.approx(
            trial.user_attrs["drift"]
        )  # the tuning passages' drift, as selection reads it
        worst = max(rows[name]["drift"] / reference[name] for name in reference)
        assert named_constraints(trial)["drift"] == pytest.approx(worst - 1.0)
        assert (worst <= 1.0) == (
            trial.number
            in {
                c.trial_number
                for c in candidates(optuna.load_study(study_name="drift", storage=settings.storage))
                if c.feasible
            }
        )


def test_rungs_go_from_the_least_biased_structure_to_the_most_and_free_sets_last() -> None:
    """WikiPos-dev's figures: the crops (uncalibrated PSI 0.161), the openings (0.188), dev (0.299): a reversal or
    an nDCG@10 loss shows first where there is least bias to remove, whatever the structure costs; a length half is
    scored from the tuning vectors, so it comes after them whatever its PSI. A structure with no bias at all
    (PSI 0) goes first: any change there is damage."""
    from types import SimpleNamespace

    from tuner.tuning.trial.scoring import corpus_rungs

    def side(name: str, tokens: int, psi: float, shares: object = None) -> SimpleNamespace:
        return SimpleNamespace(
            name=name, evaluator=SimpleNamespace(tokens=tokens), report=SimpleNamespace(psi=psi), shares=shares
        )

    openings, crops, flat = side("openings", 41_000, 0.188), side("crops", 90_000, 0.161), side("flat", 1_000, 0.0)
    half = side("shorter", 144_000, 0.9, shares=object())
    rungs = corpus_rungs(SimpleNamespace(tokens=144_000), SimpleNamespace(psi=0.299), [half, crops, flat, openings])  # type: ignore[arg-type]
    assert [r.name if r is not None else "dev" for r in rungs] == ["flat", "crops", "openings", "dev", "shorter"]


def test_the_drift_yardstick_is_the_paper_default_s_complete_trial_and_without_one_the_log_says_the_limit_is_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The reference is found by its knobs (whatever space ran it) once complete; a study without it (a space that
    excludes the paper default) applies no drift limit and says so once, in the log, naming the trial."""
    from objectives import Constraints
    from tuner.tuning.search_space import PAPER_DEFAULT_PARAMS, SearchSpace
    from tuner.tuning.trial.drift_yardstick import DriftYardstick

    def objective() -> DriftYardstick:
        return DriftYardstick(Constraints(0.5, max_drift=2.0), wait_seconds=0.0, poll_seconds=0.0)

    study = optuna.create_study()
    drawn = study.ask()  # a drawn trial, with no reference in the study
    without = objective()
    with caplog.at_level("WARNING"):
        without.await_reference(drawn)
        without.await_reference(drawn)
    assert without.reference is None
    warnings = [r.getMessage() for r in caplog.records if "--max-drift" in r.getMessage()]
    assert warnings == [
        f"trial {drawn.number}: the paper default has no complete trial in this study, so --max-drift (its yardstick) "
        "is not applied to it, nor to later trials until the paper default completes"
    ]
    study.enqueue_trial(*SearchSpace().reference_trial(PAPER_DEFAULT_PARAMS))
    reference = study.ask()
    SearchSpace().suggest(reference, "mean", "right")
    reference.set_user_attr(
        "structures", {"dev": {"psi": 0.2, "drift": 0.011}, "dev-crops": {"psi": 0.1, "drift": 0.009}}
    )
    study.tell(reference, 0.2)
    with_reference = objective()
    with_reference.await_reference(study.ask())
    assert with_reference.reference == {"dev": 0.011, "dev-crops": 0.009}


def test_a_structure_s_baseline_is_said_as_it_is_encoded(pruning_study, caplog: pytest.LogCaptureFixture) -> None:
    """The other structures' baselines are encoded before the first trial, which takes as long as a trial: a line
    says each as it starts and ends (there were only the batch-size lines)."""
    said = [r.getMessage() for r in caplog.get_records("setup")]
    start = "structure 1/1: encoding tiny-openings uncalibrated (8 passages)"
    assert f"{start} ..." in said and any(line.startswith(f"{start}: done in ") for line in said), said[:20]
    assert said.index(f"{start} ...") < next(i for i, line in enumerate(said) if line.startswith("trial 0"))


def test_mlflow_s_compare_view_ranks_no_pruned_trial_by_a_partial_figure_and_plots_lambda(pruning_study) -> None:
    """MLflow 3.17's compare view colours its parallel-coordinates plot by the first metric the compared runs share (in
    the order the first run logged them) and plots the first three parameters that differ, sorted by name. A pruned
    run shares no figure of fairness with a complete one, only its cost; λ is among the three axes."""
    settings, _ = pruning_study[:2]
    study = optuna.load_study(study_name="pruning", storage=settings.storage)
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and t.number > 0]
    assert pruned and complete
    client = MlflowClient(settings.tracking_uri)
    experiment = client.get_experiment_by_name("posfair")
    runs = [
        client.search_runs([experiment.experiment_id], f"tags.`posfair.trial` = '{t.number}'")[0]
        for t in (*complete, *pruned)
    ]
    for first in (runs[0], runs[-1]):  # whichever run the view lists first
        shared = [name for name in first.data.metrics if all(name in run.data.metrics for run in runs)]
        assert shared == ["cost/layer_tokens"], shared
    keys = sorted({key for run in runs for key in run.data.params})
    differ = [key for key in keys if len({run.data.params.get(key) for run in runs}) > 1]
    assert "lambda_strength" in differ[:3], differ
