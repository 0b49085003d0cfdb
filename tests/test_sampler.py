"""The sampler: TPE, divided by cost(depth)^α under a budget, α the share of the budget not yet spent; a
depth that no longer fits the rest of the budget is not drawn while another one does."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from tests.test_study import write_dataset
from tests.tiny import save_tiny
from tuner.common.budget import BUDGET_ATTR
from tuner.common.options import SAMPLERS
from tuner.common.trials import SAMPLER_ATTR, START_ATTR, named_constraints
from tuner.tuning.run import TuneSettings, tune
from tuner.tuning.sampler import STARTUP_TRIALS, CostCooledTPESampler, cooling, make_sampler
from tuner.tuning.trial.record import set_constraints

COST = {"last": 100, "25%": 200, "50%": 300}  # MiniLM: a trial of each depth runs 1, 2 or 3 layers
UNSPENT = {"trials": 10**9, "depth_cost": COST}  # nothing is spent (no trial records layer-tokens): α stays 1


def objective(trial: optuna.Trial) -> float:
    """Depth does not matter here, so a sampler that prefers a depth does so for its cost alone."""
    strength = trial.suggest_float("strength", 0.0, 1.0, step=0.05)
    trial.suggest_categorical("depth", list(COST))
    trial.suggest_categorical("basket_size", [64, 128, 256])
    if trial.suggest_categorical("variant", ["uniform", "cls_soft", "cls_hard"]) == "cls_hard":
        trial.suggest_float("weight", 0.1, 0.5, step=0.05)
    return (strength - 0.4) ** 2


def draws(
    sampler: optuna.samplers.BaseSampler, budget: dict[str, object] | None, trials: int = 40, spend: int = 0
) -> list[dict[str, object]]:
    """The parameters of `trials` trials; each trial records `spend` layer-tokens."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=sampler)
    if budget is not None:
        study.set_user_attr(BUDGET_ATTR, budget)
    study.optimize(lambda trial: trial.set_user_attr("layer_tokens", spend) or objective(trial), n_trials=trials)
    return [t.params for t in study.trials]


def test_without_a_budget_it_is_posfairs_tpe_draw_for_draw() -> None:
    plain = optuna.samplers.TPESampler(seed=3, multivariate=True, group=True, n_startup_trials=5)
    assert draws(CostCooledTPESampler(seed=3), None) == draws(plain, None)


def test_under_an_unspent_budget_it_draws_cheap_depths_more_often() -> None:
    budget = UNSPENT
    plain = Counter(
        p["depth"]
        for p in draws(optuna.samplers.TPESampler(seed=3, multivariate=True, group=True, n_startup_trials=5), None)
    )
    cooled = Counter(p["depth"] for p in draws(CostCooledTPESampler(seed=3), budget))
    assert cooled["last"] > plain["last"] and cooled["50%"] < plain["50%"], (plain, cooled)


def test_the_random_start_up_draws_depths_by_inverse_cost_and_the_rest_as_tpe_would() -> None:
    budget = UNSPENT
    plain, cooled = Counter(), Counter()
    for seed in range(40):  # the five start-up draws of 40 studies
        ran = draws(CostCooledTPESampler(seed=seed), None, 5)
        weighed = draws(CostCooledTPESampler(seed=seed), budget, 5)
        assert [{k: v for k, v in p.items() if k != "depth"} for p in weighed] == [
            {k: v for k, v in p.items() if k != "depth"} for p in ran
        ]
        plain.update(p["depth"] for p in ran)
        cooled.update(p["depth"] for p in weighed)
    # of 200 draws, uniform: 67 each; by 1/cost: 6/11 last (109), 3/11 at 25% (55), 2/11 at 50% (36)
    assert cooled["last"] > 90 > plain["last"] and cooled["50%"] < 50 < plain["50%"], (plain, cooled)


