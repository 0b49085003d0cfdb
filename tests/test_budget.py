"""`--budget`: a study that stops at a number of layer-tokens, the unit its cost is counted in, instead of a
number of trials; `grid/3` is a third of what the paper's grid study costs on the same model and data."""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path

import mlflow
import optuna
import pytest

from tests.test_study import write_dataset
from tests.tiny import save_tiny
from tuner.common.budget import BUDGET_ATTR, BUDGET_END_ATTR
from tuner.common.options import Budget
from tuner.common.trials import NOT_RUN_ATTR, RESERVED_ATTR, counted, never_ran, trials_spent
from tuner.tuning.accounts import budget_metrics, budget_tags, setup_layer_tokens, study_layer_tokens
from tuner.tuning.run import TuneSettings, tune

PRUNED, COMPLETE = optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.COMPLETE


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("grid/3", Budget(grid_share=1 / 3)),
        ("GRID / 2", Budget(grid_share=0.5)),
        ("grid", Budget(grid_share=1.0)),
        ("5M", Budget(layer_tokens=5_000_000)),
        ("2.5e6", Budget(layer_tokens=2_500_000)),
        ("800k", Budget(layer_tokens=800_000)),
        ("none", None),
    ],
)
def test_a_budget_is_layer_tokens_or_a_share_of_the_paper_grid(text: str, expected: Budget | None) -> None:
    assert Budget.parse(text) == expected


@pytest.mark.parametrize("text", ["grid/0", "grid/x", "gridx", "-5M", "5T", "0", "nan", "1e400", "lots"])
def test_a_budget_that_is_no_amount_is_refused_with_the_forms_it_takes(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"--budget {text!r}") + ".*grid/3.*5M.*none"):
        Budget.parse(text)


def test_plain_tune_spends_a_third_of_the_grid_and_the_grid_all_of_its_configs() -> None:
    assert TuneSettings().budget == Budget(grid_share=1 / 3)
    assert TuneSettings(grid="paper", budget=Budget(grid_share=0.5)).budget is None


@pytest.fixture(scope="module")
def budgeted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A study of at most 40 trials within a third of the grid's layer-tokens: the budget, not --trials, ends it."""
    root = tmp_path_factory.mktemp("budget")
    model = save_tiny("bert", root / "tiny-bert", max_length=512)
    data = write_dataset(root / "data", docs=6, words=95)  # content past 256 tokens: every basket of the grid fills
    settings = TuneSettings(
        model=str(model),
        # MiniLM's: what each depth and grid config is priced with must calibrate the model's own pooling
        pooling="mean",
        dataset=f"jsonl:{data}",
        heldout=None,
        trials=40,
        budget=Budget.parse("grid/3"),
        hm_floor="-90%",
        max_ndcg_drop=None,
        max_reversal=None,
        storage=f"sqlite:///{root / 'o.db'}",
        tracking_uri=f"sqlite:///{root / 'm.db'}",
        output=root / "best.yaml",
        study_name="budgeted",
        profile_docs=1,
        bootstrap=10,
    )
    logger = logging.getLogger("tuner")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir((root / "budgeted").mkdir() or root / "budgeted")  # a disk cache of its own: a fresh machine
            tune(settings)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
    study = optuna.load_study(study_name="budgeted", storage=settings.storage)
    grid = replace(settings, budget=None, grid="paper", study_name="grid", output=root / "grid.yaml")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir((root / "grid").mkdir() or root / "grid")
        tune(grid)  # what "grid" stands for: the paper grid's study on the same model and data, as it runs
    spent = study_layer_tokens(optuna.load_study(study_name="grid", storage=settings.storage))
    return {"settings": settings, "study": study, "log": "\n".join(lines), "grid": spent, "root": root}


