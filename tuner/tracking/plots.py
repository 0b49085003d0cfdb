"""Study-level figures for the MLflow parent run: the PSI–HM scatter, history and importances."""

from __future__ import annotations

import logging
import textwrap
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import optuna  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from optuna.trial import FrozenTrial  # noqa: E402

from objectives.bootstrap import PositionProfile  # noqa: E402
from objectives.constraint import REQUIREMENTS  # noqa: E402
from objectives.selection import TIE_BREAK_WORDS, Selection  # noqa: E402
from tuner.common.trials import complete_trials, named_constraints, never_ran  # noqa: E402

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScatterPoint:
    """One trial as the scatter draws it (0–1 scale): its objective (the worst PSI over the tuning structures; the
    tuning PSI for a study without structures), its HM, the HM the floor was compared with (`hm_compared`: the lower
    bound under `significant`), what its constraint values decided, and its drift (the one-SE rule's tie-break)."""

    number: int
    psi: float
    hm: float
    compared: float
    missed: tuple[str, ...]
    drift: float = 0.0


def scatter_points(study: optuna.Study, floor: float) -> list[ScatterPoint]:
    """Every complete trial's point, its comparison read back from its constraint value (floor − constraint)."""
    points = []
    for trial in complete_trials(study):
        named = named_constraints(trial)
        compared = floor - named["hm_floor"] if "hm_floor" in named else trial.user_attrs["hm"]
        points.append(
            ScatterPoint(
                trial.number,
                trial.user_attrs.get("robust_psi", trial.user_attrs["psi"]),
                trial.user_attrs["hm"],
                compared,
                tuple(name for name, value in named.items() if value > 0),
                float(trial.user_attrs.get("drift", 0.0)),
            )
        )
    return points