@pytest.mark.parametrize(("spent", "alpha"), [(0, 1.0), (250, 0.75), (1000, 0.0), (1500, 0.0)])
def test_alpha_is_the_share_of_the_trial_budget_not_yet_spent(spent: int, alpha: float) -> None:
    study = optuna.create_study()
    study.set_user_attr(BUDGET_ATTR, {"trials": 1000})
    study.add_trial(optuna.trial.create_trial(value=0.1, user_attrs={"layer_tokens": spent}))
    assert cooling(study) == pytest.approx(alpha)
    study.set_user_attr(BUDGET_ATTR, None)
    assert cooling(study) == 0.0


def test_a_depth_that_no_longer_fits_the_rest_of_the_budget_is_not_drawn_while_another_fits() -> None:
    # 30 trials of 10 each spend 300 of 500: α falls to 0.4, and with 200 left a 50% trial (300) no longer fits
    budget = {"trials": 500, "depth_cost": COST}
    late = draws(CostCooledTPESampler(seed=0), budget, trials=40, spend=10)[30:]
    assert {p["depth"] for p in late} <= {"last", "25%"}
    assert any(
        p["depth"] == "50%" for p in draws(CostCooledTPESampler(seed=0), None, trials=40)[30:]
    )  # unbudgeted, it is drawn


def constrained(trial: optuna.Trial, limit: float | None) -> float:
    """λ 0.6 is the optimum; with a `limit`, only λ ≤ limit meets the constraint."""
    strength = trial.suggest_float("strength", 0.0, 1.0, step=0.05)
    trial.suggest_categorical("depth", list(COST))
    if limit is not None:
        set_constraints(trial, {"reversal": strength - limit})
    return (strength - 0.6) ** 2


@pytest.mark.parametrize("name", SAMPLERS)
def test_every_sampler_steers_towards_what_meets_the_constraints_the_objective_sets(name: str) -> None:
    """The objective stores its constraints as posfair's does and no sampler is given a `constraints_func`:
    each must still learn that the optimum it would chase is infeasible."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    limit = 0.325  # λ 0.3 is the best feasible value (a margin: λ 0.3 is drawn as 0.30000000000000004)
    feasible = {}
    for given in (limit, None):
        study = optuna.create_study(sampler=make_sampler(name, seed=0))
        study.optimize(lambda trial, given=given: constrained(trial, given), n_trials=30)
        feasible[given] = sum(t.params["strength"] <= limit for t in study.trials[STARTUP_TRIALS:])
        if given is not None:
            best = min((t for t in study.trials if t.params["strength"] <= limit), key=lambda t: t.value)
            assert best.params["strength"] == pytest.approx(0.3), name
    assert feasible[limit] >= feasible[None] + 5, (name, feasible)


def test_an_unknown_sampler_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="--sampler must be one of cost-tpe, tpe, gp, got 'random'"):
        TuneSettings(sampler="random")


@pytest.mark.parametrize("search", [{"grid": "paper"}, {"pareto": True}])
@pytest.mark.parametrize("name", ["tpe", "gp"])
def test_another_sampler_is_refused_for_a_grid_or_a_pareto_search(name: str, search: dict[str, object]) -> None:
    """A grid runs its fixed configs and a Pareto search draws with NSGA-II: neither would use the sampler asked for."""
    with pytest.raises(ValueError, match=f"--sampler {name} draws a single-objective search"):
        TuneSettings(sampler=name, **search)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", SAMPLERS)
def test_every_sampler_draws_the_same_five_start_up_trials_at_random(
    name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The samplers are compared on one footing: each draws its first five trials at random (Optuna's own default
    start-up is ten) and every later one from its model. The objective has no conditional parameter, so no
    sampler draws at random after its start-up for a parameter outside its model."""
    at_random: set[int] = set()
    draw = optuna.samplers.RandomSampler.sample_independent

    def seen(self, study, trial, param_name, distribution):  # type: ignore[no-untyped-def]
        at_random.add(trial.number)
        return draw(self, study, trial, param_name, distribution)

    monkeypatch.setattr(optuna.samplers.RandomSampler, "sample_independent", seen)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=make_sampler(name, seed=0))
    study.optimize(lambda trial: constrained(trial, None), n_trials=12)
    assert at_random == {0, 1, 2, 3, 4}, name


