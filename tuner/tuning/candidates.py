"""The complete trials as selection reads them: candidates, the thresholds pruning compares with, the winner, a
trial the user chose, the Pareto front."""

from __future__ import annotations

import logging
import math

import optuna
from optuna.trial import FrozenTrial

from objectives import Candidate, Selection, select
from objectives.selection import chosen
from tuner.common.trials import DUPLICATE_ATTR, ScreenFigures, complete_trials, constraints_of, objective_resamples

log = logging.getLogger(__name__)


def candidates(study: optuna.Study) -> list[Candidate]:
    """Complete trials as selection sees them: the objective (the worst PSI over the tuning structures; the
    tuning PSI for a trial that recorded none over structures), its standard error, drift and constraint values.
    A repeat of an earlier trial is that trial, so it is not a candidate of its own."""
    return [
        Candidate(
            t.number,
            t.user_attrs.get("robust_psi", t.user_attrs["psi"]),
            t.user_attrs.get("robust_psi_se", t.user_attrs.get("psi_se", 0.0)),
            t.user_attrs.get("drift", 0.0),
            tuple(constraints_of(t)),
            t.user_attrs["hm"],
            objective_resamples(t),
            structure_mean_psi(t),
        )
        for t in complete_trials(study)
        if DUPLICATE_ATTR not in t.user_attrs
    ]


def structure_mean_psi(trial: FrozenTrial) -> float:
    """The mean PSI over the tuning structures the trial was scored on (NaN: it recorded none)."""
    values = [
        row["psi"] for row in trial.user_attrs.get("structures", {}).values() if math.isfinite(row.get("psi", math.nan))
    ]
    return sum(values) / len(values) if values else math.nan


def selection_threshold(study: optuna.Study, rule: str) -> float | None:
    """The objective a trial must reach to be eligible under `rule` given the complete trials so far (one-SE:
    the best objective plus its standard error; lowest: the best objective); None while none is feasible."""
    selection = select(candidates(study), rule)  # type: ignore[arg-type]
    return None if selection is None else selection.threshold


def best_objective(study: optuna.Study) -> float | None:
    """The lowest objective of the feasible complete trials so far; None while none is feasible."""
    selection = select(candidates(study), "lowest")
    return None if selection is None else selection.best.objective


def screen_threshold(study: optuna.Study) -> float | None:
    """The screen PSI a trial must come within noise of to go past the pooled screen: the lowest screen PSI plus
    its standard error over the feasible complete trials that were screened; None while there is none."""
    trials = study.get_trials(deepcopy=False)
    screened = [ScreenFigures.of_trial(trials[c.trial_number]) for c in candidates(study) if c.feasible]
    return min((s.psi + s.psi_se for s in screened if s is not None), default=None)


def winner(study: optuna.Study, rule: str = "one-se") -> tuple[FrozenTrial, Selection] | None:
    """The winning trial under the selection rule (`objectives.selection`), with the reasoning; None when
    no complete trial is feasible."""
    selection = select(candidates(study), rule)  # type: ignore[arg-type]
    return (study.trials[selection.winner.trial_number], selection) if selection else None


def trial_by_number(study: optuna.Study, number: int) -> tuple[FrozenTrial, Selection]:
    """Trial `number` of the study, as a choice of the user's (`tune export --trial`): it must be complete."""
    found = {c.trial_number: c for c in candidates(study)}
    if number not in found:
        complete = sorted(found)
        raise ValueError(
            f"--trial {number}: study {study.study_name!r} has no complete trial {number}; "
            f"complete trials: {complete[:20]}{' …' if len(complete) > 20 else ''}"
        )
    if not found[number].feasible:
        log.warning("trial %d misses a constraint of the study; exported as asked", number)
    return study.trials[number], chosen(found[number])


def pareto_front(study: optuna.Study) -> list[FrozenTrial]:
    """Feasible, non-dominated trials in (PSI down, HM up), from each trial's recorded PSI and HM: a
    single-objective study has them too, where Optuna's `best_trials` is only the lowest PSI."""
    feasible = [t for t in complete_trials(study) if all(c <= 0 for c in constraints_of(t))]
    return [
        t
        for t in feasible
        if not any(
            o.user_attrs["psi"] <= t.user_attrs["psi"]
            and o.user_attrs["hm"] >= t.user_attrs["hm"]
            and (o.user_attrs["psi"], o.user_attrs["hm"]) != (t.user_attrs["psi"], t.user_attrs["hm"])
            for o in feasible
        )
    ]
