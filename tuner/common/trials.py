"""A study's finished trials as everyone who reads a study sees them (the search, the plots, the conclusion).

Not every finished trial counts towards `--trials`: a trial that drew a calibration the study already ran
repeats that trial's values without running (`DUPLICATE_ATTR`), and a trial Optuna created that never ran (a
`--budget` had no room for it, a worker drew it after the study was full, or the study ended with it queued) is
recorded as FAIL with the reason under `NOT_RUN_ATTR`: Optuna creates a trial before its parameters can be priced,
and FAIL is the one finished state that claims no result (PRUNED reads as stopped partway). A trial pruned between
rungs (`PRUNED_ATTR`) was run, cheaply, and counts. `TrialCounts` is the one count every screen shows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

DUPLICATE_ATTR = "duplicate_of"  # the earlier trial whose calibration a trial drew again
PRUNED_ATTR = "pruned"  # `PrunedAt.to_attr()` of a trial stopped between rungs
NOT_RUN_ATTR = "not_run"  # why a trial Optuna created never ran (`NotRun`)
SCREEN_ATTR = "screen"  # `ScreenFigures.to_attr()` of a trial on the study's pooled screen
# a study attribute, this prefix + a process: the baselines and queries that process encoded
SETUP_COST_ATTR = "setup_layer_tokens/"
# a study attribute: the --selection rule of the run that last coordinated it (`tune export`'s default)
SELECTION_ATTR = "selection"
START_ATTR = "start"  # on a trial queued at the study's start after the references: its role (`PAPER_SIBLINGS`)
CONSTRAINT_NAMES_ATTR = "constraint_names"  # a trial system attribute: the names of its constraint values, in order
SAMPLER_ATTR = "sampler"  # the study attribute naming how its trials were drawn (`--sampler`)
# on a trial λ bisection queued: {"of": the trial that queued it, "feasible": λ, "too_strong": λ, "because": what it
# missed}
BISECT_ATTR = "bisect"
RESERVED_ATTR = "layer_tokens_reserved"  # what a running trial may spend at most (`TrialPricing.trial_cost`)
# A system attribute (out of the dashboard's user attributes: 500 numbers): the trial's worst-case PSI on each common
# query resample, from which selection takes the noise between two trials (`objectives.selection.paired_se`)
RESAMPLES_ATTR = "posfair:robust_psi_resamples"


@dataclass(frozen=True)
class PrunedAt:
    """Where a trial stopped between rungs, and why (`PRUNED_ATTR`): after rung `rung` of `of`, `scored` scored."""

    rung: int
    of: int
    reason: str
    scored: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"rung {self.rung} of {self.of}"

    def to_attr(self) -> dict[str, object]:
        return {"rung": self.rung, "of": self.of, "reason": self.reason, "scored": list(self.scored)}

    @classmethod
    def of_trial(cls, trial: FrozenTrial | optuna.Trial) -> PrunedAt | None:
        """The record of a trial pruned between rungs; None for any other trial."""
        attr = trial.user_attrs.get(PRUNED_ATTR)
        return (
            None
            if attr is None
            else cls(int(attr["rung"]), int(attr["of"]), str(attr["reason"]), tuple(attr["scored"]))
        )


@dataclass(frozen=True)
class ScreenFigures:
    """A trial's figures on the study's pooled screen (`SCREEN_ATTR`): PSI, its standard error, HM."""

    psi: float
    psi_se: float
    hm: float

    def to_attr(self) -> dict[str, float]:
        return {"psi": self.psi, "psi_se": self.psi_se, "hm": self.hm}

    @classmethod
    def of_trial(cls, trial: FrozenTrial) -> ScreenFigures | None:
        """The figures of a trial scored on the screen; None for one that was not."""
        attr = trial.user_attrs.get(SCREEN_ATTR)
        return None if attr is None else cls(float(attr["psi"]), float(attr["psi_se"]), float(attr["hm"]))


class NotRun(Exception):
    """Raised in place of running a trial (`NOT_RUN_ATTR` holds the reason): Optuna records it FAIL, and
    `TrialCounts` counts it apart from the failures."""


def never_ran(trial: FrozenTrial | optuna.Trial) -> bool:
    """Whether the trial was created but never ran (`NotRun`); "surplus" is how studies stored before this
    marked one (then as PRUNED)."""
    attrs = trial.user_attrs
    return NOT_RUN_ATTR in attrs or bool(attrs.get("surplus"))


@dataclass(frozen=True)
class TrialCounts:
    """A study's trials as the console, MLflow, optuna-dashboard and the docs all count them: `complete` (repeats
    apart) and `pruned` (between rungs) ran and count towards `--trials`; `repeats` drew a calibration the study
    had run; `not_run` Optuna created but never ran (`NotRun`); `failed` failed. Waiting and running trials are in
    none of them."""

    complete: int
    pruned: int
    repeats: int
    not_run: int
    failed: int

    @property
    def ran(self) -> int:
        return self.complete + self.pruned

    def sentence(self) -> str:
        """'8 trials ran (6 complete, 2 pruned between rungs)', then repeats and failures where there are any; what
        never ran is said with its reason by the caller (`tuner.tuning.accounts.describe_trials`)."""
        said = f"{self.ran} trials ran ({self.complete} complete, {self.pruned} pruned between rungs)"
        extra = [
            f"{count} {what}"
            for count, what in ((self.repeats, "drew a calibration already run"), (self.failed, "failed"))
            if count
        ]
        return said + (f"; {', '.join(extra)}" if extra else "")

    def to_dict(self) -> dict[str, int]:
        return {
            "complete": self.complete,
            "pruned": self.pruned,
            "repeats": self.repeats,
            "not_run": self.not_run,
            "failed": self.failed,
        }


def trial_counts(study: optuna.Study) -> TrialCounts:
    """The study's `TrialCounts`: `complete` + `pruned` are its `finished` trials."""
    complete = pruned = repeats = not_run = failed = 0
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
        if never_ran(trial) or (trial.state == TrialState.PRUNED and PRUNED_ATTR not in trial.user_attrs):
            not_run += 1
        elif trial.state == TrialState.COMPLETE:
            repeats += DUPLICATE_ATTR in trial.user_attrs
            complete += DUPLICATE_ATTR not in trial.user_attrs
        elif trial.state == TrialState.PRUNED:
            pruned += 1
        else:
            failed += 1
    return TrialCounts(complete, pruned, repeats, not_run, failed)


