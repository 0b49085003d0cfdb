"""How a finished study accounts for itself, the same on every screen: its trials in one sentence (the console,
the parent run, optuna-dashboard), its budget as run tags and metrics, what it cost in layer-tokens, a trial's
figures, and optuna-dashboard's notes on the study and on the trials people look at."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from objectives import Selection
from tuner.common.budget import budget_end, budget_ended, study_budget
from tuner.common.trials import NOT_RUN_ATTR, SETUP_COST_ATTR, never_ran, trial_counts
from tuner.tracking.display import describe_config
from tuner.tuning.optuna_access import save_trial_note
from tuner.tuning.search_space import trial_basket_shares


def dashboard_notes(study: optuna.Study, best: optuna.trial.FrozenTrial, selection: Selection, num_layers: int) -> None:
    """optuna-dashboard's notes, where its users look: on the study, which trial won and why and how many trials
    ran; on the winner, that it won and why; on the trial its Best Trial card shows (the lowest objective) when that
    is not the winner, why it was not chosen; on each trial that never ran, why."""
    import optuna_dashboard

    params = {**best.params, "layers": best.user_attrs.get("layers"), "basket_shares": trial_basket_shares(best)}
    why = f"Chosen by the **{selection.rule}** rule: {selection.reason()}."
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.values]
    # the card's trial: the lowest value of the complete trials, feasible or not (one objective; none for --pareto)
    lowest = min(complete, key=lambda t: t.values[0]).number if complete and len(study.directions) == 1 else best.number
    card = (
        f"optuna-dashboard's *Best Trial* card shows trial {lowest}, the lowest objective of the complete trials: it "
        "reads neither the constraints nor the selection rule."
        if lowest != best.number
        else "It is also the trial optuna-dashboard's *Best Trial* card shows (the lowest objective)."
    )
    optuna_dashboard.save_note(
        study,
        f"## Winner: trial {best.number}\n\n{describe_config(params, num_layers)}: {trial_figures(best)}.\n\n"
        f"{why}\n\n{card}\n\n"
        f"**Trials**: {describe_trials(study)}.\n",
    )
    save_trial_note(study, best, f"## Winner of study {study.study_name}\n\n{why}\n")
    if lowest != best.number:
        save_trial_note(
            study,
            trials[lowest],
            f"## Lowest objective, not the winner\n\noptuna-dashboard's *Best Trial* card shows this trial: the lowest "
            f"value of the complete trials, feasible or not ({trials[lowest].user_attrs.get('feasible', '')[:300]}). "
            f"Trial {best.number} won: {selection.reason()}.\n",
        )
    for trial in trials:
        if never_ran(trial) and trial.state.is_finished():
            reason = trial.user_attrs.get(NOT_RUN_ATTR, "the study had its trials")
            save_trial_note(
                study,
                trial,
                f"## Not run\n\n{reason}. Optuna creates a trial before posfair can price or place it; it is recorded "
                "as *Fail* with no values, and counted nowhere.\n",
            )


def budget_metrics(study: optuna.Study) -> dict[str, float]:
    """The study's `--budget` in layer-tokens, beside what it spent (`cost/layer_tokens`)."""
    budget = study_budget(study)
    return {"cost/budget_layer_tokens": float(budget.study_allowance)} if budget else {}


def budget_tags(study: optuna.Study) -> dict[str, str]:
    """Whether the budget ended the study, in the numbers that decided it."""
    budget = study_budget(study)
    if not budget:
        return {}
    end = budget_end(study)
    if end is None or not budget_ended(study, budget.trial_allowance):
        return {"posfair.budget": f"{budget.spec}: --trials ended the study first"}
    return {
        "posfair.budget": f"{budget.spec} ended the study: trial {end.trial} would have needed up to {end.needed:,} "
        f"layer-tokens, and {end.left:,} of the trials' {end.trial_allowance:,} were left"
    }


def describe_trials(study: optuna.Study) -> str:
    """The study's trials in one sentence, as the console, the parent run and optuna-dashboard all say it
    (`TrialCounts`): what ran, then each trial Optuna created that never ran, and why."""
    counts = trial_counts(study)
    said = counts.sentence()
    unrun = [t for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL, TrialState.PRUNED)) if never_ran(t)]
    budget, end = study_budget(study), budget_end(study)
    if (
        budget
        and end is not None
        and budget_ended(study, budget.trial_allowance)
        and end.trial in {t.number for t in unrun}
    ):
        said += (
            f"; trial {end.trial} was drawn but not run: it would have needed up to {end.needed:,} layer-tokens and "
            f"{end.left:,} of the trials' {end.trial_allowance:,} were left"
        )
        unrun = [t for t in unrun if t.number != end.trial]
    for trial in unrun:
        said += f"; trial {trial.number} was not run: {trial.user_attrs.get(NOT_RUN_ATTR, 'the study had its trials')}"
    return said


def trial_metrics(study: optuna.Study) -> dict[str, float]:
    """The study's `TrialCounts` as parent-run metrics (`trials/…`)."""
    counts = trial_counts(study)
    return {"trials/ran": float(counts.ran), **{f"trials/{k}": float(v) for k, v in counts.to_dict().items()}}


def trial_figures(best: optuna.trial.FrozenTrial) -> str:
    """A complete trial's objective and tuning figures and how it met each constraint, from its Optuna record."""
    attrs = best.user_attrs
    worst = (
        f"worst-case PSI {attrs['robust_psi']:.3f} (on {attrs['worst_structure']}), "
        if "worst_structure" in attrs
        else ""
    )
    verdict, _, checks = attrs.get("feasible", "").partition(": ")
    said = {"yes": "feasible", "NO": "infeasible"}.get(verdict)
    return f"{worst}PSI {attrs['psi']:.3f} and HM {100 * attrs['hm']:.2f} on the tuning passages" + (
        f"; {said}: {checks}" if said else ""
    )


def setup_layer_tokens(study: optuna.Study) -> int:
    """What the study's processes encoded before their trials (baselines, queries), in layer-tokens."""
    return int(sum(v for k, v in study.user_attrs.items() if k.startswith(SETUP_COST_ATTR)))


def study_layer_tokens(study: optuna.Study) -> int:
    """What the study cost in padded tokens × layers run: every process's baselines and queries, and every
    trial, pruned and failed ones included (held-out scoring apart)."""
    return setup_layer_tokens(study) + int(
        sum(t.user_attrs.get("layer_tokens", 0) for t in study.get_trials(deepcopy=False))
    )
