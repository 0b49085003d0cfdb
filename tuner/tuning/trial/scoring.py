"""Scoring one trial rung by rung: the pooled screen, the tuning passages, the other structures, pruning between.

A trial is scored first on a pooled screen of the tuning split where one pays (`tuner.evaluation.pools`), then on
the tuning passages as they are and in other structures (`corpus_rungs`), then on the sets scored from the tuning
vectors. Between rungs a trial that can no longer be selected (worse beyond noise than the selection threshold of
the complete trials, or missing a constraint beyond noise) is pruned: the remaining structures are not encoded.
On the screen, whose PSI bounds nothing, a trial is compared with the complete trials' screen PSI instead; its HM
and nDCG@10 bound the corpus's from above, so a constraint missed there beyond noise is missed. Reference trials
are never pruned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import optuna

from objectives import Constraints, PerQuery, PositionReport
from objectives.constraint import REQUIREMENTS, missed_names
from objectives.evidence import TrialEvidence, trial_evidence
from objectives.robustness import (
    RobustEvidence,
    StructureEvidence,
    certain_violations,
    prune_reason,
    screen_prune_reason,
)
from tuner.calibration import CalibrationConfig
from tuner.common.trials import PRUNED_ATTR, SCREEN_ATTR, PrunedAt, ScreenFigures
from tuner.data import is_crops
from tuner.evaluation.evaluator import Evaluation, Evaluator
from tuner.tuning.candidates import screen_threshold, selection_threshold
from tuner.tuning.trial.drift_yardstick import DriftYardstick


@dataclass
class SideSet:
    """A set scored with every trial's config beside the tuning split, with its uncalibrated scores measured
    once: general retrieval (a constraint with `Constraints.max_general_drop`, otherwise a reported figure)
    or one of the tuning passages' other structures (a rung of every trial). A set over the tuning corpus
    itself (`shares`: the tuning evaluator, e.g. a length half) scores the tuning vectors, encoding nothing."""

    evaluator: Evaluator
    shares: Evaluator | None = None
    baseline: Evaluation = field(init=False)

    def __post_init__(self) -> None:
        self.baseline = self.run(None)

    def run(self, config: CalibrationConfig | None) -> Evaluation:
        if self.shares is None:
            return self.evaluator.run(config)
        return self.evaluator.run_over(self.shares, config)  # the trial's own vectors, already encoded

    @property
    def name(self) -> str:
        return self.evaluator.dataset.name

    @property
    def report(self) -> PositionReport:
        return self.baseline.report


@dataclass(frozen=True)
class Scored:
    """What the rungs a trial ran gave: the tuning split's evaluation and evidence, every structure's, the cost."""

    tuning: Evaluation | None  # None: pruned before the tuning passages were scored
    evidence: TrialEvidence | None
    robust: RobustEvidence
    crops: PositionReport | None
    layer_tokens: int
    pruned: str | None = None  # why the trial stopped before its last rung
    screen: TrialEvidence | None = None  # on the pooled screen, where the study has one
    steps: tuple[float, ...] = ()  # after each rung: the screen's PSI, then the worst PSI over the structures so far

    @property
    def on_screen(self) -> bool:
        """Whether the trial stopped on the pooled screen (its evidence is the screen's)."""
        return self.screen is not None and self.evidence is self.screen


@dataclass
class _SoFar:
    """What a trial's rungs have measured so far."""

    spent: int = 0
    screen: TrialEvidence | None = None
    steps: list[float] = field(default_factory=list)
    tuning: Evaluation | None = None
    evidence: TrialEvidence | None = None
    crops: PositionReport | None = None
    seen: list[StructureEvidence] = field(default_factory=list)

    @property
    def robust(self) -> RobustEvidence:
        return RobustEvidence(tuple(self.seen))

    def scored(self, pruned: str | None = None) -> Scored:
        return Scored(
            self.tuning, self.evidence, self.robust, self.crops, self.spent, pruned, self.screen, tuple(self.steps)
        )


class TrialScoring:
    """Scores a trial's config on the study's rungs against the uncalibrated model, and judges what it measured
    against `constraints` (the drift limit through `yardstick`)."""

    def __init__(
        self,
        evaluator: Evaluator,
        constraints: Constraints,
        yardstick: DriftYardstick,
        *,
        general: SideSet | None = None,
        structures: Sequence[SideSet] = (),
        screen: SideSet | None = None,
        selection: str = "one-se",
        prune: bool = True,
    ) -> None:
        self.evaluator = evaluator
        self.constraints = constraints
        self.yardstick = yardstick
        self.general = general
        self.screen = screen
        self.selection = selection
        self.prune = prune
        self.structures = list(structures)
        self._baseline: Evaluation | None = None
        self.rungs = corpus_rungs(evaluator, self.baseline_report(), self.structures)

    def setup_layer_tokens(self) -> int:
        """What this process encoded before its first trial: the uncalibrated passes over the tuning corpus and
        every side set (recording the layer inputs trials resume from) and the queries; nothing loaded from the
        disk cache. Call it before any trial, which would add its own passes to the same counters."""
        self.baseline()
        sides = [s for s in [self.general, self.screen, *self.structures] if s is not None]
        return self.evaluator.counts.layer_tokens + sum(s.evaluator.counts.layer_tokens for s in sides)

    def baseline(self) -> PerQuery:
        """The uncalibrated model's per-query scores on the tuning split (measured once)."""
        return self._baseline_run().per_query

    def baseline_report(self) -> PositionReport:
        """The uncalibrated model's figures on the tuning split (measured once)."""
        return self._baseline_run().report

    def _baseline_run(self) -> Evaluation:
        if self._baseline is None:
            self._baseline = self.evaluator.run(None)
        return self._baseline

    @property
    def rung_count(self) -> int:
        """The rungs of a trial: the screen (if the study has one) and the corpus rungs."""
        return int(self.screen is not None) + len(self.rungs)

    def score(self, trial: optuna.Trial, config: CalibrationConfig, reference: bool) -> Scored:
        """The rungs: the screen, then the tuning passages and each structure (`self.rungs`), stopping early when
        the trial cannot win (a `reference` trial never stops early).

        Every trial's bootstrap draws the same query resamples (`trial_evidence`'s fixed seed: common random
        numbers), so one config is judged alike whatever its trial number or the study's seed: resamples seeded
        per trial could make a config infeasible in one study and the winner of another."""
        prune = self.prune and not reference
        so_far = _SoFar()
        if self.screen is not None and (stopped := self._screen_rung(trial, config, so_far, prune)) is not None:
            return stopped
        for step, rung in enumerate(self.rungs):
            if so_far.seen and prune and (reason := self._prune_before(trial, step, so_far)) is not None:
                return so_far.scored(reason)
            self._run_rung(rung, config, so_far)
            so_far.steps.append(so_far.robust.objective)
        assert so_far.tuning is not None and so_far.evidence is not None  # the tuning split is one of the rungs
        return so_far.scored()

    def _screen_rung(
        self, trial: optuna.Trial, config: CalibrationConfig, so_far: _SoFar, prune: bool
    ) -> Scored | None:
        """Score the pooled screen; the trial as it stops there when it cannot pass it, else None."""
        assert self.screen is not None
        pooled = self.screen.run(config)
        so_far.spent += pooled.layer_tokens
        screen = so_far.screen = trial_evidence(self.screen.baseline.per_query, pooled.per_query)
        trial.set_user_attr(SCREEN_ATTR, ScreenFigures(screen.objective, screen.objective_se, screen.hm).to_attr())
        so_far.steps.append(screen.objective)
        if not prune:
            return None
        certain = [REQUIREMENTS[name].missed for name in self.certain_violations(screen)]
        reason = screen_prune_reason(screen, screen_threshold(trial.study), certain)
        if reason is None:
            return None
        trial.set_user_attr(PRUNED_ATTR, PrunedAt(0, self.rung_count, reason, (self.screen.name,)).to_attr())
        alone = RobustEvidence((StructureEvidence(self.screen.name, screen),))
        return Scored(
            pooled, screen, alone, None, so_far.spent, pruned=reason, screen=screen, steps=tuple(so_far.steps)
        )

    def _prune_before(self, trial: optuna.Trial, step: int, so_far: _SoFar) -> str | None:
        """Why the trial stops before corpus rung `step` (recorded on the trial), or None to go on."""
        robust = so_far.robust
        values = self.constraint_values(so_far.evidence, robust, so_far.crops, partial=True)
        where = robust.deciding(self.yardstick.of(robust))
        reason = prune_reason(
            robust,
            selection_threshold(trial.study, self.selection),
            [self.constraints.clause(name, values[name], where.get(name)) for name in missed_names(values)],
            [self._rung_name(r) for r in self.rungs[step:]],
        )
        if reason is not None:
            first = int(self.screen is not None)  # the corpus rungs' first index
            scored = tuple(s.name for s in so_far.seen)
            trial.set_user_attr(PRUNED_ATTR, PrunedAt(first + step - 1, self.rung_count, reason, scored).to_attr())
        return reason

    def _run_rung(self, rung: SideSet | None, config: CalibrationConfig, so_far: _SoFar) -> None:
        """Score one corpus rung (None: the tuning passages) into `so_far`."""
        if rung is None:
            tuning = so_far.tuning = self.evaluator.run(config)
            report = tuning.report
            if report.hm is None or report.psi is None or not (math.isfinite(report.hm) and math.isfinite(report.psi)):
                raise ValueError(f"metrics are not finite (HM {report.hm}, PSI {report.psi})")
            evidence = so_far.evidence = trial_evidence(self.baseline(), tuning.per_query)
            so_far.spent += tuning.layer_tokens
            so_far.seen.append(
                StructureEvidence(self.evaluator.dataset.name, evidence, tuning=True, drift=tuning.drift)
            )
            return
        result = rung.run(config)
        so_far.spent += result.layer_tokens
        so_far.seen.append(
            StructureEvidence(rung.name, trial_evidence(rung.baseline.per_query, result.per_query), drift=result.drift)
        )
        if is_crops(rung.evaluator.dataset):
            so_far.crops = result.report

    def _rung_name(self, rung: SideSet | None) -> str:
        return self.evaluator.dataset.name if rung is None else rung.name

    def general_delta(self, config: CalibrationConfig) -> float | None:
        """The change in nDCG@10 on the general set (None without one)."""
        if self.general is None:
            return None
        return self.general.run(config).report.ndcg10 - self.general.report.ndcg10

    def certain_violations(self, screen: TrialEvidence) -> dict[str, float]:
        """Constraints the pooled screen shows missed beyond noise: only those its scores bound (not the reversal)."""
        return certain_violations(screen, self.constraints.hm_floor, self.constraints.max_ndcg_drop)

    def constraints_of(self, scored: Scored, general_delta: float | None = None) -> dict[str, float]:
        """The named constraint values (≤ 0 met) from what the trial's rungs measured (all of them, unless pruned)."""
        return self.constraint_values(
            scored.evidence, scored.robust, scored.crops, general_delta, partial=scored.pruned is not None
        )

    def pruned_constraints(self, scored: Scored) -> dict[str, float]:
        """A pruned trial's constraint values so far: between corpus rungs the violation that pruned it is among
        them; on the screen they are the pool's own, with the constraints it shows missed beyond noise."""
        constraints = self.constraints_of(scored)
        if scored.on_screen and scored.evidence is not None:
            constraints |= self.certain_violations(scored.evidence)
        return constraints

    def constraint_values(
        self,
        evidence: TrialEvidence | None,
        robust: RobustEvidence,
        crops: PositionReport | None,
        general_delta: float | None = None,
        partial: bool = False,
    ) -> dict[str, float]:
        """The constraint values of what is scored so far. Between the corpus rungs each is already final or can
        only grow: the HM floor and the nDCG@10 drop are the tuning split's, complete after its rung; the reversal
        and the significant nDCG@10 loss are the largest over the structures; the crops' PSI is final once they
        are scored. So a value > 0 there decides that the trial is infeasible, whatever its remaining rungs
        measure: it is pruned on it. Before the tuning split is scored (`evidence` None) its constraints are left
        out."""
        baseline = next((s.report for s in self.structures if is_crops(s.evaluator.dataset)), None)
        crops_psi = (crops.psi, baseline.psi) if crops is not None and baseline is not None else None
        reference = self.yardstick.of(robust)
        return self.constraints.values(
            evidence.hm if evidence else None,
            evidence.hm_low if evidence else None,
            evidence.ndcg_delta if evidence else None,
            general_delta,
            crops_psi,  # type: ignore[arg-type]
            reversal=robust.reversal(self.constraints.max_reversal or 0.0),
            partial=partial,
            structure_ndcg_loss=robust.significant_ndcg_loss(),
            drift_ratio=robust.drift_ratio(reference),
        )


def corpus_rungs(
    tuning: Evaluator, uncalibrated: PositionReport, structures: Sequence[SideSet]
) -> list[SideSet | None]:
    """The order a trial scores its corpora in (None: the tuning passages): those it encodes from the least
    biased (the lowest uncalibrated PSI) to the most, then the sets scored from the tuning vectors (free once
    those are encoded).

    What decides most trials is a constraint, not PSI: a calibration reverses the bias, or costs nDCG@10,
    first where there is least bias to remove, so the least biased structure shows it first and stops the
    trial before the rest is encoded; the most biased one, where a mild config's worst case shows, comes
    last. `benchmarks/rung_order.py` replays stored studies' trials under other orders (docs/search.md,
    *Rungs and pruning*)."""

    def bias(rung: SideSet | None) -> float:
        return (uncalibrated.psi if rung is None else rung.report.psi) or 0.0

    encoded: list[SideSet | None] = [None, *(s for s in structures if s.shares is None)]
    encoded.sort(key=bias)
    return [*encoded, *(s for s in structures if s.shares is not None)]
