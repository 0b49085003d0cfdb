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
structure shows the reversal, `tuner.tuning.trial.scoring.corpus_rungs`), while a feasible one costs a full
trial: halving towards λ 0 would spend a budget on full trials far below the boundary, and fixed small steps
would walk a family down one probe at a time.
A family that loses nDCG@10 at every λ is left as soon as a probe is no fairer than the best trial so far
(`queue_next`): a weaker λ is less fair, so it could not beat a config the study has.
Where the drift limit (`--max-drift`) bounds a family, the drift its probes measured says where without
another probe: within a family the drift grows as a power of λ (`DRIFT_EXPONENTS`), so a λ whose drift that
law puts over the limit on some structure is treated as too strong and never probed
(`drift_ceiling`): a probe whose drift the family's earlier probes already predict is budget spent on nothing
(docs/search.md, *λ bisection*).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import optuna
from optuna.trial import FrozenTrial, TrialState

from objectives.constraint import outcome
from tuner.common.trials import BISECT_ATTR, NOT_RUN_ATTR, START_ATTR, named_constraints, never_ran
from tuner.tuning.optuna_access import set_stored_trial_user_attr, set_trial_state
from tuner.tuning.search_space import SHARES_ATTR, trial_basket_shares

log = logging.getLogger(__name__)

OVER_CORRECTION = ("reversal", "structure_ndcg", "ndcg_drop", "drift")
"""The constraints a too strong calibration misses: the bias reversed, nDCG@10 lost on a structure or on the tuning
passages, the document vectors moved further than the drift limit allows (drift grows with λ as the rest does)."""


DRIFT_EXPONENTS = (1.75, 3.25)
"""Bounds on p in drift ∝ λ^p within a family (the other knobs fixed), on every structure. To first order in λ
the calibrated attention, so the pooled vector, moves linearly in λ, and 1 − cos grows as the square of that
move: p = 2 for a mild calibration. The bounds widen the range measured on real models' studies
(`benchmarks/drift_law.py`, `benchmarks/rules_transfer.py`), so a λ `drift_ceiling` rules out is over the limit
unless the law bends further than it did there. On EmbeddingGemma it does: drift grows more slowly than λ^1.75 in
some families, so in such a family with a feasible λ the ceiling could rule out λ still under the limit (in its
default studies those families had none). docs/models.md (*The rules on three models*) shows the exponents
measured against these bounds, and what the pairs outside them change."""


@dataclass(frozen=True)
class Probe:
    """One scored λ of a family: feasible (complete, every constraint met) or too strong (`missed`: the
    `OVER_CORRECTION` constraints it missed); a trial that is neither (pruned on PSI, below the HM floor only) tells
    nothing about the boundary. `drift`: the drift it measured on each structure scored (mean 1 − cos to the
    uncalibrated document vectors)."""

    strength: float
    feasible: bool
    missed: tuple[str, ...] = ()
    drift: Mapping[str, float] = field(default_factory=dict)

    @property
    def too_strong(self) -> bool:
        return bool(self.missed)


def drift_ceiling(probes: Iterable[Probe], limits: Mapping[str, float]) -> float | None:
    """The λ above which the family's drift is over its limit on some structure by `DRIFT_EXPONENTS`, from the drift
    each probe measured (None: no probe measured drift on a limited structure). Up from a probe the drift grows at
    least as λ^1.75, so past λ·(limit/drift)^(1/1.75) it is over; down from a probe over the limit it falls at most
    as λ^3.25, so it is still over above λ·(limit/drift)^(1/3.25). `limits`: the drift allowed per structure."""
    low, high = DRIFT_EXPONENTS
    bounds = [
        probe.strength * (limits[name] / drift) ** (1 / (low if drift <= limits[name] else high))
        for probe in probes
        for name, drift in probe.drift.items()
        if drift > 0 and limits.get(name, 0.0) > 0
    ]
    return min(bounds, default=None)


class NextStrength(NamedTuple):
    """The λ bisection tries next, the feasible λ below it (None while galloping down), the weakest too strong λ
    above it and what that one missed (`OVER_CORRECTION` names), and the drift ceiling when that is lower
    (`drift_ceiling`: no probe above it)."""

    strength: float
    feasible: float | None
    over: float
    ceiling: float | None = None
    missed: tuple[str, ...] = ()


