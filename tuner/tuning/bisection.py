"""λ bisection: the fair neighbour of an over-correcting config is the same config, weaker.

Over-correction grows with the strength λ: with the other knobs fixed, a stronger calibration moves more of
the pooled token's attention to the end, so past some λ the bias reverses or nDCG@10 is lost on a structure,
and below it the config is fair. The best configs of a family (its variant, depth, basket size and shares)
sit just below that boundary, and the budget buys a handful of trials, so TPE rarely draws one there: after
an over-correcting draw it moves elsewhere, usually to weak configs. So after every trial the study bisects λ
in that trial's family: between the strongest λ known to be feasible and the weakest known to over-correct,
the midpoint is queued (`study.enqueue_trial`), until the two are one step of the space's λ grid apart. With
no feasible λ known yet the search gallops down (an exponential search): 2, then 4, then 8 grid steps below
the weakest over-correcting λ, so a boundary far down is reached in a few probes, and one near the top (the
usual case) in small, cheap steps: an over-correcting probe stops at the first rung (the least biased
structure shows the reversal, `tuner.tuning.objective.corpus_rungs`), while a feasible one costs a full
trial. Halving towards λ 0 instead spent seed 1's budget on a full trial at λ 0.45 and ended before its
boundary (0.55-0.7) was found; two steps at a time walked seed 1's CLS-Hard B 64 family down λ 0.6, 0.5, 0.4,
0.3 and left no room for the probe that had won it before.
A family that loses nDCG@10 at every λ is left as soon as a probe is no fairer than the best trial so far
(`queue_next`): stopping only above what selection would take walked one (Uniform, 3 layers, B 64) down λ
0.45, 0.35, 0.25, 0.15 and spent seed 2's budget on it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.common.trials import BISECT_ATTR, SURPLUS_ATTR, named_constraints
from tuner.tuning.search_space import SHARES_ATTR, trial_basket_shares

log = logging.getLogger(__name__)

OVER_CORRECTION = ("reversal", "structure_ndcg", "ndcg_drop", "drift")
"""The constraints a too strong calibration misses: the bias reversed, nDCG@10 lost on a structure or on the tuning passages,
the document vectors moved further than the drift limit allows (drift grows with λ as the rest does)."""


@dataclass(frozen=True)
class Probe:
    """One scored λ of a family: feasible (complete, every constraint met) or over-correcting (an `OVER_CORRECTION`
    constraint missed); a trial that is neither (pruned on PSI, below the HM floor only) tells nothing about the boundary."""

    strength: float
    feasible: bool
    over_corrects: bool


def next_strength(probes: Iterable[Probe], step: float) -> tuple[float, float | None, float] | None:
    """The λ to try next in a family, with the feasible and over-correcting λ it lies between (the feasible one None
    while the search gallops down); None when no λ of the family over-corrects, or the boundary is found to within
    one step of the λ grid (or would need λ ≤ 0)."""
    probes = list(probes)
    feasible = max((p.strength for p in probes if p.feasible), default=None)
    above = [p.strength for p in probes if p.over_corrects and (feasible is None or p.strength > feasible)]
    if not above:
        return None
    over = min(above)
    if feasible is None:  # galloping down: 2, 4, 8 ... grid steps below the weakest over-correcting λ
        strength = _on_grid(over - 2 ** len(above) * step, step)
    elif over - feasible <= step * (1 + 1e-6):
        return None
    else:
        strength = _on_grid((feasible + over) / 2, step)
        if strength <= feasible + 1e-9:
            strength = _on_grid(feasible + step, step)
    tried = {round(p.strength, 6) for p in probes}
    if strength <= 0 or round(strength, 6) in tried:
        return None
    return strength, feasible, over


def _on_grid(value: float, step: float) -> float:
    """`value` rounded down to the λ grid (multiples of `step`), as the space suggests λ."""
    return round(math.floor(value / step + 1e-6) * step, 6)


def family(trial: FrozenTrial | optuna.Trial) -> str:
    """Every knob but λ, the basket shares included (a parameter, or pinned on the trial)."""
    knobs = {k: v for k, v in trial.params.items() if k not in ("strength", SHARES_ATTR)}
    return json.dumps({**knobs, SHARES_ATTR: trial_basket_shares(trial)}, sort_keys=True)


def probe_of(
    trial: FrozenTrial | optuna.Trial, constraints: Mapping[str, float] | None = None, complete: bool | None = None
) -> Probe | None:
    """What a finished trial says of its family's boundary (None for λ 0, the baseline, which is no member of any
    family, and for a surplus draw, which never ran). `constraints` and `complete` describe a trial still being finished by the caller."""
    strength = float(trial.params.get("strength", 0.0))
    if strength <= 0 or SURPLUS_ATTR in trial.user_attrs:  # a draw the budget or --trials had no room for never ran
        return None
    if constraints is None or complete is None:
        assert isinstance(trial, FrozenTrial)
        constraints, complete = named_constraints(trial), trial.state == TrialState.COMPLETE
    return Probe(
        strength, complete and all(v <= 0 for v in constraints.values()), any(constraints.get(n, 0.0) > 0 for n in OVER_CORRECTION)
    )


def queue_next(
    study: optuna.Study,
    trial: FrozenTrial | optuna.Trial,
    constraints: Mapping[str, float],
    complete: bool,
    step: float,
    worst_psi: float,
    best: float | None,
) -> float | None:
    """After `trial` (finished by the caller, so given its constraint values, whether it completed and its worst-case
    PSI so far), queue its family's next λ if the boundary is not found yet; returns the λ queued (None: nothing).

    With no feasible λ of the family known, the next one is weaker, so less fair: when the trial's worst case so
    far (a lower bound on its final one) is already above `best`, the lowest objective of the feasible trials, a
    weaker λ of the family would be no fairer than a config the study has, and nothing is queued. A config
    already run or queued is not queued again."""
    own = probe_of(trial, constraints, complete)
    if own is None:
        return None
    mine = family(trial)
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    probes = [own, *(p for t in finished if t.number != trial.number and family(t) == mine and (p := probe_of(t)) is not None)]
    found = next_strength(probes, step)
    if found is None:
        return None
    strength, feasible, over = found
    if feasible is None and best is not None and worst_psi > best:
        log.info(
            "trial %d: λ bisection stops: worst-case PSI %.3f is above the best trial's %.3f already, and weaker is less fair",
            trial.number,
            worst_psi,
            best,
        )
        return None
    attrs: dict[str, object] = {BISECT_ATTR: {"of": trial.number, "feasible": feasible, "over_corrects": over}}
    if SHARES_ATTR not in trial.params:
        attrs[SHARES_ATTR] = trial_basket_shares(trial)
    before = len(study.get_trials(deepcopy=False))
    study.enqueue_trial({**trial.params, "strength": strength}, user_attrs=attrs, skip_if_exists=True)
    if len(study.get_trials(deepcopy=False)) == before:  # run or queued already (by another worker, say)
        return None
    log.info("trial %d: λ bisection queued the same config at λ %g (%s)", trial.number, strength, _between(feasible, over))
    return strength


def describe_queued(record: Mapping[str, object]) -> str:
    """Why a queued trial runs, from its `BISECT_ATTR` record: for its MLflow run, beside the log line that queued it."""
    feasible, over = record.get("feasible"), record.get("over_corrects")
    assert over is not None
    return f"queued by λ bisection after trial {record['of']}: the same config, {_between(feasible, float(over))}"  # type: ignore[arg-type]


def _between(feasible: float | None, over: float) -> str:
    where = f"between λ {feasible:g}, feasible, and" if feasible is not None else "below"
    return f"{where} λ {over:g}, which over-corrects"


def withdraw_queued(study: optuna.Study) -> list[int]:
    """The queued trials of a study that has ended before running them: pruned unrun as surplus (not counted, no
    MLflow run), so a finished study leaves nothing waiting. A trial a worker has just taken is left to it: the
    change from waiting to running succeeds once. Returns the trials withdrawn."""
    storage, withdrawn = study._storage, []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if BISECT_ATTR in trial.user_attrs and storage.set_trial_state_values(trial._trial_id, TrialState.RUNNING):
            storage.set_trial_user_attr(trial._trial_id, SURPLUS_ATTR, True)
            storage.set_trial_state_values(trial._trial_id, TrialState.PRUNED)
            withdrawn.append(trial.number)
    if withdrawn:
        log.info("λ bisection: the study ended before queued trial(s) %s ran; withdrawn (pruned unrun as surplus)", withdrawn)
    return withdrawn
