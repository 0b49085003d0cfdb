"""Recording one trial: what selection, the conclusion and optuna-dashboard read back from Optuna, and its MLflow run.

A trial's MLflow run is opened as it starts (described as running) and closed with its end: complete (its figures,
attention profile and whether it is feasible), pruned (what it measured, named apart from a complete trial's
figures), failed or aborted (why), or a repeat of an earlier trial (that trial's figures, at no cost).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from objectives import Constraints
from objectives.evidence import TrialEvidence
from tuner.common.trials import BISECT_ATTR, CONSTRAINT_NAMES_ATTR, RESAMPLES_ATTR, START_ATTR, PrunedAt
from tuner.tracking.display import describe_config, describe_outcome
from tuner.tracking.runs import Tracker, TrialRecord
from tuner.tuning.bisection import describe_queued
from tuner.tuning.optuna_access import set_dashboard_constraints, set_trial_system_attr
from tuner.tuning.search_space import BASELINE_PARAMS, PAPER_DEFAULT_PARAMS, is_reference_trial
from tuner.tuning.trial.scoring import Scored


@dataclass(frozen=True)
class OpenedRun:
    """A trial's MLflow run as `TrialRecorder.open` opened it: what every record of its end repeats."""

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
        self,
        state: str,
        metrics: dict[str, float],
        tags: dict[str, str],
        outcome: str,
        marker: str | None,
        artifacts: Sequence[Path] = (),
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


class TrialRecorder:
    """Writes a trial's outcome to Optuna (the trial's attributes and constraints) and to its MLflow run."""

    def __init__(
        self, tracker: Tracker, study_name: str, num_layers: int, constraints: Constraints, pareto: bool = False
    ) -> None:
        self.tracker = tracker
        self.study_name = study_name
        self.num_layers = num_layers
        self.constraints = constraints
        self.pareto = pareto

    def open(self, trial: optuna.Trial, params: dict[str, object]) -> OpenedRun:
        """Mark a reference or start trial's role and open its MLflow run, described as running; what its end
        repeats."""
        markers = reference_markers(trial)
        role = markers[0] if markers else trial.user_attrs.get(START_ATTR)
        if role:
            trial.set_user_attr("role", role)
        opened = OpenedRun(
            trial.number, params, describe_config(params, self.num_layers), markers, int(time.time() * 1000)
        )
        queued = trial.user_attrs.get(BISECT_ATTR)
        tags = {"posfair.bisect": describe_queued(queued)} if queued else None
        run_id = self.tracker.start_trial(
            self.study_name, trial.number, params, f"{opened.label}, running: {opened.config_text}.", markers, tags
        )
        if run_id:
            trial.set_user_attr("mlflow_run_id", run_id)
        return replace(opened, run_id=run_id)

    def complete(
        self,
        trial: optuna.Trial,
        opened: OpenedRun,
        scored: Scored,
        metrics: dict[str, float],
        constraints: dict[str, float],
        where: Mapping[str, str],
        artifacts: list[Path],
    ) -> None:
        """A complete trial: its attributes in Optuna (`store_complete`), then its MLflow run with its figures, profile
        and the sentence that says whether it is feasible (every constraint checked; `where`: the structure that
        decides each)."""
        store_complete(trial, scored, metrics, constraints, self.constraints.clauses(constraints, where), self.pareto)
        feasible = metrics["feasible"] == 1.0
        outcome = describe_outcome(metrics, scored.robust.worst.name, self.constraints.explain(constraints, where))
        self.tracker.finish_trial(
            self.study_name,
            opened.ended(
                "COMPLETE",
                metrics,
                {"posfair.feasible": "yes" if feasible else "no"},
                f": {opened.config_text}: {outcome}.",
                None if feasible else "infeasible",
                artifacts,
            ),
        )
        if opened.run_id is None and (run_id := self.tracker.trial_run_id(trial.number)):
            trial.set_user_attr("mlflow_run_id", run_id)

    def pruned(self, trial: optuna.Trial, opened: OpenedRun, scored: Scored, constraints: dict[str, float]) -> None:
        """A pruned trial keeps what it measured, its partial constraint values (so TPE files it as infeasible
        when it was pruned for a constraint) and the rung and reason, in Optuna and in MLflow.

        Nothing of it stands where a complete trial's result does: Optuna gets no intermediate value (so the trial
        has no value, `store_complete`), and MLflow gets everything it measured under `pruned/` (`pruned_metrics`),
        never under the complete trials' names."""
        set_constraints(trial, constraints)
        pruned = PrunedAt.of_trial(trial)
        assert pruned is not None  # recorded as the trial stopped (`TrialScoring.score`)
        said = f"pruned after {', '.join(pruned.scored)} ({pruned.where}): {pruned.reason}; never a candidate"
        trial.set_user_attr("feasible", f"NO: {said}")
        trial.set_user_attr("layer_tokens", scored.layer_tokens)
        trial.set_user_attr("structures", scored.robust.per_structure())
        self.tracker.finish_trial(
            self.study_name,
            opened.ended(
                "PRUNED",
                pruned_metrics(scored, constraints, pruned.rung),
                {"posfair.pruned": f"{pruned.where}: {pruned.reason}"[:4000]},
                f": {opened.config_text}: {said}.",
                "pruned",
            ),
        )

    def failed(self, trial: optuna.Trial, opened: OpenedRun, error: BaseException) -> None:
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
            opened.ended(
                "FAIL",
                {},
                {"posfair.failure": reason[:4000]},
                f" failed: {opened.config_text}; {reason[:300]}",
                "failed",
            ),
        )

    def repeated(
        self, trial: optuna.Trial, earlier: FrozenTrial, params: dict[str, object], metrics: dict[str, float]
    ) -> None:
        """The MLflow run of a trial that repeats `earlier` (not run again): that trial's `metrics`, at no cost."""
        self.tracker.finish_trial(
            self.study_name,
            TrialRecord(
                trial.number,
                "COMPLETE",
                params,
                metrics,
                {"posfair.duplicate_of": str(earlier.number)},
                description=f"Trial {trial.number} drew the calibration of trial {earlier.number} again "
                f"({describe_config(params, self.num_layers)}): not run again and not counted "
                "towards --trials.",
                markers=["duplicate"],
                start_ms=int(time.time() * 1000),
            ),
        )


