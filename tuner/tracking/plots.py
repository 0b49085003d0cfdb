"""Study-level figures for the MLflow parent run: the PSI–HM scatter, history and importances."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import optuna  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from optuna.trial import FrozenTrial  # noqa: E402

from tuner.common.trials import complete_trials, named_constraints  # noqa: E402

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScatterPoint:
    """One trial as the PSI–HM scatter draws it (0–1 scale): its HM, the HM the floor was compared with
    (`hm_compared`: the lower bound under `significant`), and what its constraint values decided."""

    number: int
    psi: float
    hm: float
    compared: float
    missed: tuple[str, ...]


def scatter_points(study: optuna.Study, floor: float) -> list[ScatterPoint]:
    """Every complete trial's point, its comparison read back from its constraint value (floor − constraint)."""
    points = []
    for trial in complete_trials(study):
        named = named_constraints(trial)
        compared = floor - named["hm_floor"] if "hm_floor" in named else trial.user_attrs["hm"]
        points.append(
            ScatterPoint(
                trial.number,
                trial.user_attrs["psi"],
                trial.user_attrs["hm"],
                compared,
                tuple(name for name, value in named.items() if value > 0),
            )
        )
    return points


def pareto_scatter(
    study: optuna.Study, floor: float, baseline: FrozenTrial | None, best: FrozenTrial | None, path: Path, conservative: bool = True
) -> Path:
    """Every complete trial as (PSI, HM), with what the floor was compared with: under `significant` a line
    from the HM down to its bootstrap lower bound, which must clear the floor line. The groups are named by
    the constraints they miss, so a trial above the line can be infeasible and says why."""
    points = scatter_points(study, floor)
    figure, axis = plt.subplots(figsize=(6.5, 4.5))
    groups = (
        ("feasible", lambda p: not p.missed, "tab:blue", "o"),
        ("misses the HM floor", lambda p: "hm_floor" in p.missed, "tab:gray", "x"),
        ("misses another constraint", lambda p: p.missed and "hm_floor" not in p.missed, "tab:orange", "x"),
    )
    for label, member, color, marker in groups:
        group = [p for p in points if member(p)]
        if group:
            axis.scatter([p.psi for p in group], [100 * p.hm for p in group], label=label, zorder=2, c=color, marker=marker)
    if conservative and points:
        axis.vlines(
            [p.psi for p in points],
            [100 * p.compared for p in points],
            [100 * p.hm for p in points],
            colors="tab:gray",
            linewidth=1,
            zorder=1,
        )
        axis.scatter(
            [p.psi for p in points],
            [100 * p.compared for p in points],
            marker="_",
            s=80,
            c="black",
            zorder=2,
            label="HM lower bound (95%): compared with the floor",
        )
    for trial, color, label in ((baseline, "tab:red", "no calibration"), (best, "gold", "winner")):
        if trial is not None:
            axis.scatter(
                trial.user_attrs["psi"], 100 * trial.user_attrs["hm"], marker="*", s=260, c=color, edgecolors="black", label=label, zorder=3
            )
    axis.axhline(
        100 * floor,
        color="tab:red",
        linestyle="--",
        linewidth=1,
        label="HM floor (the lower bound must reach it)" if conservative else "HM floor",
    )
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

    target: Callable[[FrozenTrial], float] | None = (lambda t: t.values[0]) if len(study.directions) > 1 else None  # PSI
    params = unconditional_params(study)
    plots: tuple[tuple[str, Callable[[], Axes]], ...] = (
        ("history.png", lambda: optuna_plots.plot_optimization_history(study, target=target, target_name="PSI")),
        ("importances.png", lambda: optuna_plots.plot_param_importances(study, params=params, target=target, target_name="PSI")),
    )
    paths = []
    for name, plot in plots:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                axis = plot()
            figure = axis.figure
            if not isinstance(figure, Figure):  # optuna draws on a figure of its own, never a subfigure
                raise TypeError(f"optuna drew {name} on a {type(figure).__name__}, not a figure")
            figure.savefig(folder / name, dpi=100, bbox_inches="tight")
            plt.close(figure)
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
