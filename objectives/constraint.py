"""The constraints a calibration must respect to win: HM above a floor, aggregate nDCG@10 not below the
uncalibrated model's, no bias reversed, the document vectors moved no further than a multiple of what the
paper default moves them, and optionally general retrieval kept.

PSI alone rewards flattening every group down to the worst one (paper, Ethics statement), so the
study constrains HM; and a calibration that buys fairness with aggregate effectiveness has not helped
the user, so aggregate nDCG@10 is constrained too. Constraint values follow Optuna's convention: a
value ≤ 0 is satisfied.

The default HM floor is `significant`: the lower end of the 95% paired-bootstrap interval of the
trial's HM must reach the uncalibrated HM, i.e. calibration must raise HM by more than the tuning
split's noise. The plain `baseline` floor (point estimate ≥ uncalibrated HM) is cleared by almost any
calibration and therefore selects nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

_ACCEPTED = (
    "'significant' (HM significantly above the uncalibrated HM: the default), 'baseline' (HM at least the "
    "uncalibrated HM), an absolute HM on the 0–1 scale such as '0.52', or a signed change relative to the "
    "baseline HM such as '-1%' or '+0.5%'"
)
_PERCENT = re.compile(r"^([+-]?)\s*(\d+(?:\.\d*)?|\.\d+)\s*%$")

NO_DIRECTION = "no direction"
"""Where the no-reversal rule was decided (`RobustEvidence.deciding`) when no tuning structure scored so far has
a favoured end beyond noise uncalibrated: nothing could be reversed, so the rule is met."""


@dataclass(frozen=True)
class HmFloor:
    """The lowest HM a calibration may reach and still win.

    `kind` 'significant' (the default): the floor is the uncalibrated HM, and a trial clears it only with
    the lower end of its HM's 95% paired-bootstrap interval (`conservative`). 'baseline': the floor is the
    uncalibrated HM, cleared by the point estimate. 'absolute': `value` is the floor on the 0–1 scale.
    'relative': `value` is a fraction of the baseline HM (-0.01 for '-1%'), so the floor is
    baseline × (1 + value).

    Absolute floors are always on the 0–1 scale: '52' is rejected rather than guessed to mean 0.52.
    """

    kind: Literal["significant", "baseline", "absolute", "relative"] = "significant"
    value: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("significant", "baseline", "absolute", "relative"):
            raise ValueError(f"unknown HM floor kind {self.kind!r}; accepted: {_ACCEPTED}")
        if self.kind == "absolute" and not 0 <= self.value <= 1:
            hint = f" (for {self.value:g} points write {self.value / 100:g})" if 1 < self.value <= 100 else ""
            raise ValueError(f"HM floor {self.value:g} is not on the 0–1 scale{hint}; accepted: {_ACCEPTED}")
        if self.kind == "relative" and not self.value > -1:
            raise ValueError(f"a relative HM floor of {self.value:+.0%} would allow HM to drop to 0 or below")
        if self.kind in ("significant", "baseline") and self.value != 0:
            raise ValueError(f"a {self.kind!r} HM floor takes no value")

    @classmethod
    def parse(cls, text: str) -> HmFloor:
        """Parse a CLI value; raises ValueError naming the accepted forms."""
        cleaned = text.strip().lower()
        if cleaned in ("significant", "baseline"):
            return cls(cleaned)  # type: ignore[arg-type]
        percent = _PERCENT.match(cleaned)
        if percent:
            sign, magnitude = percent.groups()
            if not sign:
                raise ValueError(
                    f"HM floor {text!r} is ambiguous: give a relative change a sign; accepted: {_ACCEPTED}"
                )
            return cls("relative", (-1.0 if sign == "-" else 1.0) * float(magnitude) / 100)
        try:
            absolute = float(cleaned)
        except ValueError:
            raise ValueError(f"cannot read HM floor {text!r}; accepted: {_ACCEPTED}") from None
        return cls("absolute", absolute)

    def resolve(self, baseline_hm: float) -> float:
        """The floor as an HM value, given the uncalibrated model's HM on the tuning set."""
        if self.kind == "absolute":
            return self.value
        if self.kind == "relative":
            return baseline_hm * (1 + self.value)
        return baseline_hm

    @property
    def conservative(self) -> bool:
        """Whether the floor is cleared by the lower end of the HM's interval rather than its point estimate."""
        return self.kind == "significant"

    def __str__(self) -> str:
        """The CLI form, so a logged floor can be passed back to `parse`."""
        if self.kind == "absolute":
            return f"{self.value:g}"
        if self.kind == "relative":
            return f"{self.value * 100:+g}%"
        return self.kind