def complete_trials(study: optuna.Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def objective_resamples(trial: FrozenTrial) -> tuple[float, ...] | None:
    """The worst-case PSI the trial recorded per common resample (NaN where undefined); None for a trial recorded
    without."""
    values = trial.system_attrs.get(RESAMPLES_ATTR)
    return None if values is None else tuple(float("nan") if v is None else float(v) for v in values)


def constraints_of(trial: FrozenTrial) -> Sequence[float]:
    """The trial's constraint values in Optuna's convention (≤ 0: met), in the order of their names."""
    return list(named_constraints(trial).values())


def named_constraints(trial: FrozenTrial) -> dict[str, float]:
    """{'hm_floor': ..., 'ndcg_drop': ...}: the trial's constraint values by name. They are stored once, as the list
    Optuna lists under '0', '1', ... (`tuner.tuning.trial.record.set_constraints`), named by `CONSTRAINT_NAMES_ATTR`;
    a study stored by an earlier posfair has them by name as well, and the unnamed copy is left out."""
    names = trial.system_attrs.get(CONSTRAINT_NAMES_ATTR)
    values = trial.constraints
    if names is None:
        return {name: value for name, value in values.items() if not name.isdigit()}
    return {name: values[str(i)] for i, name in enumerate(names)}


def counted(trial: FrozenTrial) -> bool:
    """Whether a trial counts towards `--trials`: running, complete (not a repeat) or pruned between rungs."""
    if trial.state in (TrialState.RUNNING, TrialState.COMPLETE):
        return DUPLICATE_ATTR not in trial.user_attrs
    return trial.state == TrialState.PRUNED and PRUNED_ATTR in trial.user_attrs


def finished(study: optuna.Study) -> list[FrozenTrial]:
    """The trials that count towards `--trials` and are done: complete (not repeats) or pruned between rungs."""
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)) if counted(t)]


def calibration_key(params: Mapping[str, object]) -> str:
    """One string per distinct calibration of a trial's logged parameters (λ 0 is the baseline, whatever the
    rest): two trials with one key encode identical vectors."""
    if float(params.get("strength", 0.0)) == 0.0:  # type: ignore[arg-type]
        return "uncalibrated"
    keys = ("variant", "strength", "layers", "basket_size", "basket_shares") + (
        ("weight",) if params.get("variant") == "cls_hard" else ()
    )
    return json.dumps({k: params.get(k) for k in keys}, sort_keys=True)


def trials_spent(study: optuna.Study, excluding: int | None = None) -> int:
    """The layer-tokens a study's trials have spent, and those running may still spend: a complete or pruned
    trial's own count; a running one's reservation (`RESERVED_ATTR`), so that workers budget alike; a failed
    one's reservation too, since what it spent before it failed is not recorded (at most that)."""
    total = 0
    for trial in study.get_trials(deepcopy=False):
        if trial.number == excluding:
            continue
        if trial.state in (TrialState.RUNNING, TrialState.FAIL):
            total += int(trial.user_attrs.get(RESERVED_ATTR, 0))
        else:
            total += int(trial.user_attrs.get("layer_tokens", 0))
    return total
