"""benchmarks/search_cost.py: each arm is the `tune` run its name promises."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.search_cost import main, settings_for
from tuner.common.options import Budget


def test_each_arm_is_the_study_it_names(tmp_path: Path) -> None:
    args = type(
        "Args",
        (),
        {
            "model": "minilm",
            "dataset": "wikipos-dev",
            "heldout": "none",
            "trials": 16,
            "profile_docs": 8,
            "bootstrap": 10,
            "max_ndcg_drop": 0.0,
        },
    )()
    grid, tpe, robust, third = (
        settings_for(arm, 1, tmp_path, args) for arm in ("grid", "tpe", "robust", "robust-third")
    )
    assert grid.grid == "paper" and not grid.prune and grid.trials == 25 and grid.budget is None
    assert not tpe.structures and not tpe.prune and tpe.max_reversal is None and tpe.max_drift is None
    assert robust.structures and robust.prune and robust.budget is None and robust.trials == 16 and robust.seed == 1
    # the budget ends it, not --trials
    assert third.budget == Budget(grid_share=1 / 3) and third.trials == 16 and third.prune
    assert str(third.storage).endswith("optuna.db") and third.output == tmp_path / "winner.yaml"
    assert third.sampler == "cost-tpe"
    for arm, sampler in (("tpe-third", "tpe"), ("gp-third", "gp")):  # the same search and budget, another sampler
        other = settings_for(arm, 1, tmp_path, args)
        assert other.sampler == sampler and replace(other, sampler="cost-tpe") == third
    random_start = settings_for("random-start-third", 1, tmp_path, args)
    assert (
        third.paper_siblings and not random_start.paper_siblings and replace(random_start, paper_siblings=True) == third
    )


def test_an_unknown_arm_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--arms", "random"])
    assert stop.value.code == 2
    assert "invalid choice: 'random'" in capsys.readouterr().err


def study(strength: float, layer_tokens: int, grid: int | None) -> dict[str, object]:
    config = {"variant": "cls_soft", "strength": strength, "layers": "last:3", "basket_size": 128}
    held = {
        "psi_ratio": 0.5,
        "hm_delta": "+1.00 [+0.20, +1.80]",
        "ndcg_delta": "+0.10 [-0.30, +0.50]",
        "end_minus_begin": -3.0,
        "tilt": -0.1,
    }
    return {
        "arm": "robust-third",
        "seed": 0,
        "layer_tokens": layer_tokens,
        "setup_layer_tokens": 100,
        "grid_layer_tokens": grid,
        "trials": 6,
        "seconds": 5400.0,
        "pruned": 3,
        "winner": 5 if strength else 0,
        "config": config,
        "heldout": {"wikipos-test": held},
    }


def test_a_study_whose_baselines_the_cache_held_is_charged_them_as_priced_for_a_fresh_machine() -> None:
    from benchmarks.search_cost import table

    cached = study(0.5, 900, 3000) | {"setup_layer_tokens": 0, "setup_priced": 600}
    assert "| 1,500 (0.50×) |" in table([cached]).splitlines()[2]


def test_the_table_compares_a_study_with_the_grid_as_priced_when_the_grid_did_not_run() -> None:
    from benchmarks.search_cost import table

    rows = table([study(0.5, 900, 3000), study(0.0, 400, 3000)]).splitlines()[2:]
    assert "| 1,000 (0.33×) |" in rows[0] and "trial 5: cls_soft λ 0.50 Llast:3 B128" in rows[0]
    assert "| 3 | 1.5 h |" in rows[0]  # pruned, then the study's wall time on the machine that ran it
    assert "| 500 (0.17×) |" in rows[1] and "trial 0: no calibration" in rows[1]  # λ 0 is the uncalibrated reference
    held = table([study(0.5, 900, 3000)]).split("Held out, test:", 1)[1].splitlines()
    # a column each
    assert held[4] == "| robust-third | 0 | 0.50× | +1.00 [+0.20, +1.80] | +0.10 [-0.30, +0.50] | -3.0 |"
    assert "(" not in table([study(0.5, 900, None)]).splitlines()[2].split("|")[3]  # no grid known: no share


def summary_row(label: str, psi: float, begin: float, end: float, hm: list[float] | None) -> dict[str, object]:
    metrics = {"ndcg10": 0.6, "n_queries": 30, "ndcg10_begin": begin, "ndcg10_end": end, "n_begin": 15, "n_end": 15}
    metrics |= {"hm": 0.6, "psi": psi, "tilt": end - begin}
    intervals = {"hm": hm, "ndcg10": [0.01, 0.0, 0.02], "psi": [0.0, 0.0, 0.0]} if hm else None
    config = {"variant": "cls_soft", "strength": 0.5, "layers": [6, 7], "basket_size": 128, "pooling": "mean"}
    return {
        "label": label,
        "trial": 1,
        "config": config,
        "tuning": {},
        "heldout": {"wikipos-test": {"metrics": metrics, "intervals": intervals}},
    }


def test_the_held_out_rows_are_read_from_the_parent_runs_summary_in_the_kept_store(tmp_path: Path) -> None:
    import json

    import mlflow

    from benchmarks.search_cost import heldout_cells, table

    rows = [
        summary_row("No calibration", 0.2, 0.5, 0.6, None),
        summary_row("Paper default", 0.3, 0.4, 0.7, [-0.02, -0.03, -0.01]),
        summary_row("Winner (trial 4)", 0.1, 0.55, 0.6, [0.015, 0.005, 0.025]),
    ]
    (tmp_path / "summary.json").write_text(json.dumps(rows))
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("study", artifact_location=(tmp_path / "artifacts").as_uri())
    client.create_run(experiment, tags={"posfair.trial": "3"})  # a trial's run: no summary
    parent = client.create_run(experiment, tags={"posfair.outcome": "exported"})
    client.log_artifact(parent.info.run_id, str(tmp_path / "summary.json"))

    cells = heldout_cells(tmp_path)
    winner, default = cells["heldout"]["wikipos-test"], cells["paper_default"]["heldout"]["wikipos-test"]  # type: ignore[index]
    assert winner["psi_ratio"] == pytest.approx(0.5) and winner["end_minus_begin"] == pytest.approx(5.0)
    assert winner["hm_delta"] == "+1.50 [+0.50, +2.50]" and winner["ndcg_delta"] == "+1.00 [+0.00, +2.00]"
    assert default["psi_ratio"] == pytest.approx(1.5) and default["end_minus_begin"] == pytest.approx(30.0)
    assert cells["paper_default"]["config"] == {  # type: ignore[index]
        "variant": "cls_soft",
        "strength": 0.5,
        "layers": [6, 7],
        "basket_size": 128,
    }

    lines = table([study(0.0, 400, 3000) | cells]).splitlines()
    assert "| paper default | | | | | cls_soft λ 0.50 L[6, 7] B128 |" in lines
    assert lines[-1] == "| paper default | | 1.50× | -2.00 [-3.00, -1.00] | +1.00 [+0.00, +2.00] | +30.0 |"


def test_without_a_paper_default_row_the_table_has_none() -> None:
    from benchmarks.search_cost import table

    assert "paper default" not in table([study(0.5, 900, 3000) | {"paper_default": None}])


def held(psi: float, psi_se: float, hm: str, ndcg: str) -> dict[str, object]:
    return {
        "psi_ratio": psi / 0.2,
        "psi": psi,
        "psi_se": psi_se,
        "hm_delta": hm,
        "ndcg_delta": ndcg,
        "end_minus_begin": -3.0,
    }


def test_the_sampler_table_counts_the_seeds_as_good_as_the_grid_and_their_spread_in_standard_errors() -> None:
    from benchmarks.search_cost import sampler_table

    grid = study(0.5, 2000, 2000) | {
        "arm": "grid",
        "heldout": {"wikipos-test": held(0.10, 0.01, "+2.00 [+1.00, +3.00]", "+1.00 [+0.50, +1.50]")},
    }
    seeds = [
        # as good: ΔHM 1.5 ≥ 1.00, ΔnDCG 0.6 ≥ 0.50, PSI 0.115 ≤ 0.10 + 1.96 × 0.01
        held(0.115, 0.02, "+1.50 [+0.50, +2.50]", "+0.60 [+0.10, +1.10]"),
        held(0.09, 0.03, "+0.90 [+0.10, +1.70]", "+1.20 [+0.70, +1.70]"),  # ΔHM below the grid's interval
        held(0.125, 0.01, "+2.50 [+1.50, +3.50]", "+1.10 [+0.60, +1.60]"),  # PSI over 0.1196
    ]
    results = [
        study(0.5, 600, 2000) | {"seed": i, "paper_default_layer_tokens": 210, "heldout": {"wikipos-test": h}}
        for i, h in enumerate(seeds)
    ]
    table = sampler_table([*results, grid])
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("|")}
    assert rows["test: seeds at least as good as the grid's winner"].endswith("| 1 of 3 |")
    # spread 0.125 - 0.09 = 0.035, median SE 0.02: 1.75 SE
    assert rows["test: seeds' PSI spread ÷ its bootstrap SE"].endswith("| 1.8 |")
    # (600 + 100) / (2000 + 100) for each seed
    assert rows["layer-tokens on a fresh machine, × the grid's: mean (range)"].endswith("| 0.33× (0.33–0.33) |")
    # 100 and 210 of 2,100
    assert rows["of which the baselines and queries · the paper default's trial"].endswith("| 0.05× · 0.10× |")
    assert "tpe-third" not in table  # an arm that did not run has no column


def test_model_draws_count_the_trials_a_sampler_drew_past_its_start_up_and_ran() -> None:
    import optuna
    from optuna.trial import TrialState, create_trial

    from benchmarks.search_cost import model_draws
    from tuner.common.trials import NOT_RUN_ATTR

    study = optuna.create_study()
    queued = {"fixed_params": {"x": 0.5}}
    states = [
        (TrialState.COMPLETE, queued, {}),  # the references and the siblings: queued, part of the start-up
        (TrialState.COMPLETE, queued, {}),
        (TrialState.COMPLETE, queued, {}),
        (TrialState.PRUNED, {}, {}),  # a random draw, pruned: TPE counts it towards the start-up, GPSampler does not
        (TrialState.COMPLETE, {}, {}),  # the fifth: TPE's start-up is over
        (TrialState.COMPLETE, {}, {}),  # TPE's model; GPSampler's fifth complete trial, still random
        (TrialState.PRUNED, queued, {}),  # λ bisection's
        (TrialState.COMPLETE, {}, {}),  # both models
        (TrialState.FAIL, {}, {NOT_RUN_ATTR: "the budget is spent"}),  # drawn, never run: the budget was spent
    ]
    for state, system, user in states:
        value = 0.1 if state == TrialState.COMPLETE else None
        study.add_trial(create_trial(state=state, value=value, system_attrs=system, user_attrs=user))
    assert model_draws(study, "robust-third") == 2 and model_draws(study, "tpe-third") == 2
    assert model_draws(study, "gp-third") == 1
    assert model_draws(study, "grid") == 0


def test_the_studies_tables_read_at_a_laptop_s_width() -> None:
    """At 1,280 px a table of the docs holds about 150 characters a row before it scrolls sideways: the held-out
    figures of each set get a table of their own instead of four intervals packed into one cell per set."""
    from benchmarks.search_cost import table

    sets = {
        name: study(0.5, 900, 3000)["heldout"]["wikipos-test"]
        for name in ("wikipos-test", "wikipos-mixed", "wikipos-lengths")
    }
    text = table([study(0.5, 900, 3000) | {"heldout": sets}, study(0.0, 400, 3000) | {"heldout": sets}])
    assert max(len(line) for line in text.splitlines()) <= 150
    assert text.count("| arm | seed | PSI× | ΔHM | ΔnDCG@10 | end−begin |") == 3


def test_a_resumed_study_is_timed_from_its_first_trial_in_the_earlier_run() -> None:
    import datetime as dt

    import optuna

    from benchmarks.search_cost import study_seconds

    study = optuna.create_study()
    hour_ago = dt.datetime.now() - dt.timedelta(hours=1)  # the run that was stopped began its first trial then
    first = optuna.trial.create_trial(value=0.3)
    first.datetime_start = hour_ago
    study.add_trial(first)
    resumed = dt.datetime.now() - dt.timedelta(minutes=5)
    assert 3600 <= study_seconds(study, resumed) < 3660
    assert 300 <= study_seconds(optuna.create_study(), resumed) < 360  # a fresh study: this run's own time
