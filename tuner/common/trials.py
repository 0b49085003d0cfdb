"""A study's finished trials as everyone who reads a study sees them (the search, the plots, the conclusion)."""

from __future__ import annotations

from collections.abc import Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState


def complete_trials(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def constraints_of(trial: FrozenTrial) -> Sequence[float]:
    """The trial's constraint values in Optuna's convention (≤ 0: met), as the objective set them by name
    (without the unnamed copy kept for optuna-dashboard, which Optuna lists under '0', '1', ...)."""
    return list(named_constraints(trial).values())


def named_constraints(trial: FrozenTrial) -> dict[str, float]:
    """{'hm_floor': ..., 'ndcg_drop': ...}: the named constraint values (`constraints_of`)."""
    return {name: value for name, value in trial.constraints.items() if not name.isdigit()}