def store_complete(
    trial: optuna.Trial,
    scored: Scored,
    metrics: dict[str, float],
    constraints: dict[str, float],
    clauses: Sequence[str],
    pareto: bool,
) -> None:
    """What selection, the conclusion and the dashboard read back from Optuna, and the intermediate value after
    each rung, the last of which is the trial's value. `clauses`: how each constraint was met or missed."""
    assert scored.tuning is not None and scored.evidence is not None
    report = scored.tuning.report
    feasible = metrics["feasible"] == 1.0
    # 6 significant digits, and the structures under their own attribute: the JSON stays under the 1,024
    # characters optuna-dashboard shows of a non-string attribute
    shown = {k: float(f"{v:.6g}") for k, v in metrics.items() if not k.startswith(("structure/", "screen/"))}
    attributes = {
        "feasible": f"{'yes' if feasible else 'NO'}: {'; '.join(clauses)}",
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
    set_constraints(trial, constraints)
    resamples = scored.robust.objective_resamples
    if resamples is not None:  # JSON has no NaN: an undefined resample is null
        set_trial_system_attr(
            trial, RESAMPLES_ATTR, [None if not math.isfinite(v) else round(float(v), 6) for v in resamples]
        )
    if not pareto:  # Optuna keeps intermediate values of one objective only
        # Reported once the trial is complete: a pruned trial has none, so Optuna gives it no value (it would
        # take the last one: a worst case over fewer structures, lower than the trial's, drawn as if fairer)
        for step, value in enumerate(scored.steps):
            trial.report(value, step)


def complete_metrics(
    scored: Scored, constraints: dict[str, float], hm_floor: float, general_delta: float | None
) -> dict[str, float]:
    """Everything a complete trial logs, given its constraint values."""
    evidence, tuning = scored.evidence, scored.tuning
    assert evidence is not None and tuning is not None  # a complete trial scored every rung
    metrics: dict[str, float] = {k: float(v) for k, v in tuning.report.as_dict().items() if v is not None}
    metrics.update(
        {f"constraint_{name}": value for name, value in constraints.items()},
        hm_floor=hm_floor,
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
        metrics.update(screen_metrics(scored.screen))
    # the crops (what --max-crops-psi reads) are one of the structures: their figures are `structure/NAME/...`, once
    metrics["cost/layer_tokens"] = float(scored.layer_tokens)
    # the run list's columns first: MLflow keeps a run's metrics in the order logged, and its compare view plots
    # the first one the runs share unless told otherwise
    leading = {
        name: metrics.pop(name) for name in ("robust_psi", "psi", "hm", "feasible", "ndcg10_delta") if name in metrics
    }
    return leading | metrics


def pruned_metrics(scored: Scored, constraints: dict[str, float], rung: int) -> dict[str, float]:
    """What a trial pruned at `rung` logs, all under `pruned/` but its cost: its figures per structure scored
    (`pruned/structure/NAME/...`, complete for that structure; the pool's when it stopped on the screen), what spans
    the structures and its constraint margins so far. No figure shares a name with a complete trial's: MLflow's compare
    view colours the runs by the first metric they share, and the structure a pruned trial over-flattened would rank
    it above the winner there (the cost is what they share)."""
    metrics: dict[str, float] = {}
    if scored.on_screen and scored.evidence is not None:  # the pool's figures are not the tuning split's
        metrics = {f"pruned/{k}": v for k, v in screen_metrics(scored.evidence).items()}
    else:
        for name, row in scored.robust.per_structure().items():
            metrics.update({f"pruned/structure/{name}/{k}": v for k, v in row.items()})
        metrics["pruned/worst_psi_of_the_structures_scored"] = scored.robust.objective
    metrics |= {
        f"pruned/constraint_{name}": value for name, value in constraints.items()
    }  # the margins so far, named apart
    return metrics | {"cost/layer_tokens": float(scored.layer_tokens), "pruned/at_rung": float(rung)}


def screen_metrics(screen: TrialEvidence) -> dict[str, float]:
    """A trial's figures on the pooled screen, named apart from the tuning split's."""
    return {"screen/psi": screen.objective, "screen/psi_se": screen.objective_se, "screen/hm_x100": 100 * screen.hm}


def set_constraints(trial: optuna.Trial, constraints: Mapping[str, float]) -> None:
    """The trial's named constraint values (≤ 0 met), stored once where Optuna's samplers and optuna-dashboard
    both read them: the list of the `constraints_func` format (optuna-dashboard 0.21 reads no other), named by
    `CONSTRAINT_NAMES_ATTR` (`tuner.common.trials.named_constraints` reads them back). Stored by name as well
    (`Trial.set_constraint`), every constraint would count twice for the samplers: GPSampler would fit a model
    to each copy and square its probability of being met."""
    names = sorted(constraints)
    set_trial_system_attr(trial, CONSTRAINT_NAMES_ATTR, names)
    set_dashboard_constraints(trial, [float(constraints[name]) for name in names])


def reference_markers(trial: optuna.Trial) -> list[str]:
    """'baseline' (no calibration, trial 0) or 'paper default' (trial 1) for the enqueued reference trials."""
    for reference, marker in ((BASELINE_PARAMS, "baseline"), (PAPER_DEFAULT_PARAMS, "paper default")):
        if is_reference_trial(trial, reference):  # type: ignore[arg-type]
            return [marker]
    return []