def next_strength(
    probes: Iterable[Probe], step: float, drift_limits: Mapping[str, float] | None = None
) -> NextStrength | None:
    """The λ to try next in a family, with the feasible and over-correcting λ it lies between; None when no λ of the
    family over-corrects, or the boundary is found to within one step of the λ grid (or would need λ ≤ 0). With
    `drift_limits` (the drift allowed per structure) the λ the probes' drift puts over the limit (`drift_ceiling`)
    count as too strong: nothing above it is tried."""
    probes = list(probes)
    feasible = max((p.strength for p in probes if p.feasible), default=None)
    above = [p for p in probes if p.too_strong and (feasible is None or p.strength > feasible)]
    if not above:
        return None
    weakest = min(above, key=lambda p: p.strength)
    over = weakest.strength
    ceiling = drift_ceiling(probes, drift_limits) if drift_limits else None
    if feasible is None:  # galloping down: 2, 4, 8 ... grid steps below the weakest over-correcting λ
        gallop = over - 2 ** len(above) * step
        # None: the gallop lands below it anyway
        ceiling = ceiling if ceiling is not None and ceiling < gallop else None
        strength = _on_grid(gallop if ceiling is None else ceiling, step)
    else:
        ceiling = ceiling if ceiling is not None and ceiling < over else None
        upper = over if ceiling is None else ceiling
        if upper - feasible <= step * (1 + 1e-6):
            return None
        strength = _on_grid((feasible + upper) / 2, step)
        if strength <= feasible + 1e-9:
            strength = _on_grid(feasible + step, step)
    tried = {round(p.strength, 6) for p in probes}
    if strength <= 0 or round(strength, 6) in tried:
        return None
    return NextStrength(strength, feasible, over, ceiling, weakest.missed)


def _on_grid(value: float, step: float) -> float:
    """`value` rounded down to the λ grid (multiples of `step`), as the space suggests λ."""
    return round(math.floor(value / step + 1e-6) * step, 6)


def family(trial: FrozenTrial | optuna.Trial) -> str:
    """Every knob but λ, the basket shares included (a parameter, or pinned on the trial)."""
    knobs = {k: v for k, v in trial.params.items() if k not in ("strength", SHARES_ATTR)}
    return json.dumps({**knobs, SHARES_ATTR: trial_basket_shares(trial)}, sort_keys=True)


def probe_of(
    trial: FrozenTrial | optuna.Trial,
    constraints: Mapping[str, float] | None = None,
    complete: bool | None = None,
    drift: Mapping[str, float] | None = None,
) -> Probe | None:
    """What a finished trial says of its family's boundary (None for λ 0, the baseline, which is no member of any
    family, and for a draw that never ran). `constraints`, `complete` and `drift` (per structure scored)
    describe a trial still being finished by the caller; a finished one's drift is in its structures' rows."""
    strength = float(trial.params.get("strength", 0.0))
    if strength <= 0 or never_ran(trial):  # a draw the budget or --trials had no room for
        return None
    if constraints is None or complete is None:
        assert isinstance(trial, FrozenTrial)
        constraints, complete = named_constraints(trial), trial.state == TrialState.COMPLETE
    if drift is None:
        rows = trial.user_attrs.get("structures") or {}
        drift = {name: float(row["drift"]) for name, row in rows.items() if row.get("drift") is not None}
    return Probe(
        strength,
        complete and all(v <= 0 for v in constraints.values()),
        tuple(n for n in OVER_CORRECTION if constraints.get(n, 0.0) > 0),
        dict(drift),
    )


