"""The search space's `basket_shares` dimension, and the reference trials enqueued beside it.

The default space fixes the paper's `equal` without making it an Optuna parameter; a space with several values
suggests it. Either way the paper's default trial calibrates with the paper's `equal`, and the baseline
and paper-default trials keep the parameters they always had.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tuner.calibration import ConfigError
from tuner.tuning.heldout import trial_with
from tuner.tuning.search_space import (
    BASELINE_PARAMS,
    PAPER_DEFAULT_PARAMS,
    SearchSpace,
    trial_basket_shares,
    trial_config,
)
from tuner.tuning.study import enqueue_once

FOUR_KNOBS = {"strength", "depth", "basket_size", "variant"}


def run(space: SearchSpace, trials: int, references: tuple[dict, ...] = (BASELINE_PARAMS, PAPER_DEFAULT_PARAMS)):
    """A study of `trials` trials (references enqueued first, as `tune` does); each trial's config."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for reference in references:
        if space.admits(reference):
            enqueue_once(study, *space.reference_trial(reference))
    configs = []

    def objective(trial: optuna.Trial) -> float:
        config = space.suggest(trial, "mean", "right")
        configs.append(config)
        trial.set_user_attr("hm", 0.5)
        return config.strength

    study.optimize(objective, n_trials=trials)
    return study, configs


@pytest.mark.parametrize("shares", ["equal", "by_size"])
def test_a_single_value_is_fixed_without_a_parameter(shares: str) -> None:
    space = SearchSpace() if shares == "equal" else SearchSpace(basket_shares=(shares,))
    assert space.basket_shares == (shares,), "the default space fixes the paper's equal"
    study, configs = run(space, 6, references=())
    assert all(c.basket_shares == shares for c in configs)
    assert all(set(t.params) <= FOUR_KNOBS | {"weight"} for t in study.trials)  # parameter names unchanged
    assert all(trial_basket_shares(t) == shares for t in study.trials)  # recorded, so the config can be rebuilt


def test_several_values_are_a_categorical_parameter() -> None:
    study, configs = run(SearchSpace(basket_shares=("equal", "by_size")), 12, references=())
    assert [c.basket_shares for c in configs] == [t.params["basket_shares"] for t in study.trials]
    assert {c.basket_shares for c in configs} == {"equal", "by_size"}
    distribution = study.trials[0].distributions["basket_shares"]
    assert isinstance(distribution, optuna.distributions.CategoricalDistribution)
    assert set(distribution.choices) == {"equal", "by_size"}


@pytest.mark.parametrize("shares", [("by_size",), ("equal",), ("equal", "by_size"), ("by_size", "equal")])
def test_the_paper_default_calibrates_with_equal_and_keeps_its_parameters(shares: tuple[str, ...]) -> None:
    """The paper's default reproduces the paper whatever the space; baseline and paper default carry the
    same four parameters as ever (plus basket_shares only where the space suggests it for every trial)."""
    space = SearchSpace(basket_shares=shares)
    study, configs = run(space, 4)
    baseline, paper = study.trials[0], study.trials[1]
    suggested = {"basket_shares"} if len(shares) > 1 else set()
    assert set(baseline.params) == set(paper.params) == FOUR_KNOBS | suggested
    assert {k: paper.params[k] for k in FOUR_KNOBS} == {k: PAPER_DEFAULT_PARAMS[k] for k in FOUR_KNOBS}
    assert {k: baseline.params[k] for k in FOUR_KNOBS} == BASELINE_PARAMS
    assert configs[1].basket_shares == "equal" and trial_basket_shares(paper) == "equal"
    assert configs[1].strength == 0.5 and configs[1].layers == 0.5 and configs[1].basket_size == 128
    assert configs[0].strength == 0.0
    if len(shares) == 1:  # drawn trials: the space's own value
        assert [c.basket_shares for c in configs[2:]] == [shares[0]] * 2
    assert trial_with(study, PAPER_DEFAULT_PARAMS).number == 1
    assert trial_with(study, BASELINE_PARAMS).number == 0


