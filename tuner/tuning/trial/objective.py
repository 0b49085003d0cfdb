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
and repeated if that trial completes (`tuner.tuning.trial.repeats`).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import optuna

from objectives import Constraints
from tuner.calibration import CalibrationConfig
from tuner.common.trials import calibration_key
from tuner.evaluation.evaluator import Evaluator
from tuner.tracking.runs import Tracker
from tuner.tuning.bisection import queue_next
from tuner.tuning.candidates import best_objective
from tuner.tuning.search_space import SearchSpace
from tuner.tuning.trial.cost import TrialPricing
from tuner.tuning.trial.drift_yardstick import DriftYardstick
from tuner.tuning.trial.profile import TrialProfile
from tuner.tuning.trial.record import TrialRecorder, complete_metrics, reference_markers
from tuner.tuning.trial.repeats import RepeatCheck, repeat
from tuner.tuning.trial.scoring import Scored, SideSet, TrialScoring


class TrialObjective:
    """Minimise the worst PSI over the tuning structures (and, with `pareto`, maximise HM) subject to
    `constraints` (HM floor, aggregate nDCG@10, no reversed bias), pruning between rungs (`prune`).

    Each trial also records what selection needs (`objectives.selection`): the objective's bootstrap
    standard error and the trial's drift from the uncalibrated document vectors. The jobs are its parts':
    `scoring` (the rungs and the constraints), `pricing` (a trial's cost and the study's allowance), `recorder`
    (Optuna's attributes and the MLflow run), `repeats` (a calibration the study ran already) and `yardstick`
    (the drift limit's)."""

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
        self.pareto = pareto
        self.bisect = bisect  # queue the next λ of an over-correcting trial's family (`tuner.tuning.bisection`)
        self.repeats = RepeatCheck(repeat_limit)
        self.yardstick = DriftYardstick(constraints, self.repeats.wait_seconds, self.repeats.poll_seconds)
        self.scoring = TrialScoring(
            evaluator,
            constraints,
            self.yardstick,
            general=general,
            structures=structures or [],
            screen=screen,
            selection=selection,
            prune=prune and not pareto,  # Optuna's pruning reports are single-objective
        )
        self.profile = TrialProfile(evaluator, profile_docs, staging)
        sides = [screen, general, *(structures or [])]
        encoded = [evaluator, *(s.evaluator for s in sides if s is not None and s.shares is None)]
        self.pricing = TrialPricing(encoded, space, self.profile)
        self.recorder = TrialRecorder(tracker, study_name, evaluator.model.num_layers, constraints, pareto)
        self.said_after: dict[int, list[str]] = {}  # what a trial queued, said after its own line (`after`)

    def after(self, number: int) -> list[str]:
        """What trial `number` queued for the next trials (`tuner.tuning.bisection`), in words, once: the trial loop
        says it after the trial's own line, which Optuna's callbacks print once the trial is told."""
        return self.said_after.pop(number, [])

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, float]:
        """Draw a config; a repeat of one the study ran tells its values, anything else is scored and logged."""
        config, params = self._draw(trial)
        # the enqueued references run first, so a later draw of theirs repeats them
        repeated = self.repeats.repeat_of(trial, calibration_key(params))
        if repeated is not None:
            return self._values(repeat(trial, repeated, params, self.recorder))
        if self.pricing.allowance is not None and not reference_markers(trial):
            self.pricing.reserve(trial, config)
        opened = self.recorder.open(trial, params)
        self.yardstick.own = opened.markers == ["paper default"]
        if not opened.markers:
            self.yardstick.await_reference(trial)
        try:
            scored = self.scoring.score(trial, config, reference=bool(opened.markers))
            if scored.pruned is not None:
                constraints = self.scoring.pruned_constraints(scored)
                self.recorder.pruned(trial, opened, scored, constraints)
                self._bisect(trial, constraints, scored, complete=False)
                raise optuna.TrialPruned(scored.pruned)
            general_delta = self.scoring.general_delta(config)
            constraints = self.scoring.constraints_of(scored, general_delta)
            metrics = complete_metrics(scored, constraints, self.scoring.constraints.hm_floor, general_delta)
            artifacts = self.profile.run(trial.number, config, metrics)
        except optuna.TrialPruned:
            raise
        except (Exception, KeyboardInterrupt) as error:  # an aborted trial's run is closed FAILED too, never left open
            self.recorder.failed(trial, opened, error)
            raise
        where = scored.robust.deciding(self.yardstick.of(scored.robust))
        self.recorder.complete(trial, opened, scored, metrics, constraints, where, artifacts)
        self._bisect(trial, constraints, scored, complete=True)
        assert scored.tuning is not None
        return self._values([scored.robust.objective, scored.tuning.report.hm])  # type: ignore[list-item]

    def _draw(self, trial: optuna.Trial) -> tuple[CalibrationConfig, dict[str, object]]:
        """The trial's config and its parameters as logged (a parameter or fixed by the space), first among the
        trial's attributes with its layers, worker and calibration key (what a repeat check reads)."""
        model = self.evaluator.model
        config = self.space.suggest(trial, model.spec.pooling, model.spec.padding_side)
        layers = list(config.resolve_layers(model.num_layers))
        params = {
            **{k: round(v, 6) if isinstance(v, float) else v for k, v in trial.params.items()},
            "layers": layers,
            "basket_shares": config.basket_shares,
        }
        # first among its attributes in the dashboard
        trial.set_user_attr("feasible", "not known yet: the trial is running")
        trial.set_user_attr("layers", layers)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        trial.set_user_attr("calibration", calibration_key(params))
        return config, params

    def _values(self, values: list[float]) -> float | tuple[float, float]:
        """What Optuna is told: the objective, and HM beside it in a Pareto study."""
        return (values[0], values[1]) if self.pareto else values[0]

    def _bisect(self, trial: optuna.Trial, constraints: dict[str, float], scored: Scored, complete: bool) -> None:
        """Queue the next λ of the trial's family (`tuner.tuning.bisection`), judged against the best feasible trial
        and, under the drift limit, bounded by the drift the family has measured."""
        if self.bisect:
            best = best_objective(trial.study)
            step, worst = self.space.strength_step, scored.robust.objective
            limits = self.yardstick.limits(scored.robust)
            said = self.said_after.setdefault(trial.number, []).append
            queue_next(
                trial.study, trial, constraints, complete, step, worst, best, scored.robust.drifts(), limits, say=said
            )
