"""The console's log of a running study: one readable line per finished trial, then the study's progress."""

from __future__ import annotations

import logging
from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from tuner.common.trials import DUPLICATE_ATTR, PrunedAt, finished, never_ran
from tuner.tracking.display import describe_config
from tuner.tracking.progress import StudyProgress
from tuner.tuning.search_space import trial_basket_shares

log = logging.getLogger(__name__)


def log_trial(
    study: optuna.Study,
    trial: optuna.trial.FrozenTrial,
    progress: StudyProgress,
    num_layers: int | None = None,
    after: Callable[[int], list[str]] = lambda number: [],
) -> None:
    """One readable line per finished trial, under Optuna's number, with its config (pruned or not), then what it
    queued (`after`: the objective's lines of it) and the study's progress (trials done of --trials, best so far,
    elapsed, ETA)."""
    attrs = trial.user_attrs
    params = {**trial.params, "layers": attrs.get("layers"), "basket_shares": trial_basket_shares(trial)}
    config = describe_config(params, num_layers)
    seconds = trial.duration.total_seconds() if trial.duration else 0.0
    if trial.state == TrialState.COMPLETE and DUPLICATE_ATTR in attrs:
        log.info(
            "trial %d drew the calibration of trial %d again: not run, not counted", trial.number, attrs[DUPLICATE_ATTR]
        )
        return
    if trial.state == TrialState.COMPLETE:
        truncated = int(attrs.get("metrics", {}).get("truncated_documents", 0))
        worst = (
            f"worst-case PSI {attrs['robust_psi']:.3f} on {attrs['worst_structure']} · "
            if "worst_structure" in attrs
            else ""
        )
        log.info(
            "trial %d: %sPSI %.3f ± %.3f, HM %.2f, ΔnDCG@10 %+.2f, drift %.4f on the tuning passages · %s · %s · "
            "%.0f s%s",
            trial.number,
            worst,
            attrs["psi"],
            attrs.get("psi_se", 0.0),
            100 * attrs["hm"],
            100 * attrs["metrics"].get("ndcg10_delta", 0.0),
            attrs.get("drift", 0.0),
            attrs.get("feasible", "").replace("yes: ", "feasible: ", 1).replace("NO: ", "infeasible: ", 1),
            config,
            seconds,
            f"  {truncated} passages truncated" if truncated else "",
        )
    elif trial.state == TrialState.PRUNED and (pruned := PrunedAt.of_trial(trial)) is not None:
        log.info(
            "trial %d pruned after %s (%s): %s · %s · %.0f s",
            trial.number,
            ", ".join(pruned.scored),
            pruned.where,
            pruned.reason,
            config,
            seconds,
        )
    elif never_ran(trial):
        return
    else:
        log.warning(
            "trial %d %s: %s · %s", trial.number, trial.state.name, attrs.get("failure_reason", "interrupted"), config
        )
    for line in after(trial.number):
        log.info("%s", line)
    done = min(len(finished(study)), progress.total)
    log.info("after trial %d: %d of %d trials done · %s", trial.number, done, progress.total, progress.status(study))