def test_a_budgeted_study_ends_at_the_first_draw_it_has_no_room_for_and_exports(budgeted: dict[str, object]) -> None:
    study, settings = budgeted["study"], budgeted["settings"]
    assert isinstance(study, optuna.Study) and isinstance(settings, TuneSettings)
    budget, end = study.user_attrs[BUDGET_ATTR], study.user_attrs[BUDGET_END_ATTR]
    assert budget["spec"] == "1/3 of the paper grid's layer-tokens"
    assert abs(budget["grid"] - budgeted["grid"]) <= 0.005 * budgeted["grid"]  # the grid study, priced and run
    assert budget["study"] == int(budget["grid"] / 3) or abs(budget["study"] - budget["grid"] / 3) <= 1
    assert budget["trials"] == budget["study"] - budget["setup"]
    # what the trials spent, from each trial's own count of the passes it ran
    spent = sum(t.user_attrs.get("layer_tokens", 0) for t in study.trials)
    ran = [t for t in study.trials if counted(t)]
    assert 2 < len(ran) < settings.trials  # the budget ended it, after the two references
    assert spent <= budget["trials"]
    assert end["spent"] == spent and spent + end["needed"] > budget["trials"]  # the last draw did not fit
    refused = study.trials[end["trial"]]
    assert refused.state == optuna.trial.TrialState.FAIL and never_ran(refused) and not counted(refused)  # never PRUNED
    assert refused.user_attrs["feasible"].startswith("NO: not run, the budget is spent: "), "not 'the trial is running'"
    assert refused.number == max(t.number for t in study.trials)  # nothing started after it
    # the whole study as a fresh machine spends it: its own baselines (no disk cache) and its trials
    assert setup_layer_tokens(study) + spent <= budget["study"] * 1.02  # the setup estimate is within 2% of what ran
    assert Path(settings.output).is_file()  # type: ignore[arg-type]  # a budget's end is the study's end: exported
    assert (
        f"the budget is spent: trial {end['trial']} would need up to {end['needed']:,} layer-tokens and "
        f"{budget['trials'] - spent:,} of the trials' {budget['trials']:,} are left; no more trials start"
    ) in budgeted["log"]  # type: ignore[operator]


def test_the_console_mlflow_optuna_dashboard_and_the_readme_count_the_same_trials(budgeted: dict[str, object]) -> None:
    """The draw the budget had no room for never ran: it is no pruned trial anywhere. Optuna records it FAIL with why
    (its only finished state that claims no result), MLflow has no run of it, and the console's progress, its closing
    count, the parent run, optuna-dashboard and the README's sentence (rendered from the record `benchmarks.first_tune`
    keeps of a study) all count the trials Optuna ran."""
    from benchmarks.figures.first_tune import trials as trials_sentence
    from benchmarks.first_tune import study_facts
    from tests.services import dashboard_api

    study, settings, log = budgeted["study"], budgeted["settings"], budgeted["log"]
    assert isinstance(study, optuna.Study) and isinstance(settings, TuneSettings) and isinstance(log, str)
    end = study.user_attrs[BUDGET_END_ATTR]["trial"]
    complete = [t.number for t in study.trials if t.state == COMPLETE and "duplicate_of" not in t.user_attrs]
    pruned = [t.number for t in study.trials if t.state == PRUNED]
    unrun = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert [t.number for t in unrun] == [end] and unrun[0].user_attrs[NOT_RUN_ATTR].startswith("the budget is spent: ")
    ran = len(complete) + len(pruned)
    said = f"{ran} trials ran ({len(complete)} complete, {len(pruned)} pruned between rungs)"
    # the console: the last progress line, and the closing count
    progress = re.findall(r"after trial \d+: (\d+) of 40 trials done", log)
    assert progress and int(progress[-1]) == ran
    assert f"trials: {said}; trial {end} was drawn but not run: " in log, log[-2000:]
    # MLflow: one run per trial that ran, the pruned ones PRUNED; the parent run counts them alike
    mlflow.set_tracking_uri(settings.tracking_uri)
    parent = mlflow.search_runs(
        experiment_names=["posfair"], filter_string="tags.mlflow.runName = 'budgeted'", output_format="list"
    )[0]
    runs = mlflow.search_runs(
        experiment_names=["posfair"],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
        output_format="list",
    )
    states = [r.data.tags["posfair.state"] for r in runs if "posfair.duplicate_of" not in r.data.tags]
    assert (states.count("COMPLETE"), states.count("PRUNED"), len(states)) == (len(complete), len(pruned), ran)
    assert end not in {int(r.data.tags["posfair.trial"]) for r in runs}
    metrics = parent.data.metrics
    assert (metrics["trials/ran"], metrics["trials/pruned"], metrics["trials/not_run"]) == (ran, len(pruned), 1)
    assert parent.data.tags["posfair.trials"].startswith(said)
    # optuna-dashboard: as many Pruned as ran pruned, the unrun one Fail with a note saying it never ran
    detail = dashboard_api(settings.storage, f"/api/studies/{study._study_id}")
    shown = {t["number"]: t for t in detail["trials"]}
    assert sorted(n for n, t in shown.items() if t["state"] == "Pruned") == pruned
    assert shown[end]["state"] == "Fail" and shown[end]["note"]["body"].startswith("## Not run")
    assert said in detail["note"]["body"]
    # the README's sentence, from the record of this study
    sentence = trials_sentence({"results": {"study": study_facts(settings.storage, "budgeted")}})
    assert sentence.startswith(
        f"The default study ran {ran} trials ({len(complete)} complete, {len(pruned)} pruned between rungs)"
    )
    assert f"trial {end} would have needed" in sentence and sentence.endswith("so it was not run.")


