"""A study's finished trials as everyone who reads a study sees them (the search, the plots, the conclusion)."""

from __future__ import annotations

from collections.abc import Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState


def complete_trials(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def constraints_of(trial: FrozenTrial) -> Sequence[float]:
    """The trial's constraint values in Optuna's convention (≤ 0: met), as the objective set them."""
    return list(trial.constraints.values())