@pytest.mark.parametrize("name", ["tpe", "cost-tpe"])
def test_under_a_budget_only_the_cost_aware_sampler_weighs_the_cost(name: str) -> None:
    """Without a budget the two TPE samplers draw alike, so only a budget tells which one `--sampler` gave."""
    plain = draws(optuna.samplers.TPESampler(seed=3, multivariate=True, group=True, n_startup_trials=5), None)
    assert (draws(make_sampler(name, seed=3), UNSPENT) == plain) == (name == "tpe")


def tiny_study(folder: Path, layers: int, **changes: object) -> TuneSettings:
    """A study of a tiny random model with `layers` layers, every trial run to the end (no budget, pruning or
    bisection), so that whatever follows the queued start is the sampler's."""
    model = save_tiny("bert", folder / "tiny-bert", layers=layers, max_length=512)
    data = write_dataset(folder / "data", docs=8, words=45)
    settings: dict[str, object] = dict(
        model=str(model),
        pooling="cls",
        dataset=f"jsonl:{data}",
        heldout=None,
        budget=None,
        prune=False,
        bisect=False,
        storage=f"sqlite:///{folder / 'o.db'}",
        tracking_uri=f"sqlite:///{folder / 'm.db'}",
        output=folder / "best.yaml",
        bootstrap=50,
    )
    return TuneSettings(**(settings | changes))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["tpe", "gp"])
def test_tune_runs_and_exports_with_each_sampler(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    samplers: dict[str, optuna.samplers.BaseSampler] = {}  # study name → the sampler it was created with
    create = optuna.create_study

    def created(**options):  # type: ignore[no-untyped-def]
        samplers[options["study_name"]] = options["sampler"]
        return create(**options)

    monkeypatch.setattr(optuna, "create_study", created)
    settings = tiny_study(tmp_path, layers=3, trials=8, sampler=name)
    outcome = tune(settings)
    study = optuna.load_study(study_name=outcome.study, storage=settings.storage)
    assert study.user_attrs[SAMPLER_ATTR] == name
    assert type(samplers[outcome.study]) is {"tpe": optuna.samplers.TPESampler, "gp": optuna.samplers.GPSampler}[name]
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert named_constraints(complete[0])["drift"] == -settings.max_drift  # the baseline moved nothing
    assert {tuple(named_constraints(t)) for t in complete} == {
        ("drift", "hm_floor", "ndcg_drop", "reversal", "structure_ndcg")
    }
    assert (
        sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) >= STARTUP_TRIALS + 3
    )  # some drawn by its model
    assert study.trials[outcome.winner_trial].params["strength"] == pytest.approx(outcome.config.strength)
    assert (tmp_path / "best.yaml").exists()


def test_a_study_starts_with_the_references_then_the_paper_default_at_its_cheaper_depths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every seed spends its first draws alike: the baseline, the paper's default (CLS-Soft λ 0.5, baskets of 128,
    the last 50%), then the same config on the last layer and the last 25%, before the sampler draws anything."""
    monkeypatch.chdir(tmp_path)
    settings = tiny_study(tmp_path, layers=8, trials=5)
    for siblings in (True, False):
        chosen = replace(settings, paper_siblings=siblings, study_name=f"siblings-{siblings}")
        tune(chosen)
        trials = optuna.load_study(study_name=chosen.study_name, storage=chosen.storage).trials
        roles = [t.user_attrs.get("role") for t in trials]
        layers = [t.user_attrs["layers"] for t in trials]
        if siblings:
            assert roles[:4] == ["baseline", "paper default", "paper default, last layer", "paper default, last 25%"]
            assert layers[1:4] == [[4, 5, 6, 7], [7], [6, 7]]
            assert all(t.params["strength"] == 0.5 and t.params["variant"] == "cls_soft" for t in trials[1:4])
            assert [START_ATTR in t.user_attrs for t in trials[:5]] == [False, False, True, True, False]
        else:
            assert roles[:2] == ["baseline", "paper default"] and not any(START_ATTR in t.user_attrs for t in trials)