def test_a_complete_trial_spends_exactly_what_it_reserved(budgeted: dict[str, object]) -> None:
    """The reservation is computed from the corpora's batches before the trial; the spend is counted by the
    encoder as it runs: they agree for a trial that is not pruned, and a pruned one spends less."""
    study = budgeted["study"]
    assert isinstance(study, optuna.Study)
    calibrated = [t for t in study.trials if RESERVED_ATTR in t.user_attrs]
    assert calibrated, "every calibrated trial but the paper default reserves its cost"
    depth_cost = study.user_attrs[BUDGET_ATTR]["depth_cost"]  # what the sampler weighs each depth by
    for trial in calibrated:
        assert trial.user_attrs[RESERVED_ATTR] <= depth_cost[trial.params["depth"]], trial.number  # at most its depth's
        if trial.state == COMPLETE:
            assert trial.user_attrs["layer_tokens"] == trial.user_attrs[RESERVED_ATTR], trial.number
        else:
            assert trial.user_attrs["layer_tokens"] <= trial.user_attrs[RESERVED_ATTR], trial.number


def test_the_budget_is_said_before_the_study_and_on_its_parent_run(budgeted: dict[str, object]) -> None:
    study, log = budgeted["study"], budgeted["log"]
    assert isinstance(study, optuna.Study) and isinstance(log, str)
    budget = study.user_attrs[BUDGET_ATTR]
    said = re.search(
        r"budget: 1/3 of the paper grid's layer-tokens, ([\d,]+) layer-tokens for the study \(the paper grid's study "
        r"here: ([\d,]+),",
        log,
    )
    assert said, log[-3000:]
    assert int(said[1].replace(",", "")) == budget["study"] and int(said[2].replace(",", "")) == budget["grid"]
    # what the trials may spend, and how many unpruned trials that buys at the dearest and the cheapest depth
    costs = budget["depth_cost"].values()
    bought = (
        f"its trials may spend {budget['trials']:,}: {budget['trials'] / max(costs):.1f} to "
        f"{budget['trials'] / min(costs):.1f} unpruned trials by depth"
    )
    assert bought in log, log[-3000:]
    mlflow.set_tracking_uri(budgeted["settings"].tracking_uri)  # type: ignore[union-attr]
    parent = mlflow.search_runs(
        experiment_names=["posfair"], filter_string="tags.mlflow.runName = 'budgeted'", output_format="list"
    )[0]
    assert parent.data.params["budget"] == "1/3 of the paper grid's layer-tokens"
    assert parent.data.metrics["cost/budget_layer_tokens"] == budget["study"]
    assert parent.data.metrics["cost/layer_tokens"] <= budget["study"] * 1.02  # the baselines: estimated within 2%
    end = study.user_attrs[BUDGET_END_ATTR]
    assert parent.data.tags["posfair.budget"] == (
        f"1/3 of the paper grid's layer-tokens ended the study: trial {end['trial']} would have needed up to "
        f"{end['needed']:,} layer-tokens, and {budget['trials'] - end['spent']:,} of the trials' {budget['trials']:,} "
        "were left"
    )
    # the refused draw opened no MLflow run: one run per trial that started
    runs = mlflow.search_runs(
        experiment_names=["posfair"], filter_string="tags.mlflow.parentRunId = '" + parent.info.run_id + "'"
    )
    started = [t for t in study.trials if not never_ran(t)]
    assert len(runs) == len(started)


