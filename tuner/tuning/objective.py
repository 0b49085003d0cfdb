"""One Optuna trial: draw a config, score it rung by rung on the tuning structures, record it, log it.

A trial is scored first on a pooled screen of the tuning split where one pays (`tuner.evaluation.pools`:
a balanced sample of the queries over their relevant and top candidate passages), then on the tuning
passages as they are and in other structures (`tuner.data.load_structures`: crops, openings, packed),
least biased first (`corpus_rungs`; on WikiPos-dev: the crops, packed, the openings, dev), then on the sets
scored from the tuning vectors (length halves). Its objective is the worst
PSI over the structures and its bias must not be reversed on any of them (`objectives.robustness`).
Between rungs a trial that can no longer be selected (worse beyond noise than the selection threshold
of the complete trials, or missing a constraint beyond noise) is pruned: the remaining structures are
not encoded. On the screen, whose PSI bounds nothing, a trial is compared with the complete trials'
screen PSI instead; its HM and nDCG@10 bound the corpus's from above, so a constraint missed there beyond
noise is missed. Reference trials (the baseline, the paper default) are never pruned, and a pruned trial is
never feasible: only a trial scored on every structure can win.

A config the study already ran (the same resolved calibration, or λ 0, which is the baseline) is not
run again: the trial repeats that trial's values, is marked a duplicate and does not count towards
`--trials` (`tuner.common.trials.counted`). A config another process's trial is running is waited for,
and repeated if that trial completes (`TrialObjective._repeat_of`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import socket
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from objectives import Constraints, PerQuery, PositionReport
from objectives.constraint import REQUIREMENTS, missed_names
from objectives.evidence import TrialEvidence, trial_evidence
from objectives.robustness import RobustEvidence, StructureEvidence, certain_violations, prune_reason, screen_prune_reason
from tuner.calibration import CalibrationConfig
from tuner.common.trials import (
    BISECT_ATTR,
    BUDGET_END_ATTR,
    DUPLICATE_ATTR,
    PRUNED_ATTR,
    RESAMPLES_ATTR,
    RESERVED_ATTR,
    SCREEN_ATTR,
    SURPLUS_ATTR,
    calibration_key,
    named_constraints,
    trials_spent,
)
from tuner.data import is_crops
from tuner.engine.encoder import Batches, CalibratedEncoder, ShortDocumentsWarning
from tuner.evaluation.evaluator import Evaluation, Evaluator
from tuner.evaluation.profile import AttentionProfile, plot_profile
from tuner.tracking.runs import Tracker, TrialRecord, describe_config, describe_outcome
from tuner.tuning.bisection import describe_queued, queue_next
from tuner.tuning.optuna_access import set_dashboard_constraints, set_trial_system_attr
from tuner.tuning.search_space import BASELINE_PARAMS, PAPER_DEFAULT_PARAMS, SearchSpace, config_of, grid_points, is_reference_trial
from tuner.tuning.study import best_objective, screen_threshold, selection_threshold, wait_for_other_processes

log = logging.getLogger(__name__)

REPEAT_CHECK_ATTR = "repeat_check"  # "runs" or "waits": what a trial decided about its calibration (`_repeat_of`)
REPEAT_WAIT_SECONDS = 3600.0
"""The longest a trial waits for another process's trial that runs the same calibration
(`TrialObjective._repeat_of`); then it runs the config itself."""
REPEAT_POLL_SECONDS = 2.0


@dataclass(frozen=True)
class _Opened:
    """A trial's MLflow run as `TrialObjective._open` opened it: what every record of its end repeats."""

    number: int
    params: dict[str, object]
    config_text: str  # the config in words (`describe_config`)
    markers: list[str]  # the reference role, if any
    start_ms: int
    run_id: str | None = None  # None while MLflow is unreachable: the run is opened later, from the pending log

    @property
    def label(self) -> str:
        """How its descriptions name the trial: "Trial 3", "Trial 1 (paper default)"."""
        return f"Trial {self.number}" + (f" ({self.markers[0]})" if self.markers else "")

    def ended(
        self, state: str, metrics: dict[str, float], tags: dict[str, str], outcome: str, marker: str | None, artifacts: Sequence[Path] = ()
    ) -> TrialRecord:
        """The run's end: `outcome` follows the label in its description, `marker` joins the run name's markers."""
        return TrialRecord(
            self.number,
            state,
            self.params,
            metrics,
            tags,
            list(artifacts),
            description=f"{self.label}{outcome}",
            markers=[*self.markers, *([marker] if marker else [])],
            start_ms=self.start_ms,
        )


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