def queue_next(
    study: optuna.Study,
    trial: FrozenTrial | optuna.Trial,
    constraints: Mapping[str, float],
    complete: bool,
    step: float,
    worst_psi: float,
    best: float | None,
    drift: Mapping[str, float] | None = None,
    drift_limits: Mapping[str, float] | None = None,
    say: Callable[[str], object] = log.info,
) -> float | None:
    """After `trial` (finished by the caller, so given its constraint values, whether it completed, its drift per
    structure scored and its worst-case PSI so far), queue its family's next λ if the boundary is not found yet;
    returns the λ queued (None: nothing). `drift_limits`: the drift allowed per structure (None: no drift limit).
    `say` takes what is said of it (the trial loop says it after the trial's own line).

    With no feasible λ of the family known, the next one is weaker, so less fair: when the trial's worst case so
    far (a lower bound on its final one) is already above `best`, the lowest objective of the feasible trials, a
    weaker λ of the family would be no fairer than a config the study has, and nothing is queued. A config
    already run or queued is not queued again."""
    own = probe_of(trial, constraints, complete, drift)
    if own is None:
        return None
    mine = family(trial)
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    probes = [
        own,
        *(p for t in finished if t.number != trial.number and family(t) == mine and (p := probe_of(t)) is not None),
    ]
    found = next_strength(probes, step, drift_limits)
    if found is None:
        unlimited = next_strength(probes, step) if drift_limits else None
        if unlimited is not None:
            ceiling = drift_ceiling(probes, drift_limits or {})
            say(
                f"trial {trial.number}: λ bisection ends: the drift measured in this family puts every λ above "
                f"{ceiling:.3f} over the drift limit"
            )
        return None
    strength, feasible, over, ceiling, missed = found
    if feasible is None and best is not None and worst_psi > best:
        say(
            f"trial {trial.number}: λ bisection stops: worst-case PSI {worst_psi:.3f} is above the best trial's "
            f"{best:.3f} already, and weaker is less fair"
        )
        return None
    record = {"of": trial.number, "feasible": feasible, "too_strong": over, "because": outcome(missed)}
    attrs: dict[str, object] = {
        BISECT_ATTR: record if ceiling is None else {**record, "drift_ceiling": round(ceiling, 4)}
    }
    if SHARES_ATTR not in trial.params:
        attrs[SHARES_ATTR] = trial_basket_shares(trial)
    before = len(study.get_trials(deepcopy=False))
    study.enqueue_trial({**trial.params, "strength": strength}, user_attrs=attrs, skip_if_exists=True)
    if len(study.get_trials(deepcopy=False)) == before:  # run or queued already (by another worker, say)
        return None
    between = _between(feasible, over, outcome(missed), ceiling)
    say(f"trial {trial.number}: λ bisection queued the same config at λ {strength:g} ({between})")
    return strength


def describe_queued(record: Mapping[str, object]) -> str:
    """Why a queued trial runs, from its `BISECT_ATTR` record: for its MLflow run, beside the log line that queued
    it."""
    feasible, ceiling = record.get("feasible"), record.get("drift_ceiling")
    over = record.get("too_strong", record.get("over_corrects"))  # the key a study queued by an older posfair holds
    assert over is not None
    because = str(record.get("because", "misses a constraint that grows with λ"))
    between = _between(feasible, float(over), because, ceiling)  # type: ignore[arg-type]
    return f"queued by λ bisection after trial {record['of']}: the same config, {between}"


def _between(feasible: float | None, over: float, because: str, ceiling: float | None = None) -> str:
    """'between λ 0.55, feasible, and λ 0.7, which reverses the bias': `because`, what the stronger λ missed, in the
    constraints' own words (`objectives.constraint.outcome`)."""
    where = f"between λ {feasible:g}, feasible, and" if feasible is not None else "below"
    said = f"{where} λ {over:g}, which {because}"
    return (
        said if ceiling is None else f"{said}; the drift measured puts every λ above {ceiling:.3g} over the drift limit"
    )


def withdraw_queued(study: optuna.Study) -> list[int]:
    """The queued trials of a study that has ended before running them: withdrawn unrun (`NotRun`'s FAIL: not
    counted, no MLflow run), so a finished study leaves nothing waiting. A trial a worker has just taken is left to
    it: the change from waiting to running succeeds once. Returns the trials withdrawn."""
    withdrawn = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if (BISECT_ATTR in trial.user_attrs or START_ATTR in trial.user_attrs) and set_trial_state(
            study, trial, TrialState.RUNNING
        ):
            set_stored_trial_user_attr(study, trial, NOT_RUN_ATTR, "the study ended before this queued trial ran")
            set_trial_state(study, trial, TrialState.FAIL)
            withdrawn.append(trial.number)
    if withdrawn:
        log.info("the study ended before queued trial(s) %s ran; withdrawn (not run)", withdrawn)
    return withdrawn
