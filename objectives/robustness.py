"""Evidence from several passage structures: the worst case is the objective, a reversed bias a violation.

A calibration tuned on one passage structure can flatten it by over-weighting the end, which then
reverses the bias on passages built otherwise (shorter ones, or more and shorter segments: the paper's
Ethics statement warns of exactly this). So a trial is scored on the tuning passages as they are and in
other structures made from the same passages (`tuner.data.structures`), and

- its **objective** is the worst PSI over those structures (with that structure's bootstrap standard
  error): the edge of the space wins only where it is fairer on every structure;
- its **direction** must hold on every structure: a structure whose tilt has turned to the opposite
  sign of the uncalibrated model's there (the end now favoured where the beginning was) violates the
  `reversal` constraint, whatever PSI says (PSI is blind to the sign);
- its **drift** (how far it moves the document vectors from the uncalibrated ones) is compared structure by
  structure with a reference calibration's (the paper default's): a config that re-embeds the passages
  far more than the paper's own setting does is fitting the tuning passages, not re-weighting positions
  (`drift_ratio`, the `drift` constraint).

Structures double as the rungs of a multi-fidelity trial, the tuning passages among them (in the order
`tuner.tuning.trial.scoring.corpus_rungs` gives): the worst case over the structures seen so far can only
grow, so a trial whose partial worst case is already worse beyond noise than what selection would take is
pruned without scoring the rest (`prune_reason`), and a bias reversed on a cheap structure stops it before
the dear ones are encoded.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from objectives.constraint import NO_DIRECTION
from objectives.evidence import TrialEvidence

PRUNE_Z = 2.0
"""Standard errors an estimate (the pooled screen's figures) must clear its limit by before a trial is pruned on it."""

MARGIN_Z = 1.0
"""Standard errors a partial worst case must clear the selection threshold by. The partial worst case is no
estimate of the final one but a lower bound on it (more structures can only raise it), so the margin is for
the threshold alone: it falls as trials complete, and rises only when a new best has a larger standard error
than the old one (by a few thousandths of PSI between trials on one split), never by a whole standard error."""

DIRECTION_Z = 1.96
"""Standard errors the uncalibrated tilt must clear zero by (its 95% interval) for a structure to have a favoured
end that a calibration could reverse. A model nearly level on a structure (all-mpnet-base-v2 on the openings)
otherwise makes its noise the direction, and every calibration that tips it the other way a reversal."""


@dataclass(frozen=True)
class StructureEvidence:
    """One structure's evidence for a trial: its PSI with standard error and its tilt beside the uncalibrated tilt."""

    name: str
    evidence: TrialEvidence
    tuning: bool = False  # the tuning passages as they are (whose HM and nDCG@10 have constraints of their own)
    drift: float = 0.0  # mean 1 − cosine of the trial's document vectors to the uncalibrated ones here

    @property
    def reversal(self) -> float | None:
        """The tilt measured against the uncalibrated model's direction there: > 0 means the favoured end
        has changed sides (over-correction), ≤ 0 that the bias kept its sign or is gone. None without positions,
        and where the uncalibrated model favours neither end beyond noise: there is no direction to reverse, and
        a tilt the calibration brings is unevenness that PSI measures."""
        tilt, baseline = self.evidence.tilt, self.evidence.baseline_tilt
        if tilt is None or baseline is None or abs(baseline) < DIRECTION_Z * self.evidence.baseline_tilt_se:
            return None
        natural = -1.0 if baseline <= 0 else 1.0  # the uncalibrated bias: negative tilt = beginning favoured
        return -natural * tilt


@dataclass(frozen=True)
class RobustEvidence:
    """A trial's evidence over every structure scored so far, in the order scored."""

    structures: tuple[StructureEvidence, ...]

    def __post_init__(self) -> None:
        if not self.structures:
            raise ValueError("robust evidence needs at least one structure")

    @property
    def worst(self) -> StructureEvidence:
        """The structure with the highest PSI (ties: the earlier one): it sets the objective."""
        return max(self.structures, key=lambda s: (s.evidence.objective, -self.structures.index(s)))

    @property
    def objective(self) -> float:
        return self.worst.evidence.objective

    @property
    def objective_se(self) -> float:
        return self.worst.evidence.objective_se

    @property
    def objective_resamples(self) -> np.ndarray | None:
        """The worst case resample by resample: on each common resample, the highest PSI over the structures
        (None when a structure has no resamples). Paired with another trial's, it gives the noise between the two."""
        rows = [s.evidence.psi_resamples for s in self.structures]
        if any(row is None for row in rows):
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a resample undefined on every structure stays NaN
            return np.nanmax(np.vstack(rows), axis=0)  # type: ignore[arg-type]

    def reversal(self, allowance: float = 0.0, z: float = 0.0) -> float | None:
        """The `reversal` constraint value (≤ 0 met): the largest reversal over the structures, less `z`
        of its standard errors, over `allowance`; where no structure has a direction to reverse, nothing is
        reversed (0 over `allowance`). None when no structure knows its positions."""
        if not self._placed():
            return None
        known = [(s.reversal - z * s.evidence.tilt_se) for s in self.structures if s.reversal is not None]
        return (max(known) if known else 0.0) - allowance

    def _placed(self) -> list[StructureEvidence]:
        """The structures whose tilt is known, calibrated and uncalibrated."""
        return [s for s in self.structures if s.evidence.tilt is not None and s.evidence.baseline_tilt is not None]

    def significant_ndcg_loss(self) -> float | None:
        """The largest nDCG@10 loss over the structures beyond the tuning split that their noise cannot explain:
        minus the upper end of each one's 95% interval of the change (> 0: even the favourable end is a loss).
        More structures can only raise it. None when no other structure is scored yet."""
        others = [
            -s.evidence.ndcg_delta_high
            for s in self.structures
            if not s.tuning and math.isfinite(s.evidence.ndcg_delta_high)
        ]
        return max(others) if others else None

    def drifts(self) -> dict[str, float]:
        """name → the trial's drift there: what the paper default's trial is as the drift limit's yardstick, and what
        λ bisection extrapolates from."""
        return {s.name: s.drift for s in self.structures}

    def drift_ratio(self, reference: Mapping[str, float] | None) -> float | None:
        """The largest drift over the structures as a multiple of `reference`'s (structure name → the reference
        calibration's drift there; None: not known yet). A structure the reference did not measure, or where it
        moved nothing, is left out; None when no structure is comparable. More structures can only raise it.
        A trial that moved no vector anywhere (no calibration) is 0 against any reference, known or not."""
        if self.structures and all(s.drift == 0 for s in self.structures):
            return 0.0
        if reference is None:
            return None
        ratios = [s.drift / reference[s.name] for s in self.structures if reference.get(s.name, 0.0) > 0]
        return max(ratios) if ratios else None

    def deciding(self, reference: Mapping[str, float] | None = None) -> dict[str, str]:
        """constraint name → the structure that sets its value (`reversal`, `significant_ndcg_loss`, `drift_ratio`
        against `reference`): where a trial came closest to a limit, or went past it. Missing where undefined."""
        found: dict[str, str] = {}
        reversed_ = [s for s in self.structures if s.reversal is not None]
        if reversed_:
            found["reversal"] = max(reversed_, key=lambda s: s.reversal or 0.0).name
        elif self._placed():
            found["reversal"] = NO_DIRECTION
        others = [s for s in self.structures if not s.tuning and math.isfinite(s.evidence.ndcg_delta_high)]
        if others:
            found["structure_ndcg"] = min(others, key=lambda s: s.evidence.ndcg_delta_high).name
        compared = [s for s in self.structures if reference is not None and reference.get(s.name, 0.0) > 0]
        if compared and reference is not None:
            found["drift"] = max(compared, key=lambda s: s.drift / reference[s.name]).name
        return found

    def per_structure(self) -> dict[str, dict[str, float]]:
        """name → PSI, its standard error, tilt, reversal and drift, for MLflow, the YAML and the console."""
        table = {}
        for s in self.structures:
            row = {
                "psi": s.evidence.objective,
                "psi_se": s.evidence.objective_se,
                "hm": s.evidence.hm,
                "ndcg10_delta": s.evidence.ndcg_delta,
                "ndcg10_delta_high": s.evidence.ndcg_delta_high,
                "drift": s.drift,
            }
            if s.evidence.tilt is not None:
                row["tilt"] = s.evidence.tilt
            if s.reversal is not None:
                row["reversal"] = s.reversal
            table[s.name] = row
        return table


def certain_violations(tuning: TrialEvidence, hm_floor: float, max_ndcg_drop: float | None) -> dict[str, float]:
    """Constraints already missed beyond noise: even the favourable end of the interval misses the limit.

    Values in Optuna's convention (> 0 violated) for the constraints that are: the HM floor against the
    upper end of HM's interval, the nDCG@10 drop against the upper end of its change (None: no limit). These
    are what a pooled screen's scores bound (`screen_prune_reason`); a reversed bias is not among them.
    """
    found = {}
    if math.isfinite(tuning.hm_high) and hm_floor - tuning.hm_high > 0:
        found["hm_floor"] = hm_floor - tuning.hm_high
    if (
        max_ndcg_drop is not None
        and math.isfinite(tuning.ndcg_delta_high)
        and -tuning.ndcg_delta_high - max_ndcg_drop > 0
    ):
        found["ndcg_drop"] = -tuning.ndcg_delta_high - max_ndcg_drop
    return found


def prune_reason(
    robust: RobustEvidence,
    threshold: float | None,
    missed: Sequence[str],
    remaining: Sequence[str],
    z: float = MARGIN_Z,
) -> str | None:
    """Why a trial need not be scored on the `remaining` structures, or None to go on.

    `threshold` is the objective a trial must reach to be eligible under the selection rule, from the
    complete trials so far (None: no feasible complete trial yet, so nothing to compare with). A trial is
    pruned when its partial worst case, less `z` standard errors, is already above that threshold (the
    rest can only raise it; the margin is for the threshold's own movement, `MARGIN_Z`), or when `missed`
    (each constraint the rungs so far have decided is missed, in words: `Constraints.clause`) is not empty:
    its value can only grow (the tuning split's HM and nDCG@10 are complete after its rung, a reversal stays).
    Nothing is pruned once no structure remains: the trial is then complete.
    """
    if not remaining:
        return None
    if missed:
        return "; ".join(missed) + ", which no remaining structure can undo"
    return _beyond_noise(
        robust.objective,
        robust.objective_se,
        threshold,
        (),
        z,
        f"worst-case PSI {robust.objective:.3f} so far (on {robust.worst.name})",
        "the most selection would take",
    )


def screen_prune_reason(
    screen: TrialEvidence, threshold: float | None, missed: Sequence[str], z: float = PRUNE_Z
) -> str | None:
    """Why a trial need not go past the pooled screen, or None to go on.

    The screen's PSI is not a bound on the corpus's, so it is compared with the complete trials' PSI on the
    same screen: `threshold` is the lowest of their screen PSI plus its standard error (None: no feasible
    complete trial yet). A trial is pruned when its screen PSI less `z` standard errors is above it, or when a
    constraint the screen bounds (HM, nDCG@10: a pool only raises them) is missed beyond noise (`missed`: each
    such constraint's outcome in words, `REQUIREMENTS`).
    """
    return _beyond_noise(
        screen.objective,
        screen.objective_se,
        threshold,
        missed,
        z,
        f"PSI on the pooled screen {screen.objective:.3f}",
        "the best complete trial's screen PSI + 1 SE",
        where=" on the pooled screen",
    )


def _beyond_noise(
    value: float,
    se: float,
    threshold: float | None,
    missed: Sequence[str],
    z: float,
    figure: str,
    limit: str,
    where: str = "",
) -> str | None:
    """The reason both rules give: a constraint missed beyond noise, or `value` − `z` SE above `threshold`."""
    if missed:
        return " and ".join(missed) + " beyond noise" + where
    if threshold is not None and math.isfinite(threshold) and value - z * se > threshold:
        return f"{figure} − {z:g} SE = {value - z * se:.3f} is above {threshold:.3f}, {limit}"
    return None