class TrialObjective:
    """Minimise the worst PSI over the tuning structures (and, with `pareto`, maximise HM) subject to
    `constraints` (HM floor, aggregate nDCG@10, no reversed bias), pruning between rungs (`prune`).

    Each trial also records what selection needs (`objectives.selection`): the objective's bootstrap
    standard error and the trial's drift from the uncalibrated document vectors.
    """

    repeat_wait_seconds: float = REPEAT_WAIT_SECONDS
    repeat_poll_seconds: float = REPEAT_POLL_SECONDS

    def __init__(
        self,
        evaluator: Evaluator,
        space: SearchSpace,
        constraints: Constraints,
        tracker: Tracker,
        study_name: str,
        staging: Path,
        *,
        pareto: bool = False,
        general: SideSet | None = None,
        structures: list[SideSet] | None = None,
        screen: SideSet | None = None,
        profile_docs: int,
        selection: str = "one-se",
        prune: bool = True,
        bisect: bool = False,
        repeat_limit: int = 0,
    ) -> None:
        self.evaluator = evaluator
        self.space = space
        self.constraints = constraints
        self.tracker = tracker
        self.study_name = study_name
        self.staging = staging
        self.pareto = pareto
        self.general = general
        self.screen = screen
        self.selection = selection
        self.prune = prune and not pareto  # Optuna's pruning reports are single-objective
        self.bisect = bisect  # queue the next λ of an over-correcting trial's family (`tuner.tuning.bisection`)
        self.repeat_limit = repeat_limit  # repeats not counted at most (then the space is as good as exhausted)
        self.budget: int | None = None  # layer-tokens the study's trials may spend (`--budget`, less the baselines): set once priced
        self._baseline: Evaluation | None = None
        self.structures = list(structures or [])
        self.rungs = corpus_rungs(evaluator, self.baseline_report(), self.structures)
        ids = sorted(evaluator.dataset.corpus)
        random.Random(0).shuffle(ids)
        self.profile_texts = [evaluator.dataset.corpus[d] for d in ids[:profile_docs]]
        self._profiled: Batches | None = None
        self._drift_reference: dict[str, float] | None = None  # the paper default's drift per structure, once it is known
        self._own_reference = False  # the trial running is the paper default: the drift limit's yardstick is itself
        self._warned_no_reference = False

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, float]:
        """Draw a config; a repeat of one the study ran tells its values, anything else is scored and logged."""
        model = self.evaluator.model
        config = self.space.suggest(trial, model.spec.pooling, model.spec.padding_side)
        layers = list(config.resolve_layers(model.num_layers))
        params = {
            **{k: round(v, 6) if isinstance(v, float) else v for k, v in trial.params.items()},
            "layers": layers,
            "basket_shares": config.basket_shares,
        }  # a parameter or fixed by the space: logged either way
        trial.set_user_attr("feasible", "not known yet: the trial is running")  # first among its attributes in the dashboard
        trial.set_user_attr("layers", layers)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        key = calibration_key(params)
        trial.set_user_attr("calibration", key)
        repeated = self._repeat_of(trial, key)  # the enqueued references run first, so a later draw of theirs repeats them
        if repeated is not None:
            return self._repeat(trial, repeated, params)
        if self.budget is not None and not reference_markers(trial):
            self._reserve(trial, config)
        opened = self._open(trial, params)
        self._own_reference = opened.markers == ["paper default"]
        if not opened.markers:
            self._await_drift_reference(trial)
        try:
            scored = self._score(trial, config, reference=bool(opened.markers))
            if scored.pruned is not None:
                self._bisect(trial, self._record_pruned(trial, scored, opened), scored, complete=False)
                raise optuna.TrialPruned(scored.pruned)
            metrics, constraints = self._metrics(scored, config)
            artifacts = self._profile(trial.number, config, metrics)
        except optuna.TrialPruned:
            raise
        except (Exception, KeyboardInterrupt) as error:  # an aborted trial's run is closed FAILED too, never left open
            self._record_failure(trial, error, opened)
            raise
        where = scored.robust.deciding(self._drift_yardstick(scored.robust))
        self._record(trial, scored, metrics, constraints, where)
        self._record_complete(trial, opened, metrics, artifacts, scored.robust.worst.name, self.constraints.explain(constraints, where))
        self._bisect(trial, constraints, scored, complete=True)
        assert scored.tuning is not None
        return (scored.robust.objective, scored.tuning.report.hm) if self.pareto else scored.robust.objective  # type: ignore[return-value]

    def _bisect(self, trial: optuna.Trial, constraints: dict[str, float], scored: Scored, complete: bool) -> None:
        """Queue the next λ of the trial's family (`tuner.tuning.bisection`), judged against the best feasible trial
        and, under the drift limit, bounded by the drift the family has measured."""
        if self.bisect:
            best = best_objective(trial.study)
            step, worst = self.space.strength_step, scored.robust.objective
            queue_next(
                trial.study, trial, constraints, complete, step, worst, best, scored.robust.drifts(), self._drift_limits(scored.robust)
            )

    def _drift_yardstick(self, robust: RobustEvidence) -> Mapping[str, float] | None:
        """The paper default's drift per structure (the trial's own when it is the paper default); None while unknown."""
        return robust.drifts() if self._own_reference else self._drift_reference

    def _drift_limits(self, robust: RobustEvidence) -> dict[str, float] | None:
        """The drift allowed per structure: `--max-drift` times the yardstick's; None without the limit or its yardstick."""
        reference = self._drift_yardstick(robust)
        if self.constraints.max_drift is None or reference is None:
            return None
        return {name: self.constraints.max_drift * value for name, value in reference.items() if value > 0}

    def _open(self, trial: optuna.Trial, params: dict[str, object]) -> _Opened:
        """Mark a reference trial's role and open its MLflow run, described as running; what its end repeats."""
        markers = reference_markers(trial)
        if markers:
            trial.set_user_attr("role", markers[0])
        opened = _Opened(trial.number, params, describe_config(params, self.evaluator.model.num_layers), markers, int(time.time() * 1000))
        queued = trial.user_attrs.get(BISECT_ATTR)
        tags = {"posfair.bisect": describe_queued(queued)} if queued else None
        run_id = self.tracker.start_trial(
            self.study_name, trial.number, params, f"{opened.label}, running: {opened.config_text}.", markers, tags
        )
        if run_id:
            trial.set_user_attr("mlflow_run_id", run_id)
        return replace(opened, run_id=run_id)

    def _record_failure(self, trial: optuna.Trial, error: BaseException, opened: _Opened) -> None:
        """A failed or aborted trial says why, in Optuna and in its MLflow run (closed FAILED, never left open)."""
        reason = (
            "aborted: the run was stopped (Ctrl-C or SIGTERM) and the trial queued again"
            if isinstance(error, KeyboardInterrupt)
            else f"{error.__class__.__name__}: {error}"
        )
        trial.set_user_attr("failure_reason", reason)
        trial.set_user_attr("feasible", f"NO: the trial failed ({reason[:300]}); never a candidate")
        self.tracker.finish_trial(
            self.study_name,
            opened.ended("FAIL", {}, {"posfair.failure": reason[:4000]}, f" failed: {opened.config_text}; {reason[:300]}", "failed"),
        )

    def _record_complete(
        self, trial: optuna.Trial, opened: _Opened, metrics: dict[str, float], artifacts: list[Path], worst: str, feasibility: str
    ) -> None:
        """A complete trial's MLflow run: its figures, profile and the sentence that says whether it is feasible
        (`feasibility`, every constraint checked; `worst`: the structure of its worst PSI)."""
        feasible = metrics["feasible"] == 1.0
        self.tracker.finish_trial(
            self.study_name,
            opened.ended(
                "COMPLETE",
                metrics,
                {"posfair.feasible": "yes" if feasible else "no"},
                f": {opened.config_text}: {describe_outcome(metrics, worst, feasibility)}.",
                None if feasible else "infeasible",
                artifacts,
            ),
        )
        if opened.run_id is None and (run_id := self.tracker.trial_run_id(trial.number)):
            trial.set_user_attr("mlflow_run_id", run_id)

    # ---------------------------------------------------------------------------------- budget

    def _reserve(self, trial: optuna.Trial, config: CalibrationConfig) -> None:
        """Reserve what the trial may spend, or end the study here when the budget has no room for it: the
        trial is then pruned unrun (surplus: not counted, no MLflow run) and no trial starts after it. Every
        trial that starts can thus finish; the references (the baseline, the paper default) always run."""
        assert self.budget is not None
        study, needed = trial.study, self.trial_cost(config)
        spent = trials_spent(study, excluding=trial.number)
        if spent + needed <= self.budget:
            trial.set_user_attr(RESERVED_ATTR, needed)
            return
        end = {"trial": trial.number, "trials": self.budget, "spent": spent, "needed": needed}
        study.set_user_attr(BUDGET_END_ATTR, end)
        trial.set_user_attr(SURPLUS_ATTR, True)
        reason = (
            f"the budget is spent: trial {trial.number} would need up to {needed:,} layer-tokens and "
            f"{max(self.budget - spent, 0):,} of the trials' {self.budget:,} are left"
        )
        log.info("%s; no more trials start", reason)
        trial.set_user_attr("feasible", f"NO: not run, {reason}")
        raise optuna.TrialPruned(reason)

    def trial_cost(self, config: CalibrationConfig) -> int:
        """What a trial of `config` spends if no rung prunes it: each corpus it encodes (the screen, the tuning
        passages, the other structures, a general set), those of its batches the config can change, from where
        its pass resumes (`Evaluator.pass_cost`), and the attention profile through every layer. A complete
        trial spends exactly that, a pruned one less."""
        encoded = [
            self.evaluator,
            *(s.evaluator for s in [self.screen, self.general, *self.structures] if s is not None and s.shares is None),
        ]
        return sum(evaluator.pass_cost(config) for evaluator in encoded) + self._profile_cost()

    def depth_costs(self) -> dict[str, int]:
        """What an unpruned trial of each of the space's depths spends at most (with its smallest basket, which
        leaves the fewest batches to copy from the baseline): what the sampler weighs depths by."""
        model, basket = self.evaluator.model, min(self.space.basket_sizes)
        return {
            depth: self.trial_cost(
                config_of(
                    {"strength": 1.0, "depth": depth, "basket_size": basket, "variant": "cls_soft"},
                    "equal",
                    model.spec.pooling,
                    model.spec.padding_side,
                )
            )
            for depth in self.space.depths
        }

    def grid_cost(self, grid: Mapping[str, Sequence[object]]) -> int:
        """What the grid's study spends on its trials here: each distinct config of the grid unpruned (the paper
        default among them) and the baseline trial's profile, as `tune --grid paper` runs them."""
        model = self.evaluator.model
        configs = {}
        for params in grid_points(grid):
            config = config_of(params, "equal", model.spec.pooling, model.spec.padding_side)
            key = {**params, "layers": list(config.resolve_layers(model.num_layers)), "basket_shares": config.basket_shares}
            configs[calibration_key(key)] = config
        return sum(self.trial_cost(config) for config in configs.values()) + self._profile_cost()

    def _profile_cost(self) -> int:
        profile = self._profile_batches()
        return profile.layer_tokens(range(len(profile)), self.evaluator.model.num_layers)

    def _profile_batches(self) -> Batches:
        if self._profiled is None:
            self._profiled = Batches.build(self.evaluator.model, self.profile_texts, self.evaluator.batch_size, self.evaluator.batch_tokens)
        return self._profiled

    # ---------------------------------------------------------------------------------- scoring

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

    def _score(self, trial: optuna.Trial, config: CalibrationConfig, reference: bool) -> Scored:
        """The rungs: the screen, then the tuning passages and each structure (`self.rungs`), stopping early when
        the trial cannot win.

        Every trial's bootstrap draws the same query resamples (`trial_evidence`'s fixed seed: common random
        numbers), so one config is judged alike whatever its trial number or the study's seed: resamples seeded
        per trial could make a config infeasible in one study and the winner of another."""
        first = int(self.screen is not None)  # the corpus rungs' first index
        spent, screen, steps = 0, None, []
        if self.screen is not None:
            pooled = self.screen.run(config)
            spent += pooled.layer_tokens
            screen = trial_evidence(self.screen.baseline.per_query, pooled.per_query)
            trial.set_user_attr(SCREEN_ATTR, {"psi": screen.objective, "psi_se": screen.objective_se, "hm": screen.hm})
            steps.append(screen.objective)
            if self.prune and not reference:
                alone = RobustEvidence((StructureEvidence(self.screen.name, screen),))
                certain = [REQUIREMENTS[name].missed for name in self._certain_violations(screen)]
                reason = screen_prune_reason(screen, screen_threshold(trial.study), certain)
                if reason is not None:
                    trial.set_user_attr(
                        PRUNED_ATTR, {"rung": 0, "of": first + len(self.rungs), "reason": reason, "scored": [self.screen.name]}
                    )
                    return Scored(pooled, screen, alone, None, spent, pruned=reason, screen=screen, steps=tuple(steps))
        tuning: Evaluation | None = None
        evidence: TrialEvidence | None = None
        crops: PositionReport | None = None
        seen: list[StructureEvidence] = []
        for step, rung in enumerate(self.rungs):
            if seen and self.prune and not reference:  # after rung `first + step - 1`, the last one scored
                robust = RobustEvidence(tuple(seen))
                values = self._constraint_values(evidence, robust, crops, partial=True)
                where = robust.deciding(self._drift_yardstick(robust))
                reason = prune_reason(
                    robust,
                    selection_threshold(trial.study, self.selection),
                    [self.constraints.clause(name, values[name], where.get(name)) for name in missed_names(values)],
                    [self._rung_name(r) for r in self.rungs[step:]],
                )
                if reason is not None:
                    record = {"rung": first + step - 1, "of": first + len(self.rungs), "reason": reason, "scored": [s.name for s in seen]}
                    trial.set_user_attr(PRUNED_ATTR, record)
                    return Scored(tuning, evidence, robust, crops, spent, pruned=reason, screen=screen, steps=tuple(steps))
            if rung is None:
                tuning = self.evaluator.run(config)
                report = tuning.report
                if report.hm is None or report.psi is None or not (math.isfinite(report.hm) and math.isfinite(report.psi)):
                    raise ValueError(f"metrics are not finite (HM {report.hm}, PSI {report.psi})")
                evidence = trial_evidence(self.baseline(), tuning.per_query)
                spent += tuning.layer_tokens
                seen.append(StructureEvidence(self.evaluator.dataset.name, evidence, tuning=True, drift=tuning.drift))
            else:
                result = rung.run(config)
                spent += result.layer_tokens
                seen.append(StructureEvidence(rung.name, trial_evidence(rung.baseline.per_query, result.per_query), drift=result.drift))
                if is_crops(rung.evaluator.dataset):
                    crops = result.report
            steps.append(RobustEvidence(tuple(seen)).objective)
        assert tuning is not None and evidence is not None  # the tuning split is one of the rungs
        return Scored(tuning, evidence, RobustEvidence(tuple(seen)), crops, spent, screen=screen, steps=tuple(steps))

    def _rung_name(self, rung: SideSet | None) -> str:
        return self.evaluator.dataset.name if rung is None else rung.name

    def _certain_violations(self, screen: TrialEvidence) -> dict[str, float]:
        """Constraints the pooled screen shows missed beyond noise: only those its scores bound (not the reversal)."""
        return certain_violations(screen, self.constraints.hm_floor, self.constraints.max_ndcg_drop)

    def _constraints(self, scored: Scored, general_delta: float | None = None) -> dict[str, float]:
        """The named constraint values (≤ 0 met) from what the trial's rungs measured (all of them, unless pruned)."""
        return self._constraint_values(scored.evidence, scored.robust, scored.crops, general_delta, partial=scored.pruned is not None)

    def _constraint_values(
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
        measure: it is pruned on it. Before the tuning split is scored (`evidence` None) its constraints are left out."""
        baseline = self._crops_baseline()
        crops_psi = (crops.psi, baseline.psi) if crops is not None and baseline is not None else None
        reference = self._drift_yardstick(robust)
        return self.constraints.values(
            evidence.hm if evidence else None,
            evidence.hm_low if evidence else None,
            evidence.ndcg_delta if evidence else None,
            general_delta,
            crops_psi,  # type: ignore[arg-type]
            reversal=robust.reversal(self.constraints.max_reversal or 0.0),
            partial=partial,
            structure_ndcg_loss=robust.significant_ndcg_loss(),
            drift_ratio=None if reference is None else robust.drift_ratio(reference),
        )

    def _await_drift_reference(self, trial: optuna.Trial) -> None:
        """Read the paper default's drift per structure, the drift limit's yardstick, from its trial. It is queued
        before any drawn trial, so a drawn trial starts only once it has been taken: another process may still be
        running it, and is waited for as a repeat is. Without it (a space without the paper default, a reference
        that failed and waits to run again) this trial's drift is not limited, and the log says so once."""
        if self.constraints.max_drift is None or self._drift_reference is not None:
            return
        study, deadline = trial.study, time.monotonic() + self.repeat_wait_seconds
        states = (TrialState.COMPLETE, TrialState.RUNNING)
        while True:
            references = [
                t
                for t in study.get_trials(deepcopy=False, states=states)
                if t.number != trial.number and DUPLICATE_ATTR not in t.user_attrs and is_reference_trial(t, PAPER_DEFAULT_PARAMS)
            ]
            done = next((t for t in references if t.state == TrialState.COMPLETE and "structures" in t.user_attrs), None)
            if done is not None:
                rows = done.user_attrs["structures"]
                self._drift_reference = {name: float(row.get("drift", 0.0)) for name, row in rows.items()}
                return
            if not references or time.monotonic() >= deadline:
                if not self._warned_no_reference:
                    log.warning(
                        "trial %d: the paper default has no complete trial in this study, so --max-drift (its yardstick) "
                        "is not applied to it, nor to later trials until the paper default completes",
                        trial.number,
                    )
                    self._warned_no_reference = True
                return
            wait_for_other_processes(study, self.repeat_poll_seconds, announce=False)

    def _crops_baseline(self) -> PositionReport | None:
        return next((s.report for s in self.structures if is_crops(s.evaluator.dataset)), None)

    # ---------------------------------------------------------------------------------- recording

    def _metrics(self, scored: Scored, config: CalibrationConfig) -> tuple[dict[str, float], dict[str, float]]:
        """Everything a complete trial logs, and its constraint values."""
        evidence, tuning = scored.evidence, scored.tuning
        assert evidence is not None and tuning is not None  # a complete trial scored every rung
        general_delta = None
        if self.general is not None:
            general_delta = self.general.run(config).report.ndcg10 - self.general.report.ndcg10
        constraints = self._constraints(scored, general_delta)
        metrics: dict[str, float] = {k: float(v) for k, v in tuning.report.as_dict().items() if v is not None}
        metrics.update(
            {f"constraint_{name}": value for name, value in constraints.items()},
            hm_floor=self.constraints.hm_floor,
            hm_low=evidence.hm_low,
            psi_se=evidence.objective_se,
            ndcg10_delta=evidence.ndcg_delta,
            drift=tuning.drift,
            feasible=float(all(c <= 0 for c in constraints.values())),
            encode_seconds=tuning.encode_seconds,
            truncated_documents=float(tuning.truncated),
            robust_psi=scored.robust.objective,
            robust_psi_se=scored.robust.objective_se,
        )
        for name, row in scored.robust.per_structure().items():
            metrics.update({f"structure/{name}/{k}": v for k, v in row.items()})
        if general_delta is not None:
            metrics["general_ndcg10_delta"] = general_delta
        if scored.screen is not None:
            metrics.update(_screen_metrics(scored.screen))
        if scored.crops is not None:
            metrics.update(crops_psi=scored.crops.psi or 0.0, crops_hm=scored.crops.hm or 0.0, crops_ndcg10=scored.crops.ndcg10)
        metrics["cost/layer_tokens"] = float(scored.layer_tokens)
        # the run list's columns first: MLflow keeps a run's metrics in the order logged, and its compare view plots
        # the first one the runs share unless told otherwise
        leading = {name: metrics.pop(name) for name in ("robust_psi", "psi", "hm", "feasible", "ndcg10_delta") if name in metrics}
        return leading | metrics, constraints

    def _profile(self, number: int, config: CalibrationConfig, metrics: dict[str, float]) -> list[Path]:
        """The pooled row's attention on a few passages (diagnostic only: selection never reads it)."""
        profile = AttentionProfile()
        encoder = CalibratedEncoder(self.evaluator.model, config)
        with warnings.catch_warnings():  # a short profile passage is a diagnostic's, not the user's
            warnings.simplefilter("ignore", ShortDocumentsWarning)
            encoder.encode(
                self.profile_texts, batch_size=self.evaluator.batch_size, batch_tokens=self.evaluator.batch_tokens, observer=profile
            )
        metrics.update(profile.summary())
        metrics["cost/layer_tokens"] += encoder.layer_tokens
        folder = self.staging / f"trial-{number}"
        folder.mkdir(parents=True, exist_ok=True)
        data = profile.as_dict()
        json_path = folder / "attention_profile.json"
        json_path.write_text(json.dumps(data, indent=1), encoding="utf-8")
        image = plot_profile(data, folder / "attention_profile.png", f"trial {number}: pooled-row attention by layer")
        return [json_path, image]

    def _record(
        self,
        trial: optuna.Trial,
        scored: Scored,
        metrics: dict[str, float],
        constraints: dict[str, float],
        where: Mapping[str, str],
    ) -> None:
        """What selection, the conclusion and the dashboard read back from Optuna, and the intermediate value after
        each rung, the last of which is the trial's value."""
        assert scored.tuning is not None and scored.evidence is not None
        report = scored.tuning.report
        feasible = metrics["feasible"] == 1.0
        feasibility = "; ".join(self.constraints.clauses(constraints, where))
        # 6 significant digits, and the structures under their own attribute: the JSON stays under the 1,024
        # characters optuna-dashboard shows of a non-string attribute
        shown = {k: float(f"{v:.6g}") for k, v in metrics.items() if not k.startswith(("structure/", "screen/"))}
        attributes = {
            "feasible": f"{'yes' if feasible else 'NO'}: {feasibility}",
            "metrics": shown,
            "psi": report.psi,
            "hm": report.hm,
            "psi_se": scored.evidence.objective_se,
            "drift": scored.tuning.drift,
            "robust_psi": scored.robust.objective,
            "robust_psi_se": scored.robust.objective_se,
            "worst_structure": scored.robust.worst.name,
            "structures": scored.robust.per_structure(),
            "layer_tokens": int(metrics["cost/layer_tokens"]),
        }
        for key, value in attributes.items():
            trial.set_user_attr(key, value)
        for name, value in constraints.items():
            trial.set_constraint(name, value)
        mark_for_dashboard(trial, constraints)
        resamples = scored.robust.objective_resamples
        if resamples is not None:  # JSON has no NaN: an undefined resample is null
            rows = [None if not math.isfinite(v) else round(float(v), 6) for v in resamples]
            set_trial_system_attr(trial, RESAMPLES_ATTR, rows)
        if not self.pareto:  # Optuna keeps intermediate values of one objective only
            # Reported once the trial is complete: a pruned trial has none, so Optuna gives it no value (it would
            # take the last one: a worst case over fewer structures, lower than the trial's, drawn as if fairer)
            for step, value in enumerate(scored.steps):
                trial.report(value, step)

    def _record_pruned(self, trial: optuna.Trial, scored: Scored, opened: _Opened) -> dict[str, float]:
        """A pruned trial keeps what it measured, its partial constraint values (so TPE files it as infeasible
        when it was pruned for a constraint) and the rung and reason, in Optuna and in MLflow; returns those values.

        Nothing of it stands where a complete trial's result does: Optuna gets no intermediate value (so the trial
        has no value, `_record`), and MLflow gets its figures per structure scored (`structure/NAME/...`, complete
        for that structure) and what spans the structures under `pruned/` (its worst case so far is a lower bound,
        its constraint margins so far upper bounds), never under the complete trials' names."""
        on_screen = scored.screen is not None and scored.evidence is scored.screen  # stopped on the screen
        constraints = self._constraints(scored)  # between corpus rungs the violation that pruned it is among them
        if on_screen and scored.evidence is not None:  # the pool's own figures, with what they show missed beyond noise
            constraints |= self._certain_violations(scored.evidence)
        for name, value in constraints.items():
            trial.set_constraint(name, value)
        mark_for_dashboard(trial, constraints)
        pruned = trial.user_attrs[PRUNED_ATTR]
        said = (
            f"pruned after {', '.join(pruned['scored'])} (rung {pruned['rung']} of {pruned['of']}): {pruned['reason']}; never a candidate"
        )
        trial.set_user_attr("feasible", f"NO: {said}")
        trial.set_user_attr("layer_tokens", scored.layer_tokens)
        rows = scored.robust.per_structure()
        trial.set_user_attr("structures", rows)
        metrics: dict[str, float] = {}
        if on_screen and scored.evidence is not None:  # the pool's figures are not the tuning split's: logged under their own names only
            metrics = _screen_metrics(scored.evidence)
        else:
            for name, row in rows.items():
                metrics.update({f"structure/{name}/{k}": v for k, v in row.items()})
            metrics["pruned/worst_psi_of_the_structures_scored"] = scored.robust.objective
        metrics |= {f"pruned/constraint_{name}": value for name, value in constraints.items()}  # the margins so far, named apart
        metrics |= {"cost/layer_tokens": float(scored.layer_tokens), "pruned/at_rung": float(pruned["rung"])}
        self.tracker.finish_trial(
            self.study_name,
            opened.ended(
                "PRUNED",
                metrics,
                {"posfair.pruned": f"rung {pruned['rung']} of {pruned['of']}: {pruned['reason']}"[:4000]},
                f": {opened.config_text}: {said}.",
                "pruned",
            ),
        )
        return constraints

    # ---------------------------------------------------------------------------------- repeats

    def _repeat_of(self, trial: optuna.Trial, key: str) -> FrozenTrial | None:
        """The complete trial (not itself a repeat) that ran this calibration already, if any; None as well once
        the study holds `repeat_limit` repeats (a sampler that only draws known configs must still end).

        A calibration that another trial is running (in another process) is waited for, so that two trials
        that draw it at once do not both run it. Every trial records its calibration key before it looks and
        what it decided after (`REPEAT_CHECK_ATTR`: "runs" or "waits"), so of two such trials at least the
        later to look sees the other. A trial waits while a lower-numbered trial runs its calibration, or a
        higher-numbered one that decided to run it (having looked before this one's key was there); while a
        higher-numbered one has not decided yet it looks again. If the trial waited for completes, it is the
        trial repeated; if it fails or is pruned, or `repeat_wait_seconds` pass, None: this trial runs the
        config itself. It waits as the study loop waits for other processes (`wait_for_other_processes`), which fails
        the trials of dead processes, so a killed worker's trial is not waited for to the end."""
        study = trial.study
        deadline = time.monotonic() + self.repeat_wait_seconds
        recorded: str | None = None  # what REPEAT_CHECK_ATTR says of this trial so far

        def decide(decision: str) -> None:
            nonlocal recorded
            if recorded != decision:
                trial.set_user_attr(REPEAT_CHECK_ATTR, decision)
                recorded = decision

        while True:
            trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
            if sum(t.state == TrialState.COMPLETE and DUPLICATE_ATTR in t.user_attrs for t in trials) >= self.repeat_limit:
                decide("runs")
                return None
            same = [
                t
                for t in trials
                if t.number != trial.number and DUPLICATE_ATTR not in t.user_attrs and t.user_attrs.get("calibration") == key
            ]
            ran = next((t for t in same if t.state == TrialState.COMPLETE), None)
            if ran is not None:
                return ran
            others = [t for t in same if t.state == TrialState.RUNNING]
            running = [t.number for t in others if t.number < trial.number or t.user_attrs.get(REPEAT_CHECK_ATTR) == "runs"]
            undecided = [t.number for t in others if t.number > trial.number and REPEAT_CHECK_ATTR not in t.user_attrs]
            if not running and not undecided:
                decide("runs")
                return None
            if time.monotonic() >= deadline:
                log.warning(
                    "trial %d: trial %d still runs the same calibration after %.0f s; it is run here too",
                    trial.number,
                    (running or undecided)[0],
                    self.repeat_wait_seconds,
                )
                decide("runs")
                return None
            if running:
                if recorded is None:
                    log.info("trial %d drew the calibration trial %d is running: waiting for it", trial.number, running[0])
                decide("waits")
            wait_for_other_processes(study, self.repeat_poll_seconds, announce=False)

    def _repeat(self, trial: optuna.Trial, earlier: optuna.trial.FrozenTrial, params: dict[str, object]) -> float | tuple[float, float]:
        """Tell Optuna what the earlier trial measured (the sampler learns the truth) without running it again."""
        trial.set_user_attr(DUPLICATE_ATTR, earlier.number)
        for key in ("psi", "hm", "psi_se", "drift", "robust_psi", "robust_psi_se", "worst_structure", "layers"):
            if key in earlier.user_attrs:
                trial.set_user_attr(key, earlier.user_attrs[key])
        trial.set_user_attr("layer_tokens", 0)
        for name, value in named_constraints(earlier).items():
            trial.set_constraint(name, value)
        mark_for_dashboard(trial, named_constraints(earlier))
        if "feasible" in earlier.user_attrs:
            trial.set_user_attr("feasible", earlier.user_attrs["feasible"])
        metrics = {**earlier.user_attrs.get("metrics", {}), "cost/layer_tokens": 0.0}  # its figures, at no cost
        self.tracker.finish_trial(
            self.study_name,
            TrialRecord(
                trial.number,
                "COMPLETE",
                params,
                metrics,
                {"posfair.duplicate_of": str(earlier.number)},
                description=f"Trial {trial.number} drew the calibration of trial {earlier.number} again "
                f"({describe_config(params, self.evaluator.model.num_layers)}): not run again and not counted "
                "towards --trials.",
                markers=["duplicate"],
                start_ms=int(time.time() * 1000),
            ),
        )
        values = earlier.values
        return (values[0], values[1]) if self.pareto else values[0]


def _screen_metrics(screen: TrialEvidence) -> dict[str, float]:
    """A trial's figures on the pooled screen, named apart from the tuning split's."""
    return {"screen/psi": screen.objective, "screen/psi_se": screen.objective_se, "screen/hm_x100": 100 * screen.hm}


def corpus_rungs(tuning: Evaluator, uncalibrated: PositionReport, structures: Sequence[SideSet]) -> list[SideSet | None]:
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


def mark_for_dashboard(trial: optuna.Trial, constraints: Mapping[str, float]) -> None:
    """Also store the constraint values as the list optuna-dashboard reads (0.21: the system attribute
    `constraints`, the format of samplers' `constraints_func`), so its plots grey out infeasible trials;
    it does not read `set_constraint`'s named values. Optuna reads both formats, so the values count
    twice there: feasibility is unchanged and TPE's summed violations keep their order. The list is in
    the order of the names, as the storage gives the named values back."""
    set_dashboard_constraints(trial, [constraints[name] for name in sorted(constraints)])


def reference_markers(trial: optuna.Trial) -> list[str]:
    """'baseline' (no calibration, trial 0) or 'paper default' (trial 1) for the enqueued reference trials."""
    for reference, marker in ((BASELINE_PARAMS, "baseline"), (PAPER_DEFAULT_PARAMS, "paper default")):
        if is_reference_trial(trial, reference):  # type: ignore[arg-type]
            return [marker]
    return []