@dataclass(frozen=True)
class Constraints:
    """What a trial must respect to win, as named Optuna constraint values (≤ 0 satisfied).

    hm_floor        the HM floor on the 0–1 scale (`HmFloor.resolve`); `conservative`: compare the lower
                    end of the trial's HM interval with it, not its point estimate
    max_ndcg_drop   how far aggregate nDCG@10 may fall below the uncalibrated model's (0–1 scale; 0: not at
                    all, the default; None: unconstrained): on the tuning split by its point estimate
                    (`ndcg_drop`), and on each other tuning structure by the favourable end of its 95% interval
                    (`structure_ndcg`: no structure may lose nDCG@10 significantly beyond the allowance)
    max_general_drop  the same for a general-retrieval set, when one is checked (None: not constrained)
    max_crops_psi   PSI on the tuning set's crops (its passages re-cut shorter) may be at most this multiple
                    of the uncalibrated model's PSI there (1: no less fair than no calibration; None:
                    unconstrained, the default). A config that flattens full passages by over-weighting their
                    end reverses the bias on shorter ones; this is where that would show. Off by default: the
                    crops are scored as a structure anyway, under the reversal and nDCG@10 constraints.
    max_reversal    how far a trial may turn the bias round on any tuning structure, as the largest tilt
                    against the uncalibrated model's direction there (`objectives.robustness`; 0: the end may
                    not become favoured where the beginning was, the default; None: unconstrained)
    max_drift       how far a trial may move the document vectors from the uncalibrated ones, as a multiple of
                    the paper default's drift on the same structure (`RobustEvidence.drift_ratio`; None:
                    unconstrained). Queries stay uncalibrated, so a config that re-embeds the passages far more
                    than the paper's own setting does wins on the tuning passages by more than a re-weighting of
                    positions, and loses it on passages built otherwise (docs/concepts.md).
    """

    hm_floor: float
    conservative: bool = True
    max_ndcg_drop: float | None = 0.0
    max_general_drop: float | None = None
    max_crops_psi: float | None = None
    max_reversal: float | None = 0.0
    max_drift: float | None = None

    def __post_init__(self) -> None:
        if self.max_crops_psi is not None and not (math.isfinite(self.max_crops_psi) and self.max_crops_psi >= 0):
            raise ValueError(
                "max_crops_psi must be a multiple >= 0 of the uncalibrated crops PSI (1 = no worse), "
                f"got {self.max_crops_psi}"
            )
        if self.max_reversal is not None and not (math.isfinite(self.max_reversal) and self.max_reversal >= 0):
            raise ValueError(
                f"max_reversal must be a tilt allowance >= 0 (0: no reversed bias), got {self.max_reversal}"
            )
        if self.max_drift is not None and not (math.isfinite(self.max_drift) and self.max_drift > 0):
            raise ValueError(
                f"max_drift must be a multiple > 0 of the paper default's drift (2: twice as far), got {self.max_drift}"
            )
        for name in ("max_ndcg_drop", "max_general_drop"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(
                    f"{name} must be a drop allowance >= 0 on the 0–1 scale (0.005 = half a point), got {value}"
                )

    def values(
        self,
        hm: float | None,
        hm_low: float | None,
        ndcg_delta: float | None,
        general_delta: float | None = None,
        crops_psi: tuple[float, float] | None = None,
        reversal: float | None = None,
        partial: bool = False,
        structure_ndcg_loss: float | None = None,
        drift_ratio: float | None = None,
    ) -> dict[str, float]:
        """Named constraint values for one trial: `hm` and `hm_low` (the lower end of its 95% interval) on the
        tuning split, `ndcg_delta` its aggregate nDCG@10 minus the uncalibrated one, `general_delta` the same
        on the general set, `crops_psi` (trial, uncalibrated) PSI on the crops when they are scored,
        `reversal` the largest reversal of the bias over the tuning structures (`RobustEvidence.reversal`;
        None where no structure knows its positions), `structure_ndcg_loss` the largest significant nDCG@10
        loss over the other structures (`RobustEvidence.significant_ndcg_loss`; None: none scored), `drift_ratio`
        the largest drift over the structures as a multiple of the paper default's (`RobustEvidence.drift_ratio`;
        None: no reference to compare with). `partial`: a trial stopped before every set was
        scored, so a constraint on a set it never reached is left out (the tuning split's: `hm` None)."""
        values: dict[str, float] = {}
        if hm is None or hm_low is None or ndcg_delta is None:
            if not partial:
                raise ValueError("a complete trial's constraints need its HM and nDCG@10 on the tuning split")
        else:
            values["hm_floor"] = self.hm_floor - (hm_low if self.conservative else hm)
            if self.max_ndcg_drop is not None:
                values["ndcg_drop"] = -ndcg_delta - self.max_ndcg_drop
        if self.max_general_drop is not None and not (partial and general_delta is None):
            if general_delta is None:
                raise ValueError("a general-retrieval allowance needs the trial's general nDCG@10 change")
            values["general_drop"] = -general_delta - self.max_general_drop
        if self.max_crops_psi is not None and crops_psi is not None:
            trial_psi, baseline_psi = crops_psi
            values["crops_psi"] = trial_psi - self.max_crops_psi * baseline_psi
        if self.max_reversal is not None and reversal is not None:
            values["reversal"] = reversal
        if self.max_ndcg_drop is not None and structure_ndcg_loss is not None:
            values["structure_ndcg"] = structure_ndcg_loss - self.max_ndcg_drop
        if self.max_drift is not None and drift_ratio is not None:
            values["drift"] = drift_ratio - self.max_drift
        return values

    def in_force(self, structures: bool = True, crops: bool = False, general: bool = False) -> tuple[str, ...]:
        """The constraints a study with these limits checks, in `CONSTRAINTS` order: `structures`, whether the
        tuning passages are scored in other structures too (else the structures' nDCG@10 limit has nothing to
        check); `crops`, whether one of them is the crops; `general`, whether a general set is scored. The
        reversal and drift are checked on the tuning passages even alone."""
        on = {
            "hm_floor": True,
            "ndcg_drop": self.max_ndcg_drop is not None,
            "structure_ndcg": self.max_ndcg_drop is not None and structures,
            "reversal": self.max_reversal is not None,
            "drift": self.max_drift is not None,
            "crops_psi": self.max_crops_psi is not None and crops,
            "general_drop": self.max_general_drop is not None and general,
        }
        return tuple(r.name for r in CONSTRAINTS if on[r.name])

    def rule(self, name: str) -> str:
        """What constraint `name` asks of a trial under these limits, with their values (the study's rule)."""
        title = REQUIREMENTS[name].title
        if name == "hm_floor":
            compared = "the lower end of HM's 95% paired-bootstrap interval" if self.conservative else "HM"
            return f"{title}: {compared} must reach {100 * self.hm_floor:.2f}"
        if name == "ndcg_drop":
            return f"{title}: aggregate nDCG@10 on the tuning passages may fall {self._allowed(self.max_ndcg_drop)}"
        if name == "structure_ndcg":
            return (
                f"{title}: on every other tuning structure the favourable end of the 95% interval of nDCG@10's change "
                f"must be at least {_points(-(self.max_ndcg_drop or 0.0))} points "
                f"(no loss beyond noise{' and the allowance' if self.max_ndcg_drop else ''})"
            )
        if name == "reversal":
            limit = (
                f"by more than {100 * (self.max_reversal or 0.0):.2f} tilt points" if self.max_reversal else "at all"
            )
            return (
                f"{title}: no tuning structure's bias may be reversed {limit} (its favoured end changing sides; "
                "a structure where the uncalibrated model favours neither end beyond noise has none to reverse)"
            )
        if name == "drift":
            return (
                f"{title}: on every tuning structure the document vectors may move at most {self.max_drift:g} times "
                "as far from the uncalibrated ones as the paper default's (trial 1) do"
            )
        if name == "crops_psi":
            return f"{title}: PSI on the crops may be at most {self.max_crops_psi:g} times the uncalibrated PSI there"
        return f"{title}: nDCG@10 on the general-retrieval set may fall {self._allowed(self.max_general_drop)}"

    @staticmethod
    def _allowed(allowance: float | None) -> str:
        allowance = allowance or 0.0
        return (
            "no lower than the uncalibrated model's"
            if allowance == 0
            else f"at most {100 * allowance:.2f} points below the uncalibrated model's"
        )

    def clause(self, name: str, value: float, where: str | None = None) -> str:
        """How a trial met or missed constraint `name` (its Optuna value `value`, > 0 missed), with the figures
        compared and the structure that decided it (`where`; for a met constraint the one that came closest):
        'the drift limit met (closest: crops, 1.43× the paper default's drift, ≤ 2×)', 'reverses the bias
        (openings: 1.20 tilt points the other way, 0.00 allowed)'. Every figure is read back from the value and
        these limits, so the words cannot disagree with the value."""
        met = value <= 0
        requirement = REQUIREMENTS[name]
        place = (f"closest: {where}, " if met else f"{where}: ") if where else ""
        if name == "hm_floor":
            compared = "HM lower bound" if self.conservative else "HM"
            figures = f"{compared} {100 * (self.hm_floor - value):.2f} {'≥' if met else '<'} {100 * self.hm_floor:.2f}"
        elif name in ("ndcg_drop", "general_drop"):
            allowance = (self.max_ndcg_drop if name == "ndcg_drop" else self.max_general_drop) or 0.0
            what = "nDCG@10" if name == "ndcg_drop" else "general nDCG@10"
            figures = (
                f"{what} {_points(-(value + allowance))} vs uncalibrated, "
                f"{'≥' if met else '<'} {_points(-allowance)} allowed"
            )
        elif name == "structure_ndcg":
            allowance = self.max_ndcg_drop or 0.0
            figures = (
                f"{place}nDCG@10 change at best {_points(-(value + allowance))}, "
                f"{'≥' if met else '<'} {_points(-allowance)} allowed"
            )
        elif name == "reversal":
            allowance = self.max_reversal or 0.0
            if met and where == NO_DIRECTION:
                figures = "no tuning structure favours one end beyond noise uncalibrated: none to reverse"
            elif met:
                figures = (
                    f"{place}{100 * -value:.2f} tilt points short of {'reversing' if allowance == 0 else 'the limit'}"
                )
            else:
                figures = (
                    f"{place}{100 * (value + allowance):.2f} tilt points the other way, {100 * allowance:.2f} allowed"
                )
        elif name == "drift":
            limit = self.max_drift or 0.0
            figures = f"{place}{value + limit:.2f}× the paper default's drift, {'≤' if met else '>'} {limit:g}×"
        elif name == "crops_psi":
            figures = (
                f"crops PSI {abs(value):.3f} {'under' if met else 'over'} "
                f"{self.max_crops_psi:g}× the uncalibrated PSI there"
            )
        else:
            raise KeyError(f"unknown constraint {name!r}")
        return f"{requirement.title + ' met' if met else requirement.missed} ({figures})"

    def clauses(self, values: Mapping[str, float], where: Mapping[str, str] | None = None) -> list[str]:
        """`clause` for every constraint in `values`, the missed ones first, each group in `CONSTRAINTS` order."""
        names = _ordered(values)
        missed = [n for n in names if values[n] > 0]
        return [
            self.clause(n, values[n], (where or {}).get(n)) for n in [*missed, *(n for n in names if n not in missed)]
        ]

    def explain(self, values: Mapping[str, float], where: Mapping[str, str] | None = None) -> str:
        """A trial's feasibility in one sentence: 'feasible: the HM floor met (…); …' or 'infeasible: reverses
        the bias (…); the HM floor met (…); …': every constraint checked, how it was met or missed."""
        verdict = "infeasible" if missed_names(values) else "feasible"
        return f"{verdict}: {'; '.join(self.clauses(values, where))}"


# --- the constraints in words ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """One constraint as users read it. Every sentence about a constraint (the experiment's and the study's
    rule, a trial's feasibility, a pruned trial's reason, λ bisection's note, the nothing-feasible message) is
    built from these, so one constraint is named one way everywhere.

    name     Optuna's constraint name (`Constraints.values`)
    title    what a sentence calls it ("the drift limit")
    option   the option that sets or lifts it
    rule     what it asks of a trial, whatever the study's limits (the MLflow experiment's description)
    missed   the outcome of a trial that misses it, a verb phrase: one wording wherever it is said
    """

    name: str
    title: str
    option: str
    rule: str
    missed: str


CONSTRAINTS: tuple[Requirement, ...] = (
    Requirement(
        "hm_floor",
        "the HM floor",
        "--hm-floor",
        "HM must clear the HM floor (by default the lower end of its 95% paired-bootstrap interval must reach the "
        "uncalibrated HM: a gain beyond noise)",
        "misses the HM floor",
    ),
    Requirement(
        "ndcg_drop",
        "the tuning passages' nDCG@10 limit",
        "--max-ndcg-drop",
        "aggregate nDCG@10 on the tuning passages may not fall below the uncalibrated model's by more than the "
        "allowance (by default not at all)",
        "loses nDCG@10 on the tuning passages",
    ),
    Requirement(
        "structure_ndcg",
        "the other structures' nDCG@10 limit",
        "--max-ndcg-drop",
        "nor on any other tuning structure beyond its noise (even the favourable end of the 95% interval of its "
        "change a loss beyond the allowance)",
        "loses nDCG@10 beyond noise on another structure",
    ),
    Requirement(
        "reversal",
        "the no-reversal rule",
        "--max-reversal",
        "no tuning structure's bias may be reversed (its tilt along the passage turned against the uncalibrated "
        "model's direction there, where that direction is beyond noise)",
        "reverses the bias",
    ),
    Requirement(
        "drift",
        "the drift limit",
        "--max-drift",
        "on every tuning structure the document vectors may move from the uncalibrated ones at most --max-drift "
        "times as far as the paper default's (trial 1) do (by default twice)",
        "is over the drift limit",
    ),
    Requirement(
        "crops_psi",
        "the crops PSI limit",
        "--max-crops-psi",
        "PSI on the crops may be at most --max-crops-psi times the uncalibrated PSI there (off by default)",
        "is less fair on the crops than the crops PSI limit allows",
    ),
    Requirement(
        "general_drop",
        "the general nDCG@10 limit",
        "--max-general-drop",
        "nDCG@10 on the general-retrieval set may fall at most --max-general-drop below the uncalibrated model's "
        "(only with --general and --max-general-drop)",
        "loses general nDCG@10 beyond the general nDCG@10 limit",
    ),
)
REQUIREMENTS: dict[str, Requirement] = {r.name: r for r in CONSTRAINTS}


def describe_aim(pareto: bool, structures: bool) -> str:
    """What a study optimises: 'minimise the worst PSI over the tuning structures' (`structures`: the tuning passages
    are scored in other structures too), and with `pareto` HM as a second objective."""
    psi = "the worst PSI over the tuning structures" if structures else "PSI on the tuning passages"
    return f"minimise {psi} and maximise HM (Pareto front)" if pareto else f"minimise {psi}"


def describe_rule(constraints: Constraints, checked: Sequence[str], pareto: bool, structures: bool) -> str:
    """A study's rule in one sentence: its aim (`describe_aim`) subject to each constraint in `checked` (those in
    force, `Constraints.in_force`), with its limit (`Constraints.rule`)."""
    return f"{describe_aim(pareto, structures)} subject to " + "; ".join(constraints.rule(name) for name in checked)


def missed_names(values: Mapping[str, float]) -> list[str]:
    """The constraints `values` (Optuna's: > 0 missed) misses, in `CONSTRAINTS` order."""
    return [r.name for r in CONSTRAINTS if values.get(r.name, 0.0) > 0]


def outcome(names: Iterable[str]) -> str:
    """What missing `names` means, in their one wording each: 'reverses the bias and is over the drift limit'."""
    phrases = [REQUIREMENTS[name].missed for name in _ordered(names)]
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]


def _ordered(names: Iterable[str]) -> list[str]:
    given = set(names)
    return [r.name for r in CONSTRAINTS if r.name in given]


def _points(value: float) -> str:
    """A signed change in points (x100) without a negative zero: +0.00, −0.40."""
    return f"{100 * value + 0.0:+.2f}"