def test_a_drawn_trial_with_the_paper_default_knobs_is_not_the_paper_default() -> None:
    """In a by_size space a TPE trial may draw λ 0.5, 50%, B 128, CLS-Soft: it calibrates with by_size,
    so it is neither found as the paper default nor keeps the paper default from being enqueued."""
    space = SearchSpace(basket_shares=("by_size",))
    study = optuna.create_study()
    study.enqueue_trial({k: v for k, v in PAPER_DEFAULT_PARAMS.items() if k != "basket_shares"})  # no pin
    trial = study.ask()
    assert space.suggest(trial, "cls", "right").basket_shares == "by_size"
    trial.set_user_attr("hm", 0.5)
    study.tell(trial, 0.1)
    assert trial_with(study, PAPER_DEFAULT_PARAMS) is None
    enqueue_once(study, *space.reference_trial(PAPER_DEFAULT_PARAMS))
    assert space.suggest(study.ask(), "cls", "right").basket_shares == "equal"


def test_enqueueing_the_references_twice_queues_them_once() -> None:
    """A resumed study finds its reference trials by parameters and pinned basket_shares."""
    space = SearchSpace()
    study, _ = run(space, 3)
    for reference in (BASELINE_PARAMS, PAPER_DEFAULT_PARAMS):
        enqueue_once(study, *space.reference_trial(reference))
    assert not study.get_trials(states=(optuna.trial.TrialState.WAITING,))


def test_trials_from_before_the_option_calibrated_with_equal() -> None:
    study = optuna.create_study()
    study.enqueue_trial({k: v for k, v in PAPER_DEFAULT_PARAMS.items() if k != "basket_shares"})
    trial = study.ask()
    for name in FOUR_KNOBS:  # as an older posfair suggested them: no basket_shares anywhere
        trial.suggest_categorical(name, [PAPER_DEFAULT_PARAMS[name]])
    trial.set_user_attr("hm", 0.5)
    study.tell(trial, 0.1)
    assert trial_basket_shares(study.trials[0]) == "equal"
    assert trial_with(study, PAPER_DEFAULT_PARAMS).number == 0


def test_from_yaml_reads_basket_shares(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text("basket_shares: [equal, by_size]\nbasket_sizes: [64, 128]\n", encoding="utf-8")
    space = SearchSpace.from_yaml(path)
    assert space.basket_shares == ("equal", "by_size") and space.basket_sizes == (64, 128)
    assert space.as_dict()["basket_shares"] == ["equal", "by_size"]


@pytest.mark.parametrize("shares", [(), ("by_chance",), ("equal", "equal")])
def test_bad_basket_shares_are_refused(shares: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError, match="basket_shares must be"):
        SearchSpace(basket_shares=shares)


def test_a_finished_trial_gives_back_the_config_it_drew() -> None:
    """`trial_config` (export, summary) and `suggest` (the running trial) read a trial's parameters alike: λ and w
    on the space's grid to 6 decimals, w only for CLS-Hard, the depth as the layers the trial resolved."""
    space = SearchSpace(variants=("cls_hard", "uniform"), basket_shares=("equal", "by_size"))
    study, configs = run(space, 12, references=())
    for trial, drawn in zip(study.trials, configs):
        layers = list(drawn.resolve_layers(6))
        trial.set_user_attr("layers", layers)
        back = trial_config(trial, "mean", "right")
        assert back == drawn.model_copy(update={"layers": layers})
        assert back.strength == round(trial.params["strength"], 6) and back.strength in {
            round(0.05 * i, 6) for i in range(21)
        }
        assert (back.variant == "cls_hard") == ("weight" in trial.params)
    assert {c.variant for c in configs} == {"cls_hard", "uniform"} and {c.basket_shares for c in configs} == {
        "equal",
        "by_size",
    }


@pytest.mark.parametrize("num_layers", [6, 12, 24])
def test_the_default_space_calibrates_at_most_the_last_half_of_the_layers(num_layers: int) -> None:
    """The paper's grid calibrates the last layer or the last 50% (§4); the default space stays in that range
    (deeper configs transferred worst, README "What wins") and still reaches both of the paper's layer sets."""
    configs = run(SearchSpace(), 40)[1]
    calibrated = [c.resolve_layers(num_layers) for c in configs]
    assert all(layers[-1] == num_layers - 1 for layers in calibrated), "calibrated layers always end at the last"
    assert max(len(layers) for layers in calibrated) == num_layers // 2
    assert min(len(layers) for layers in calibrated) == 1
    wider = [c.resolve_layers(num_layers) for c in run(SearchSpace(depths=("75%", "100%")), 4, references=())[1]]
    assert all(len(layers) > num_layers // 2 for layers in wider), "the deeper depths stay available"
