"""The constrained objective: minimise PSI while HM stays above a floor.

PSI alone rewards flattening every group down to the worst one (paper, Ethics statement), so the
study treats HM as a hard constraint. Constraint values follow Optuna's `constraints_func`
convention: a value ≤ 0 is satisfied.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from objectives.metrics import PositionReport

_ACCEPTED = (
    "'baseline' (the uncalibrated HM), an absolute HM on the 0–1 scale such as '0.52', "
    "or a signed change relative to the baseline HM such as '-1%' or '+0.5%'"
)
_PERCENT = re.compile(r"^([+-]?)\s*(\d+(?:\.\d*)?|\.\d+)\s*%$")


@dataclass(frozen=True)
class HmFloor:
    """The lowest HM a calibration may reach and still win.

    `kind` 'absolute': `value` is the floor on the 0–1 scale. 'relative': `value` is a fraction of the
    baseline HM (-0.01 for '-1%'), so the floor is baseline × (1 + value). 'baseline': the floor is the
    uncalibrated HM itself (the default: calibrate only if HM does not get worse).

    Absolute floors are always on the 0–1 scale: '52' is rejected rather than guessed to mean 0.52.
    """

    kind: Literal["baseline", "absolute", "relative"] = "baseline"
    value: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("baseline", "absolute", "relative"):
            raise ValueError(f"unknown HM floor kind {self.kind!r}; accepted: {_ACCEPTED}")
        if self.kind == "absolute" and not 0 <= self.value <= 1:
            hint = f" (for {self.value:g} points write {self.value / 100:g})" if 1 < self.value <= 100 else ""
            raise ValueError(f"HM floor {self.value:g} is not on the 0–1 scale{hint}; accepted: {_ACCEPTED}")
        if self.kind == "relative" and not self.value > -1:
            raise ValueError(f"a relative HM floor of {self.value:+.0%} would allow HM to drop to 0 or below")
        if self.kind == "baseline" and self.value != 0:
            raise ValueError("a 'baseline' HM floor takes no value")

    @classmethod
    def parse(cls, text: str) -> HmFloor:
        """Parse a CLI value; raises ValueError naming the accepted forms."""
        cleaned = text.strip().lower()
        if cleaned == "baseline":
            return cls()
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

    def __str__(self) -> str:
        """The CLI form, so a logged floor can be passed back to `parse`."""
        if self.kind == "absolute":
            return f"{self.value:g}"
        if self.kind == "relative":
            return f"{self.value * 100:+g}%"
        return "baseline"


def constraint_value(hm: float, floor: float) -> float:
    """floor − HM: ≤ 0 when HM reaches the floor."""
    return floor - hm


def constraint_values(
    report: PositionReport,
    floor: float,
    general_delta: float | None = None,
    max_general_drop: float | None = None,
) -> tuple[float, ...]:
    """Optuna constraint values for one trial (each ≤ 0 when satisfied).

    The HM floor always applies. With `max_general_drop` (0–1 scale: 0.005 is half a point) a second
    constraint keeps general-retrieval nDCG@10 from dropping by more than that; `general_delta` is the
    candidate − baseline change in that nDCG@10, and the constraint is its drop minus the allowance.
    """
    if report.hm is None:
        raise ValueError(f"dataset {report.dataset!r} has no position groups, so it has no HM to constrain")
    if (general_delta is None) != (max_general_drop is None):
        raise ValueError("general_delta and max_general_drop go together: give both or neither")
    values = [constraint_value(report.hm, floor)]
    if general_delta is not None and max_general_drop is not None:
        if max_general_drop < 0:
            raise ValueError(f"max_general_drop must be ≥ 0 (a drop allowance), got {max_general_drop}")
        values.append(-general_delta - max_general_drop)
    return tuple(values)


@dataclass(frozen=True)
class Candidate:
    """One finished trial as the winner selection sees it."""

    trial_number: int
    psi: float
    hm: float
    constraints: tuple[float, ...]

    @property
    def feasible(self) -> bool:
        return all(value <= 0 for value in self.constraints)


def pick_winner(candidates: Iterable[Candidate]) -> Candidate | None:
    """The feasible candidate with the lowest PSI, ties to the higher HM, then the earlier trial.

    None when no candidate is feasible: the caller should then keep the model uncalibrated.
    """
    feasible = [c for c in candidates if c.feasible]
    return min(feasible, key=lambda c: (c.psi, -c.hm, c.trial_number), default=None)