def pareto_scatter(
    study: optuna.Study,
    floor: float,
    baseline: FrozenTrial | None,
    best: FrozenTrial | None,
    path: Path,
    conservative: bool = True,
    selection: Selection | None = None,
) -> Path:
    """Every complete trial at its objective (the x axis: what the study minimises and selection reads) and HM, with
    what the floor was compared with: under `significant` a line from the HM down to its bootstrap lower bound, which
    must clear the floor line. The groups are named by the constraints they miss, so a trial above the line can be
    infeasible and says why. With the `selection` that chose `best`, the band of the one-SE rule (the lowest objective
    plus its standard error) is shaded and each trial in it labelled with its drift: the winner need not be the
    leftmost point, and the picture says why."""
    points = scatter_points(study, floor)
    figure, axis = plt.subplots(figsize=(6.5, 4.5))
    groups = (
        ("feasible", lambda p: not p.missed, "tab:blue", "o"),
        (REQUIREMENTS["hm_floor"].missed, lambda p: "hm_floor" in p.missed, "tab:gray", "x"),
        ("misses another constraint", lambda p: p.missed and "hm_floor" not in p.missed, "tab:orange", "x"),
    )
    for label, member, color, marker in groups:
        group = [p for p in points if member(p)]
        if group:
            axis.scatter(
                [p.psi for p in group], [100 * p.hm for p in group], label=label, zorder=2, c=color, marker=marker
            )
    banded = set(selection.eligible) if selection is not None and selection.rule in TIE_BREAK_WORDS else set()
    # each point named by its trial, as the run list and the dashboard name it; in the band, with its drift
    for p in points:
        text = f"{p.number} · drift {p.drift:.4f}" if p.number in banded else str(p.number)
        axis.annotate(text, (p.psi, 100 * p.hm), textcoords="offset points", xytext=(5, 4), fontsize=7, zorder=4)
    if banded and selection is not None:
        chosen_as = TIE_BREAK_WORDS[selection.rule][0]
        axis.axvspan(
            selection.best.objective,
            max(selection.threshold, max(p.psi for p in points if p.number in banded)),
            color="gold",
            alpha=0.2,
            zorder=0,
            label=f"within one SE of the lowest: {selection.rule} takes {chosen_as}",
        )
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
            x = trial.user_attrs.get("robust_psi", trial.user_attrs["psi"])
            axis.scatter(
                x, 100 * trial.user_attrs["hm"], marker="*", s=260, c=color, edgecolors="black", label=label, zorder=3
            )
    axis.axhline(
        100 * floor,
        color="tab:red",
        linestyle="--",
        linewidth=1,
        label="HM floor (the lower bound must reach it)" if conservative else "HM floor",
    )
    robust = any("robust_psi" in t.user_attrs for t in complete_trials(study))
    objective = "worst-case PSI over the tuning structures" if robust else "PSI"
    title = study.study_name if selection is None else f"{study.study_name}\nwinner: {selection.describe()}"
    axis.set_title("\n".join(textwrap.wrap(title, 95, replace_whitespace=False)), fontsize=7)
    axis.set(xlabel=f"{objective} (the objective; lower is fairer)", ylabel="HM of per-position nDCG@10")
    axis.legend(fontsize=7)
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

    target = _psi_target(study)
    params = unconditional_params(study)
    plots: tuple[tuple[str, Callable[[], Axes]], ...] = (
        ("history.png", lambda: history(study)),
        (
            "importances.png",
            lambda: optuna_plots.plot_param_importances(
                study, params=params, target=target, target_name=_psi_name(study)
            ),
        ),
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


def history(study: optuna.Study) -> Axes:
    """Optuna's history of the objective, its axis ending at the last trial that ran: Optuna draws its best-value line
    to the last trial number, and a trial that never ran (withdrawn from the queue, or drawn past the budget) has
    one."""
    from optuna.visualization import matplotlib as optuna_plots

    axis = optuna_plots.plot_optimization_history(study, target=_psi_target(study), target_name=_psi_name(study))
    ran = [t.number for t in study.get_trials(deepcopy=False) if t.state.is_finished() and not never_ran(t)]
    if ran:
        axis.set_xlim(-0.5, max(ran) + 0.5)
    return axis


def _psi_target(study: optuna.Study) -> Callable[[FrozenTrial], float] | None:
    return (lambda t: t.values[0]) if len(study.directions) > 1 else None  # PSI, the first of --pareto's two


def _psi_name(study: optuna.Study) -> str:
    return "worst-case PSI" if any("worst_structure" in t.user_attrs for t in complete_trials(study)) else "PSI"


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


def heldout_profiles(sets: Mapping[str, Sequence[tuple[str, PositionProfile]]], path: Path) -> Path:
    """Each held-out set (a panel) as the configs do along the passage: nDCG@10 in each of the set's position groups,
    in passage order, with 95% intervals; each config's tilt (the slope along the passage over its mean, x100) with
    its interval in the legend."""
    figure, axes = plt.subplots(1, max(len(sets), 1), figsize=(4.6 * max(len(sets), 1), 4.0), squeeze=False)
    for axis, (name, lines) in zip(axes[0], sets.items()):
        for offset, (label, profile) in enumerate(lines):
            groups = list(profile.groups)
            shift = (offset - (len(lines) - 1) / 2) * 0.06  # side by side, so the intervals do not hide each other
            y = [100 * profile.groups[g].estimate for g in groups]
            low = [y[i] - 100 * profile.groups[g].low for i, g in enumerate(groups)]
            high = [100 * profile.groups[g].high - y[i] for i, g in enumerate(groups)]
            tilt = profile.tilt
            said = (
                f"{label}, tilt {100 * tilt.estimate:+.1f} [{100 * tilt.low:+.1f}, {100 * tilt.high:+.1f}]"
                if tilt
                else label
            )
            axis.errorbar(
                [i + shift for i in range(len(groups))], y, yerr=[low, high], marker="o", capsize=3, label=said
            )
            axis.set_xticks(range(len(groups)), groups)
        axis.set(title=name, xlabel="where the answer is in the passage", ylabel="nDCG@10 (95% interval)")
        axis.legend(fontsize=7)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path
