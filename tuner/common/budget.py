"""A study's `--budget` as the study stores it: read and written here only.

Three quantities, three words: a study's *allowance* is the layer-tokens it may spend (all of it, or what its
trials may spend once the baselines and queries are paid); what its trials have *spent* is their own count
(`tuner.common.trials.trials_spent`); a trial's *cost* is what it spends when no rung prunes it. The coordinator
resolves `--budget` into a `StudyBudget` and stores it as a study user attribute (`BUDGET_ATTR`, JSON), which every
worker reads; the draw the allowance had no room for is stored as a `BudgetEnd` (`BUDGET_END_ATTR`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import optuna

from tuner.common.messages import UserError
from tuner.common.options import Budget
from tuner.common.waiting import wait_until

BUDGET_ATTR = "budget"  # a study attribute: `StudyBudget.to_attr()` of `--budget`, resolved by the coordinator
BUDGET_END_ATTR = "budget_end"  # a study attribute: `BudgetEnd.to_attr()` of the draw the budget had no room for


@dataclass(frozen=True)
class StudyBudget:
    """`--budget` resolved on this model and data, in layer-tokens. The stored keys are those of the studies that
    posfair stored before this record (`to_attr`), so every stored study still loads."""

    spec: str = ""  # `--budget` in words ("1/3 of the paper grid's layer-tokens")
    study_allowance: int = 0  # what the whole study may spend
    grid_cost: int = 0  # what the paper grid's study costs here (a share of the grid is a share of this)
    setup_cost: int = 0  # the baselines and queries, as a fresh machine encodes them
    trial_allowance: int = 0  # what the study's trials may spend: the study's allowance less the setup
    depth_costs: dict[str, int] | None = None  # an unpruned trial's cost at each depth; None until priced

    KEYS: ClassVar[dict[str, str]] = {
        "spec": "spec",
        "study_allowance": "study",
        "grid_cost": "grid",
        "setup_cost": "setup",
        "trial_allowance": "trials",
    }

    @property
    def priced(self) -> bool:
        """Whether the coordinator has priced each depth on its loaded structures (`depth_costs`)."""
        return self.depth_costs is not None

    def to_attr(self) -> dict[str, object]:
        """The JSON-able study attribute."""
        stored: dict[str, object] = {key: getattr(self, name) for name, key in self.KEYS.items()}
        return stored if self.depth_costs is None else {**stored, "depth_cost": dict(self.depth_costs)}

    @classmethod
    def from_attr(cls, attr: Mapping[str, object] | None) -> StudyBudget | None:
        """The record of a stored study attribute (None: the study has no budget); a key it lacks keeps its default."""
        if not attr:
            return None
        known = {name: attr[key] for name, key in cls.KEYS.items() if key in attr}
        depth = attr.get("depth_cost")
        return cls(**known, depth_costs=dict(depth) if isinstance(depth, Mapping) else None)  # type: ignore[arg-type]


@dataclass(frozen=True)
class BudgetEnd:
    """The draw that ended a study: the trial's number, the trials' allowance then, what they had spent, and what
    the trial would have cost (more than was left)."""

    trial: int
    trial_allowance: int
    spent: int
    needed: int

    def to_attr(self) -> dict[str, int]:
        return {"trial": self.trial, "trials": self.trial_allowance, "spent": self.spent, "needed": self.needed}

    @classmethod
    def from_attr(cls, attr: Mapping[str, object] | None) -> BudgetEnd | None:
        if not attr:
            return None
        return cls(int(attr["trial"]), int(attr["trials"]), int(attr["spent"]), int(attr["needed"]))  # type: ignore[call-overload]

    @property
    def left(self) -> int:
        """What was left of the trials' allowance."""
        return max(self.trial_allowance - self.spent, 0)


def study_budget(study: optuna.Study) -> StudyBudget | None:
    """The study's budget (None: none, or a resume with `--budget none`)."""
    return StudyBudget.from_attr(study.user_attrs.get(BUDGET_ATTR))


def store_study_budget(study: optuna.Study, budget: StudyBudget | None) -> None:
    study.set_user_attr(BUDGET_ATTR, None if budget is None else budget.to_attr())


def budget_end(study: optuna.Study) -> BudgetEnd | None:
    """The draw the budget had no room for, once there was one."""
    return BudgetEnd.from_attr(study.user_attrs.get(BUDGET_END_ATTR))


def store_budget_end(study: optuna.Study, end: BudgetEnd) -> None:
    study.set_user_attr(BUDGET_END_ATTR, end.to_attr())


def budget_ended(study: optuna.Study, trial_allowance: int | None) -> bool:
    """Whether the study ended at this trial allowance (or a smaller one): a larger `--budget` on resume goes on."""
    end = budget_end(study)
    return trial_allowance is not None and end is not None and end.trial_allowance >= trial_allowance


def price_budget(budget: Budget, setup: float, grid_trials: float) -> StudyBudget:
    """The study's allowance and its trials' (what is left once the baseline passes and the queries are paid), as
    on a fresh machine whatever the disk cache holds, so that a study's trials do not depend on the cache.
    `grid_trials`: what the paper grid's trials cost here."""
    grid = round(grid_trials + setup)
    study, spent = budget.resolve(grid), round(setup)
    if study <= spent:
        raise UserError(
            f"--budget {budget} is ≈ {study:,} layer-tokens here, which does not cover the baselines and queries "
            f"(≈ {spent:,}); raise it, e.g. --budget grid/3, or use --budget none"
        )
    return StudyBudget(str(budget), study, grid, spent, study - spent)


def describe_budget(budget: StudyBudget) -> str:
    """The budget in words, with what it buys at the space's depths (`depth_costs`: an unpruned trial of each)."""
    trials, costs = budget.trial_allowance, list((budget.depth_costs or {}).values())
    return (
        f"budget: {budget.spec}, {budget.study_allowance:,} layer-tokens for the study (the paper grid's study "
        f"here: {budget.grid_cost:,}, each of its configs priced on this data); after the baselines and queries "
        f"({budget.setup_cost:,}) its trials may spend {trials:,}: "
        f"{trials / max(costs):.1f} to {trials / min(costs):.1f} unpruned trials by depth, more where trials are "
        "pruned; the study ends at the first drawn trial that would not fit"
    )


def await_priced(study: optuna.Study, timeout: float = 3600.0) -> StudyBudget | None:
    """The budget once the coordinating `tune` has priced it on its loaded structures (`StudyBudget.priced`), said
    while it is awaited (`wait_until`)."""
    wait_until(
        lambda: (budget := study_budget(study)) is None or budget.priced,
        waiting=f"waiting for the coordinator of study {study.study_name!r} to price its --budget",
        gave_up=f"the coordinator of study {study.study_name!r} never priced its --budget; restart it",
        timeout=timeout,
    )
    return study_budget(study)
