"""Study-level figures for the MLflow parent run: the PSI–HM scatter, history and importances."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import optuna  # noqa: E402
from optuna.trial import FrozenTrial  # noqa: E402

from tuner.common.trials import complete_trials, constraints_of  # noqa: E402

log = logging.getLogger(__name__)


def pareto_scatter(study: optuna.Study, floor: float, baseline: FrozenTrial | None, best: FrozenTrial | None, path: Path) -> Path:
    """Every complete trial as (PSI, HM), feasible or not, with the floor, the baseline and the winner."""
    trials = complete_trials(study)
    feasible = [t for t in trials if all(c <= 0 for c in constraints_of(t))]
    infeasible = [t for t in trials if t not in feasible]
    figure, axis = plt.subplots(figsize=(6.5, 4.5))
    for group, style, label in ((feasible, dict(c="tab:blue", marker="o"), "feasible"), (infeasible, dict(c="tab:gray", marker="x"), "below HM floor")):
        axis.scatter([t.user_attrs["psi"] for t in group], [100 * t.user_attrs["hm"] for t in group], label=label, **style)
    for trial, color, label in ((baseline, "tab:red", "no calibration"), (best, "gold", "winner")):
        if trial is not None:
            axis.scatter(trial.user_attrs["psi"], 100 * trial.user_attrs["hm"], marker="*", s=260, c=color, edgecolors="black", label=label, zorder=3)
    axis.axhline(100 * floor, color="tab:red", linestyle="--", linewidth=1, label="HM floor")
    axis.set(xlabel="PSI (lower is fairer)", ylabel="HM of per-position nDCG@10", title=study.study_name)
    axis.legend(fontsize=8)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path


def unconditional_params(study: optuna.Study) -> list[str]:
    """Parameters every complete trial drew: importance is only ranked on these, since a conditional one
    (CLS-Hard's w) is drawn by a few trials and fANOVA would rank it on those few draws."""
    trials = complete_trials(study)
    if not trials:
        return []
    return sorted(set.intersection(*(set(t.params) for t in trials)))


def optuna_figures(study: optuna.Study, folder: Path) -> list[Path]:
    """Optuna's own history and parameter-importance plots (skipped when too few trials)."""
    from optuna.visualization import matplotlib as optuna_plots

    target = {"target": lambda t: t.values[0], "target_name": "PSI"} if len(study.directions) > 1 else {"target_name": "PSI"}
    params = unconditional_params(study)
    paths = []
    for name, plot, extra in (("history.png", optuna_plots.plot_optimization_history, {}),
                              ("importances.png", optuna_plots.plot_param_importances, {"params": params})):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                axis = plot(study, **target, **extra)
            axis.figure.savefig(folder / name, dpi=100, bbox_inches="tight")
            plt.close(axis.figure)
            paths.append(folder / name)
        except (ValueError, RuntimeError, ZeroDivisionError) as error:
            log.info("skipped %s: %s", name, error)
    return paths


def param_importances(study: optuna.Study) -> dict[str, float]:
    """fANOVA importance of the unconditional parameters for PSI ({} when too few trials to say)."""
    params = unconditional_params(study)
    if len(params) < 2 or len(complete_trials(study)) < 4:
        return {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            target = (lambda t: t.values[0]) if len(study.directions) > 1 else None
            return dict(optuna.importance.get_param_importances(study, params=params, target=target))
    except (ValueError, RuntimeError, ZeroDivisionError) as error:
        log.info("no parameter importance: %s", error)
        return {}
