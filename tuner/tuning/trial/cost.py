"""What a trial costs in layer-tokens, and whether the study's trial allowance has room for it.

A trial's cost is what it spends when no rung prunes it (`TrialPricing.trial_cost`); the coordinator prices the
paper grid and each depth with it (`tuner.common.budget.StudyBudget`), and every trial reserves its cost before
it starts (`TrialPricing.reserve`), so every trial that starts can finish within the allowance.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import optuna

from tuner.calibration import CalibrationConfig
from tuner.common.budget import BudgetEnd, store_budget_end
from tuner.common.trials import NOT_RUN_ATTR, RESERVED_ATTR, NotRun, calibration_key, trials_spent
from tuner.engine.models import LoadedModel
from tuner.evaluation.evaluator import Evaluator
from tuner.tuning.search_space import SearchSpace, config_of, grid_points
from tuner.tuning.trial.profile import TrialProfile

log = logging.getLogger(__name__)


class TrialPricing:
    """Prices trials on the corpora they encode (`encoded`: the tuning evaluator and every side set's that encodes
    its own corpus) and the attention `profile`; `allowance` is what the study's trials may spend (None: no budget)."""

    def __init__(self, encoded: Sequence[Evaluator], space: SearchSpace, profile: TrialProfile) -> None:
        self.encoded = list(encoded)
        self.space = space
        self.profile = profile
        self.allowance: int | None = None  # set once the budget is priced (`--budget`, less the baselines)

    @property
    def model(self) -> LoadedModel:
        return self.encoded[0].model

    def trial_cost(self, config: CalibrationConfig) -> int:
        """What a trial of `config` spends if no rung prunes it: each corpus it encodes (the screen, the tuning
        passages, the other structures, a general set), those of its batches the config can change, from where
        its pass resumes (`Evaluator.pass_cost`), and the attention profile through every layer. A complete
        trial spends exactly that, a pruned one less."""
        return sum(evaluator.pass_cost(config) for evaluator in self.encoded) + self.profile.cost()

    def depth_costs(self) -> dict[str, int]:
        """What an unpruned trial of each of the space's depths spends at most (with its smallest basket, which
        leaves the fewest batches to copy from the baseline): what the sampler weighs depths by."""
        spec, basket = self.model.spec, min(self.space.basket_sizes)
        knobs = {"strength": 1.0, "basket_size": basket, "variant": "cls_soft"}
        return {
            depth: self.trial_cost(config_of({**knobs, "depth": depth}, "equal", spec.pooling, spec.padding_side))
            for depth in self.space.depths
        }

    def grid_cost(self, grid: Mapping[str, Sequence[object]]) -> int:
        """What the grid's study spends on its trials here: each distinct config of the grid unpruned (the paper
        default among them) and the baseline trial's profile, as `tune --grid paper` runs them."""
        model = self.model
        configs = {}
        for params in grid_points(grid):
            config = config_of(params, "equal", model.spec.pooling, model.spec.padding_side)
            key = {
                **params,
                "layers": list(config.resolve_layers(model.num_layers)),
                "basket_shares": config.basket_shares,
            }
            configs[calibration_key(key)] = config
        return sum(self.trial_cost(config) for config in configs.values()) + self.profile.cost()

    def reserve(self, trial: optuna.Trial, config: CalibrationConfig) -> None:
        """Reserve what the trial may spend, or end the study here when the allowance has no room for it: the
        trial is then not run (`NotRun`: not counted, no MLflow run) and no trial starts after it. Every trial that
        starts can thus finish; the references (the baseline, the paper default) always run."""
        assert self.allowance is not None
        study, needed = trial.study, self.trial_cost(config)
        spent = trials_spent(study, excluding=trial.number)
        if spent + needed <= self.allowance:
            trial.set_user_attr(RESERVED_ATTR, needed)
            return
        store_budget_end(study, BudgetEnd(trial.number, self.allowance, spent, needed))
        reason = (
            f"the budget is spent: trial {trial.number} would need up to {needed:,} layer-tokens and "
            f"{max(self.allowance - spent, 0):,} of the trials' {self.allowance:,} are left"
        )
        log.info("%s; no more trials start", reason)
        trial.set_user_attr("feasible", f"NO: not run, {reason}")
        trial.set_user_attr(NOT_RUN_ATTR, reason)
        raise NotRun(reason)
