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
from dataclasses import dataclass
from typing import Literal

_ACCEPTED = (
    "'significant' (HM significantly above the uncalibrated HM: the default), 'baseline' (HM at least the "
    "uncalibrated HM), an absolute HM on the 0–1 scale such as '0.52', or a signed change relative to the "
    "baseline HM such as '-1%' or '+0.5%'"
)
_PERCENT = re.compile(r"^([+-]?)\s*(\d+(?:\.\d*)?|\.\d+)\s*%$")


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
                raise ValueError(f"HM floor {text!r} is ambiguous: give a relative change a sign; accepted: {_ACCEPTED}")
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
                f"max_crops_psi must be a multiple >= 0 of the uncalibrated crops PSI (1 = no worse), got {self.max_crops_psi}"
            )
        if self.max_reversal is not None and not (math.isfinite(self.max_reversal) and self.max_reversal >= 0):
            raise ValueError(f"max_reversal must be a tilt allowance >= 0 (0: no reversed bias), got {self.max_reversal}")
        if self.max_drift is not None and not (math.isfinite(self.max_drift) and self.max_drift > 0):
            raise ValueError(f"max_drift must be a multiple > 0 of the paper default's drift (2: twice as far), got {self.max_drift}")
        for name in ("max_ndcg_drop", "max_general_drop"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a drop allowance >= 0 on the 0–1 scale (0.005 = half a point), got {value}")

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
