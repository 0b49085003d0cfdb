"""The study's conclusion in words, tables, figures and metrics: the parent run's description, columns and figures,
the held-out table and picture, the summary file's rows, what the study optimised, and why no trial won."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import optuna

from objectives import CONSTRAINTS, Constraints, HmFloor, Interval, Selection, describe_rule
from tuner.common.trials import complete_trials, named_constraints
from tuner.tracking.display import describe_config, display_metrics, summary_metrics
from tuner.tracking.plots import heldout_profiles, optuna_figures, param_importances, pareto_scatter
from tuner.tuning.accounts import trial_figures
from tuner.tuning.heldout import SummaryRow, trial_with
from tuner.tuning.search_space import BASELINE_PARAMS, trial_basket_shares
from tuner.tuning.settings import TuneSettings


def describe_objective(study: optuna.Study, best: optuna.trial.FrozenTrial, floor: float) -> str:
    """What the study optimised, and subject to what, in one line (the YAML's provenance): the constraints its trials
    were checked on, with the study's limits (`study_constraints`)."""
    complete = complete_trials(study)
    checked = [r.name for r in CONSTRAINTS if any(r.name in named_constraints(t) for t in complete)]
    structures = len(best.user_attrs.get("structures", {})) > 1
    return describe_rule(study_constraints(study, floor), checked, bool(study.user_attrs.get("pareto")), structures)


def study_constraints(study: optuna.Study, floor: float) -> Constraints:
    """The limits a study ran under, from its identity attributes (`tuner.tuning.session.prepare`), with `floor`
    resolved."""
    attrs, defaults = study.user_attrs, Constraints(floor)
    return Constraints(
        floor,
        HmFloor.parse(str(attrs.get("hm_floor", "significant"))).conservative,
        attrs.get("max_ndcg_drop", defaults.max_ndcg_drop),
        attrs.get("max_general_drop"),
        attrs.get("max_crops_psi"),
        attrs.get("max_reversal", defaults.max_reversal),
        attrs.get("max_drift"),
    )


def structure_metrics(best: optuna.trial.FrozenTrial) -> dict[str, float]:
    """The winner's figures on each tuning structure (PSI, tilt, reversal, drift), as parent-run metrics."""
    shown: dict[str, float] = {}
    for name, row in best.user_attrs.get("structures", {}).items():
        shown |= display_metrics(row, f"tuning/winner/structure/{name}/")
    return shown


def study_conclusion(
    best: optuna.trial.FrozenTrial, rows: list[SummaryRow], num_layers: int, selection: Selection
) -> str:
    """The parent run's description, two sentences: the winner with its config and the rule that chose it,
    then its change against no calibration on each held-out set."""
    params = {**best.params, "layers": best.user_attrs.get("layers"), "basket_shares": trial_basket_shares(best)}
    first = (
        f"Winner: trial {best.number}, {describe_config(params, num_layers)}: {trial_figures(best)}; "
        f"chosen by the {selection.rule} rule: {selection.reason()}."
    )
    return f"{first} {heldout_sentence(rows)}"


def heldout_sentence(rows: list[SummaryRow]) -> str:
    """The winner (the last row) against no calibration on each held-out set, in one sentence."""
    held = [
        f"{name} ΔHM {h.delta.hm.format()}, ΔPSI {h.delta.psi.format(scale=1, digits=3)}, "
        f"ΔnDCG@10 {h.delta.ndcg10.format()}"
        if h.delta.hm and h.delta.psi
        else f"{name} ΔnDCG@10 {h.delta.ndcg10.format()}"
        for name, h in rows[-1].heldout.items()
        if h.delta is not None
    ]
    if not held:
        return "No held-out set was scored."
    return "Held out, against no calibration (95% paired-bootstrap intervals): " + "; ".join(held) + "."


def heldout_markdown(rows: list[SummaryRow]) -> str:
    """Every held-out set as Markdown: one table of each config's HM, PSI, nDCG@10 and its change against no
    calibration with the 95% interval (the console's held-out tables), then per set how each config does along the
    passage: nDCG@10 in each position group and the tilt, with intervals, and their change against no calibration."""
    lines = [
        "# Held-out results",
        "",
        "Change against no calibration on the same queries, with 95% paired-bootstrap intervals. "
        "HM and nDCG@10 in points (x100), PSI 0-1 (lower is fairer).",
        "",
        "| set | config | HM | PSI | nDCG@10 | ΔHM | ΔPSI | ΔnDCG@10 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in rows[0].heldout:
        for row in rows:
            r, d = row.heldout[name].report, row.heldout[name].delta
            hm, psi = (f"{100 * r.hm:.2f}", f"{r.psi:.3f}") if r.hm is not None and r.psi is not None else ("–", "–")
            lines.append(
                f"| {name} | {row.label} | {hm} | {psi} | {100 * r.ndcg10:.2f} | "
                f"{d.hm.format() if d and d.hm else '–'} | {d.psi.format(scale=1, digits=3) if d and d.psi else '–'} | "
                f"{d.ndcg10.format() if d else '–'} |"
            )
    lines += [
        "",
        "## Along the passage",
        "",
        "nDCG@10 (points) in each position group of the set, from the beginning of the passage to its end, and the "
        "tilt (the slope of nDCG@10 along the passage over its mean, x100: negative, the beginning is favoured), each "
        "with its 95% bootstrap interval; below each config, its change against no calibration (95% paired-bootstrap "
        "interval). The same picture: `heldout.png`.",
    ]
    for name in rows[0].heldout:
        profiles = [(row, row.heldout[name]) for row in rows if row.heldout[name].profile is not None]
        if not profiles:
            continue
        groups = list(profiles[0][1].profile.groups)  # type: ignore[union-attr]
        lines += [
            "",
            f"### {name}",
            "",
            "| config | " + " | ".join([*groups, "tilt"]) + " |",
            "|---|" + "---:|" * (len(groups) + 1),
        ]
        for row, held in profiles:
            profile, delta = held.profile, held.delta
            assert profile is not None
            cells = [_interval(profile.groups[g], signed=False) for g in groups] + [
                _interval(profile.tilt) if profile.tilt else "–"
            ]
            lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
            if delta is not None:
                changes = [delta.groups[g].format() if g in delta.groups else "–" for g in groups]
                lines.append(
                    "| Δ vs no calibration | "
                    + " | ".join([*changes, delta.tilt.format() if delta.tilt else "–"])
                    + " |"
                )
    return "\n".join(lines) + "\n"


def _interval(interval: Interval, signed: bool = True) -> str:
    """'57.31 [55.02, 59.47]' (points), or signed: '-17.4 [-20.1, -14.6]'."""
    if signed:
        return interval.format(digits=1)
    return f"{100 * interval.estimate:.2f} [{100 * interval.low:.2f}, {100 * interval.high:.2f}]"


def heldout_picture(rows: list[SummaryRow], path: Path) -> Path:
    """`heldout_markdown`'s profiles as a picture (`tuner.tracking.plots.heldout_profiles`)."""
    sets = {
        name: [(row.label, row.heldout[name].profile) for row in rows if row.heldout[name].profile is not None]
        for name in rows[0].heldout
    }
    return heldout_profiles(sets, path)  # type: ignore[arg-type]


def winner_columns(best: optuna.trial.FrozenTrial, rows: list[SummaryRow]) -> dict[str, float]:
    """The winner's figures on the parent run under the trials' own column names (worst_structure_psi, psi, hm_x100,
    feasible, ndcg10_change_vs_uncalibrated_x100), so one set of run-list columns shows them on the study's row too,
    and its change on the first held-out set as `heldout_winner_change_hm_x100` / `_psi`, rounded as shown."""
    metrics = best.user_attrs.get("metrics", {})
    names = ("robust_psi", "psi", "hm", "feasible", "ndcg10_delta")
    columns = {k: v for k, v in display_metrics({k: metrics[k] for k in names if k in metrics}).items()}
    first = next((h.delta for h in rows[-1].heldout.values() if h.delta is not None), None)
    if first is not None and first.hm is not None and first.psi is not None:
        columns |= {
            "heldout_winner_change_hm_x100": 100 * first.hm.estimate,
            "heldout_winner_change_psi": first.psi.estimate,
        }
    return {k: round(v, 4) for k, v in columns.items()}


WINNER_HELD_OUT = "Winner held out"
"""The section of the parent run's metrics that holds the winner's held-out figures: logged first (MLflow's run page
lists metrics in the order logged) and capitalised (its charts sort sections by name, capitals first), so they come
before the reference configs' and the costs."""


def row_metrics(rows: list[SummaryRow]) -> dict[str, float]:
    """The summary table as parent-run metrics: the winner's held-out figures with their intervals first (under
    `WINNER_HELD_OUT`), then every config's tuning figures and the reference configs' held-out ones."""
    labels = ["uncalibrated", *(["paper_default"] if len(rows) > 2 else []), "winner"]
    metrics: dict[str, float] = {}
    for name, held in rows[-1].heldout.items():
        metrics |= summary_metrics(
            f"{WINNER_HELD_OUT}/{name}", held.report.as_dict(), held.delta.intervals() if held.delta else None
        )
    for label, row in zip(labels, rows):
        metrics |= summary_metrics(f"tuning/{label}", row.tuning.as_dict(), None)
    for label, row in zip(labels[:-1], rows[:-1]):
        for name, held in row.heldout.items():
            metrics |= summary_metrics(
                f"heldout/{name}/{label}", held.report.as_dict(), held.delta.intervals() if held.delta else None
            )
    return metrics


def row_dict(row: SummaryRow) -> dict[str, object]:
    return {
        "label": row.label,
        "trial": row.trial,
        "config": row.config.model_dump() if row.config else None,
        "tuning": row.tuning.as_dict(),
        "heldout": {
            name: {
                "metrics": h.report.as_dict(),
                "delta": h.delta.summary() if h.delta else None,
                "intervals": h.delta.intervals() if h.delta else None,  # metric → (estimate, low, high), 0–1 scale
            }
            for name, h in row.heldout.items()
        },
    }


def psi_importances(study: optuna.Study) -> dict[str, float]:
    """Parameter importance for PSI over the parameters every trial drew; kept on the study for the dashboard."""
    importances = param_importances(study)
    if importances:
        study.set_user_attr(
            "psi_importance (parameters every trial drew)", {k: round(v, 4) for k, v in importances.items()}
        )
    return importances


def nothing_feasible(study: optuna.Study, settings: TuneSettings, floor: float) -> str:
    """Why no trial won: each constraint every complete trial missed, with the trial that came closest (in the
    constraints' own words, `Constraints.clause`), and the options that relax them."""
    complete = [named_constraints(t) | {"trial": t.number} for t in complete_trials(study)]
    constraints = replace(settings.constraints(0.0), hm_floor=floor)
    parts, options = [], []
    for requirement in CONSTRAINTS:
        checked = [values for values in complete if requirement.name in values]
        if not checked or any(values[requirement.name] <= 0 for values in checked):
            continue
        closest = min(checked, key=lambda values: values[requirement.name])
        clause = constraints.clause(requirement.name, closest[requirement.name])
        parts.append(
            f"every trial {requirement.missed} (the closest, trial {int(closest['trial'])}: "
            f"{clause.partition(' (')[2][:-1]})"
        )
        options.append(requirement.option)
    said = (
        "; ".join(parts)
        or "no constraint was missed by every trial (each trial's `feasible` attribute says which it missed)"
    )
    if not options:  # the options of what some trial missed
        options = [r.option for r in CONSTRAINTS if any(values.get(r.name, 0.0) > 0 for values in complete)]
    relax = " or ".join(dict.fromkeys(options))
    return (
        f"no trial met the constraints; nothing exported. {said}. Relax {relax}, widen the search space, or run more "
        "--trials."
    )


def study_figures(
    study: optuna.Study,
    floor: float,
    picked: tuple[optuna.trial.FrozenTrial, Selection] | None,
    staging: Path,
    conservative: bool,
) -> list[Path]:
    """The study's figures for its parent run: the trials against the HM floor (the baseline and the winner `picked`
    marked) and Optuna's own plots, written under `staging`."""
    reference = trial_with(study, BASELINE_PARAMS)
    best = picked[0] if picked else None
    return [
        pareto_scatter(
            study, floor, reference, best, staging / "pareto.png", conservative, picked[1] if picked else None
        ),
        *optuna_figures(study, staging),
    ]
