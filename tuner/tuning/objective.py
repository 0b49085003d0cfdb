"""One Optuna trial: draw a config, score it, record the constraint and the attention profile, log it."""

from __future__ import annotations

import json
import math
import os
import random
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.study._constrained_optimization import _CONSTRAINTS_KEY

from objectives import Constraints, PositionReport
from objectives.evidence import trial_evidence
from tuner.engine.encoder import CalibratedEncoder
from tuner.evaluation.evaluator import Evaluator
from tuner.evaluation.profile import AttentionProfile, plot_profile
from tuner.tracking.runs import Tracker, TrialRecord, describe_config, describe_feasibility, describe_outcome
from tuner.tuning.search_space import BASELINE_PARAMS, PAPER_DEFAULT_PARAMS, SearchSpace, is_reference_trial


@dataclass(frozen=True)
class SideSet:
    """A second set scored with every trial's config beside the tuning split, with its uncalibrated report:
    general retrieval (a constraint with `Constraints.max_general_drop`, otherwise a reported figure) or the
    tuning split's crops (`Constraints.max_crops_psi`)."""

    evaluator: Evaluator
    baseline: PositionReport


class TrialObjective:
    """Minimise PSI (and, with `pareto`, maximise HM) subject to `constraints` (HM floor, aggregate nDCG@10).

    Each trial also records what selection needs (`objectives.selection`): PSI's bootstrap standard error
    and the trial's drift from the uncalibrated document vectors.
    """

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
        crops: SideSet | None = None,
        profile_docs: int,
    ) -> None:
        self.evaluator = evaluator
        self.space = space
        self.constraints = constraints
        self.tracker = tracker
        self.study_name = study_name
        self.staging = staging
        self.pareto = pareto
        self.general = general
        self.crops = crops
        ids = sorted(evaluator.dataset.corpus)
        random.Random(0).shuffle(ids)
        self.profile_texts = [evaluator.dataset.corpus[d] for d in ids[:profile_docs]]

    def __call__(self, trial: optuna.Trial) -> float | tuple[float, float]:
        model = self.evaluator.model
        config = self.space.suggest(trial, model.spec.pooling, model.spec.padding_side)
        layers = list(config.resolve_layers(model.num_layers))
        params = {**{k: round(v, 6) if isinstance(v, float) else v for k, v in trial.params.items()}, "layers": layers,
                  "basket_shares": config.basket_shares}  # a parameter or fixed by the space: logged either way
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        markers = reference_markers(trial)
        if markers:
            trial.set_user_attr("role", markers[0])
        label = f"Trial {trial.number}" + (f" ({markers[0]})" if markers else "")
        config_text = describe_config(params, model.num_layers)
        start_ms = int(time.time() * 1000)
        run_id = self.tracker.start_trial(self.study_name, trial.number, params, f"{label}, running: {config_text}.", markers)
        if run_id:
            trial.set_user_attr("mlflow_run_id", run_id)
        try:
            evaluation = self.evaluator.run(config)
            report = evaluation.report
            if report.hm is None or report.psi is None or not (math.isfinite(report.hm) and math.isfinite(report.psi)):
                raise ValueError(f"metrics are not finite (HM {report.hm}, PSI {report.psi})")
            evidence = trial_evidence(self.evaluator.run(None).per_query, evaluation.per_query, seed=trial.number)
            general_delta = None
            if self.general is not None:
                general_delta = self.general.evaluator.run(config).report.ndcg10 - self.general.baseline.ndcg10
            crops, crops_psi = None, None
            if self.crops is not None:
                crops = self.crops.evaluator.run(config).report
                crops_psi = (crops.psi, self.crops.baseline.psi)
            constraints = self.constraints.values(evidence.hm, evidence.hm_low, evidence.ndcg_delta, general_delta, crops_psi)
            profile = AttentionProfile()
            CalibratedEncoder(model, config).encode(self.profile_texts, batch_size=self.evaluator.batch_size,
                                                    batch_tokens=self.evaluator.batch_tokens, observer=profile)
            artifacts = self._profile_artifacts(trial.number, profile)
        except Exception as error:
            reason = f"{error.__class__.__name__}: {error}"
            trial.set_user_attr("failure_reason", reason)
            self.tracker.finish_trial(self.study_name, TrialRecord(
                trial.number, "FAIL", params, {}, {"posfair.failure": reason[:4000]},
                description=f"{label} failed: {config_text}; {reason[:300]}", markers=[*markers, "failed"], start_ms=start_ms,
            ))
            raise
        metrics: dict[str, float] = {k: float(v) for k, v in report.as_dict().items() if v is not None}
        metrics.update(
            {f"constraint_{name}": value for name, value in constraints.items()},
            hm_floor=self.constraints.hm_floor,
            hm_low=evidence.hm_low,
            psi_se=evidence.objective_se,
            ndcg10_delta=evidence.ndcg_delta,
            drift=evaluation.drift,
            feasible=float(all(c <= 0 for c in constraints.values())),
            encode_seconds=evaluation.encode_seconds,
            truncated_documents=float(evaluation.truncated),
            **profile.summary(),
        )
        if general_delta is not None:
            metrics["general_ndcg10_delta"] = general_delta
        if crops is not None:
            metrics.update(crops_psi=crops.psi, crops_hm=crops.hm, crops_ndcg10=crops.ndcg10)
        feasible = metrics["feasible"] == 1.0
        feasibility = describe_feasibility(metrics, self.constraints.conservative)
        # 6 significant digits: the JSON stays under the 1,024 characters optuna-dashboard shows of a non-string attribute
        shown = {k: float(f"{v:.6g}") for k, v in metrics.items()}
        attributes = {"feasible": f"{'yes' if feasible else 'NO'}: {feasibility}", "metrics": shown, "layers": layers,
                      "psi": report.psi, "hm": report.hm, "psi_se": evidence.objective_se, "drift": evaluation.drift}
        for key, value in attributes.items():
            trial.set_user_attr(key, value)
        for name, value in constraints.items():
            trial.set_constraint(name, value)
        mark_for_dashboard(trial, list(constraints.values()))
        self.tracker.finish_trial(self.study_name, TrialRecord(
            trial.number, "COMPLETE", params, metrics, {"posfair.feasible": "yes" if feasible else "no"}, artifacts,
            description=f"{label}: {config_text}: {describe_outcome(metrics, self.constraints.conservative)}.",
            markers=markers + ([] if feasible else ["infeasible"]), start_ms=start_ms,
        ))
        if run_id is None and (run_id := self.tracker.trial_run_id(trial.number)):
            trial.set_user_attr("mlflow_run_id", run_id)
        return (report.psi, report.hm) if self.pareto else report.psi

    def _profile_artifacts(self, number: int, profile: AttentionProfile) -> list[Path]:
        folder = self.staging / f"trial-{number}"
        folder.mkdir(parents=True, exist_ok=True)
        data = profile.as_dict()
        json_path = folder / "attention_profile.json"
        json_path.write_text(json.dumps(data, indent=1), encoding="utf-8")
        image = plot_profile(data, folder / "attention_profile.png", f"trial {number}: pooled-row attention by layer")
        return [json_path, image]


def mark_for_dashboard(trial: optuna.Trial, values: list[float]) -> None:
    """Also store the constraint values as the list optuna-dashboard reads (0.21: the system attribute
    `constraints`, the format of samplers' `constraints_func`), so its plots grey out infeasible trials;
    it does not read `set_constraint`'s named values. Optuna reads both formats, so the values count
    twice there: feasibility is unchanged and TPE's summed violations keep their order."""
    trial.storage.set_trial_system_attr(trial._trial_id, _CONSTRAINTS_KEY, values)


def reference_markers(trial: optuna.Trial) -> list[str]:
    """'baseline' (no calibration, trial 0) or 'paper default' (trial 1) for the enqueued reference trials."""
    for reference, marker in ((BASELINE_PARAMS, "baseline"), (PAPER_DEFAULT_PARAMS, "paper default")):
        if is_reference_trial(trial, reference):  # type: ignore[arg-type]
            return [marker]
    return []
