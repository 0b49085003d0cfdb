"""The search's sampler: TPE that, under a `--budget`, weighs a candidate by what it would cost.

A trial's cost is set by its depth: the prefix cache resumes each pass at the first calibrated layer, so a
config on the last 50% of MiniLM's layers costs three last-layer ones. Under a budget in layer-tokens, plain
TPE spends as much on a deep config as on three shallow ones that could tell it as much. Cost-aware Bayesian
optimisation divides the acquisition by the cost (expected improvement per unit cost, Snoek et al. 2012);
dividing by cost^α with α falling from 1 to 0 as the budget is spent ("cost cooling", Lee et al. 2020,
CArBO) explores cheaply first without shutting the dear region out at the end. TPE's acquisition is the
log-density ratio log l(x) − log g(x), so the division is a subtraction of α · log cost(x). TPE's random
start-up draws the depth with probability ∝ cost^−α in the same spirit (the other parameters are drawn as
plain TPE draws them). A depth whose trial no longer fits the rest of the budget is not drawn while another
one fits: the study ends at the first trial the budget has no room for (`TrialPricing.reserve`).

`--sampler` also offers what the cost-aware TPE is measured against (`benchmarks/search_cost.py`): the same
TPE without the cost, and Optuna's `GPSampler` (a Gaussian process with constrained log-EI). All three read
the constraints the objective stores (`tuner.tuning.trial.record.set_constraints`), fit their model after the
same five start-up trials and run within the same budget.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.exceptions import ExperimentalWarning
from optuna.trial import FrozenTrial, TrialState

from tuner.common.budget import StudyBudget, study_budget
from tuner.common.options import SAMPLERS
from tuner.common.trials import trials_spent
from tuner.tuning.optuna_access import ParzenEstimator, tpe_startup_trials

STARTUP_TRIALS = 5  # trials before a model of the study is fitted: the queued start, then random draws
TPE_OPTIONS: dict[str, Any] = {"multivariate": True, "group": True, "n_startup_trials": STARTUP_TRIALS}


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    """The single-objective sampler `name` (one of `SAMPLERS`), seeded."""
    if name == "cost-tpe":
        return CostCooledTPESampler(seed=seed)
    if name == "tpe":
        return grouped_tpe(seed)
    if name == "gp":
        with warnings.catch_warnings():  # GPSampler is "experimental" in Optuna 5
            warnings.simplefilter("ignore", ExperimentalWarning)
            # the objective is deterministic: a config scored twice on the same passages scores the same;
            # conditional parameters (CLS-Hard's weight) are drawn at random, as GPSampler does outside its space
            return optuna.samplers.GPSampler(
                seed=seed,
                n_startup_trials=STARTUP_TRIALS,
                deterministic_objective=True,
                warn_independent_sampling=False,
            )
    raise ValueError(f"--sampler {name!r}: choose one of {', '.join(SAMPLERS)}")


def grouped_tpe(seed: int | None) -> optuna.samplers.TPESampler:
    """Multivariate, grouped TPE, as posfair runs it: the cost-aware sampler's draws without a budget."""
    with warnings.catch_warnings():  # multivariate/group TPE is "experimental" but long stable
        warnings.simplefilter("ignore", ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, **TPE_OPTIONS)


class CostCooledTPESampler(optuna.samplers.TPESampler):
    """Multivariate, grouped TPE (as posfair always ran it) whose acquisition is divided by cost(depth)^α,
    α = the share of the study's trial budget still unspent. The costs are the study's: what an unpruned
    trial of each depth spends, recorded with the budget (`StudyBudget.depth_costs`), so every
    worker weighs alike. Without a budget it is TPE, draw for draw."""

    def __init__(self, *, seed: int | None) -> None:
        with warnings.catch_warnings():  # multivariate/group TPE is "experimental" but long stable
            warnings.simplefilter("ignore", ExperimentalWarning)
            super().__init__(seed=seed, **TPE_OPTIONS)
        self.seed = seed
        self._penalty: np.ndarray | None = None  # per depth choice, for the search space being sampled

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        drawn = super().sample_independent(study, trial, param_name, param_distribution)  # the RNG moves as TPE's would
        if param_name != "depth" or not isinstance(param_distribution, CategoricalDistribution):
            return drawn
        if len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))) >= tpe_startup_trials(
            self
        ):
            return drawn  # past the start-up, TPE's own draw (the acquisition weighed the cost)
        penalty = cost_penalty(study, param_distribution)
        if penalty is None:
            return drawn
        weights = np.exp(-penalty)
        rng = np.random.default_rng([self.seed or 0, trial.number])  # reproducible, whatever else was drawn
        return param_distribution.choices[int(rng.choice(len(weights), p=weights / weights.sum()))]

    def _sample(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        depth = search_space.get("depth")
        self._penalty = cost_penalty(study, depth) if isinstance(depth, CategoricalDistribution) else None
        return super()._sample(study, trial, search_space)

    def _compute_acquisition_func(
        self, samples: dict[str, np.ndarray], mpe_below: ParzenEstimator, mpe_above: ParzenEstimator
    ) -> np.ndarray:
        values = super()._compute_acquisition_func(samples, mpe_below, mpe_above)
        if self._penalty is None or "depth" not in samples:
            return values
        return values - self._penalty[samples["depth"].astype(int)]


def cost_penalty(study: optuna.Study, depth: CategoricalDistribution) -> np.ndarray | None:
    """What the acquisition loses per depth choice under the study's budget: α · log(cost / the cheapest cost),
    and everything (inf) where a trial of that depth no longer fits the rest of the budget while another
    does; None without a budget or once it is spent."""
    budget, left = unspent(study)
    alpha = cooling(study, left)
    if not budget or alpha == 0:
        return None
    known = budget.depth_costs or {}
    costs = np.array([float(known.get(str(choice), 1.0)) for choice in depth.choices])
    penalty = alpha * np.log(costs / costs.min())
    fits = costs <= left
    return np.where(fits, penalty, np.inf) if fits.any() else penalty


def unspent(study: optuna.Study) -> tuple[StudyBudget | None, int]:
    """The study's budget record and the layer-tokens its trials have left (0 without a budget)."""
    budget = study_budget(study)
    return (budget, budget.trial_allowance - trials_spent(study)) if budget else (None, 0)


def cooling(study: optuna.Study, left: int | None = None) -> float:
    """α: the share of the study's trial budget not yet spent (or reserved by running trials); 0 without a budget.
    `left`: what `unspent` says is left, when the caller has read it already."""
    budget = study_budget(study)
    if not budget:
        return 0.0
    left = unspent(study)[1] if left is None else left
    return float(max(0.0, left / max(budget.trial_allowance, 1)))