def test_a_resumed_study_keeps_its_budget_and_a_larger_one_goes_on(
    budgeted: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    study, settings = budgeted["study"], budgeted["settings"]
    assert isinstance(study, optuna.Study) and isinstance(settings, TuneSettings)
    before = len(study.trials)
    monkeypatch.chdir(budgeted["root"] / "budgeted")  # type: ignore[operator]
    tune(settings)  # the same command: the budget is spent, nothing runs
    assert len(optuna.load_study(study_name="budgeted", storage=settings.storage).trials) == before
    tune(replace(settings, budget=Budget.parse("grid/2")))
    again = optuna.load_study(study_name="budgeted", storage=settings.storage)
    assert len(again.trials) > before
    assert sum(t.user_attrs.get("layer_tokens", 0) for t in again.trials) <= again.user_attrs[BUDGET_ATTR]["trials"]


def test_a_budget_below_the_baselines_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    model = save_tiny("bert", tmp_path / "tiny-bert", max_length=512)
    data = write_dataset(tmp_path / "data", docs=6, words=95)
    settings = TuneSettings(
        model=str(model),
        pooling="cls",
        dataset=f"jsonl:{data}",
        heldout=None,
        budget=Budget.parse("1000"),
        storage=f"sqlite:///{tmp_path / 'o.db'}",
        tracking_uri=f"sqlite:///{tmp_path / 'm.db'}",
        output=tmp_path / "best.yaml",
    )
    with pytest.raises(
        Exception, match=r"--budget 1,000 layer-tokens is ≈ 1,000 layer-tokens here, which does not cover the baselines"
    ):
        tune(settings)
    assert not (tmp_path / "o.db").exists() and not (tmp_path / "best.yaml").exists()


def test_the_budget_counts_a_finished_trials_spend_and_a_running_or_failed_ones_reservation() -> None:
    study = optuna.create_study()
    spent = {"layer_tokens": 100, RESERVED_ATTR: 400}  # pruned early: its own count, not what it reserved
    study.add_trial(optuna.trial.create_trial(state=PRUNED, user_attrs=spent))
    study.add_trial(optuna.trial.create_trial(value=0.1, user_attrs={"layer_tokens": 300, RESERVED_ATTR: 300}))
    study.add_trial(
        optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={RESERVED_ATTR: 50})
    )  # spend unknown
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, user_attrs={RESERVED_ATTR: 7}))
    assert trials_spent(study) == 100 + 300 + 50 + 7
    assert trials_spent(study, excluding=3) == 450


def test_a_budget_that_trials_ended_first_says_so_on_the_parent_run() -> None:
    study = optuna.create_study()
    study.set_user_attr(BUDGET_ATTR, {"spec": "5,000,000 layer-tokens", "study": 5_000_000, "trials": 3_000_000})
    assert budget_tags(study) == {"posfair.budget": "5,000,000 layer-tokens: --trials ended the study first"}
    assert budget_metrics(study) == {"cost/budget_layer_tokens": 5_000_000.0}
    study.set_user_attr(BUDGET_END_ATTR, {"trial": 7, "trials": 3_000_000, "spent": 2_900_000, "needed": 400_000})
    assert budget_tags(study)["posfair.budget"] == (
        "5,000,000 layer-tokens ended the study: trial 7 would have needed up to 400,000 layer-tokens, "
        "and 100,000 of the trials' 3,000,000 were left"
    )
    study.set_user_attr(BUDGET_ATTR, None)  # a resume with --budget none
    assert budget_tags(study) == {} and budget_metrics(study) == {}


def test_a_stored_budget_loads_into_its_record_and_is_stored_again_key_for_key() -> None:
    """Studies store the budget as JSON under the keys posfair has always written: the record reads them, a worker
    waits until `depth_cost` is there (priced), and writing the record back changes nothing a stored study holds."""
    from tuner.common.budget import BudgetEnd, StudyBudget, budget_end, store_study_budget, study_budget

    estimated = {
        "spec": "1/3 of the paper grid's layer-tokens",
        "study": 900,
        "grid": 2700,
        "setup": 300,
        "trials": 600,
    }
    priced = {**estimated, "depth_cost": {"last": 40, "half": 90}}
    study = optuna.create_study()
    assert study_budget(study) is None
    for stored in (estimated, priced):
        study.set_user_attr(BUDGET_ATTR, stored)
        budget = study_budget(study)
        assert budget is not None and budget.to_attr() == stored
        assert (budget.study_allowance, budget.grid_cost, budget.setup_cost, budget.trial_allowance) == (
            900,
            2700,
            300,
            600,
        )
        assert budget.priced == ("depth_cost" in stored)
    store_study_budget(study, StudyBudget.from_attr(priced))
    assert study.user_attrs[BUDGET_ATTR] == priced
    store_study_budget(study, None)  # a resume with --budget none
    assert study.user_attrs[BUDGET_ATTR] is None and study_budget(study) is None
    end = {"trial": 7, "trials": 600, "spent": 580, "needed": 40}
    study.set_user_attr(BUDGET_END_ATTR, end)
    assert budget_end(study) == BudgetEnd(7, 600, 580, 40) and BudgetEnd(7, 600, 580, 40).to_attr() == end
