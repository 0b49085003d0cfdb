"""`tune run`: check the options, tune one model, print the settings in force and the outcome."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from tuner.cli.console import console, friendly_errors, make_console, quiet_libraries, setup_logging
from tuner.cli.options import takes
from tuner.cli.run_options import RunOptions

if TYPE_CHECKING:
    from tuner.tuning.run import TuneOutcome
    from tuner.tuning.settings import TuneSettings


@takes(RunOptions)
def run(options: RunOptions) -> None:
    """Tune one model (the default command): Optuna search, MLflow tracking, exported YAML, registered model.

    Example: tune --model minilm --trials 8 --output best.yaml"""
    setup_logging()
    with friendly_errors():
        settings = options.settings()
        quiet_libraries()
        _stop_on_sigterm()
        _print_settings(settings)
        from tuner.tuning.run import tune

        outcome = tune(settings)
    if outcome is not None:
        _print_outcome(outcome)


def _stop_on_sigterm() -> None:
    """SIGTERM (a scheduler's stop) unwinds a run as Ctrl-C does: trial loop, parent run, temp folders, exit code."""
    import signal

    from tuner.tuning.stops import raise_terminated

    signal.signal(signal.SIGTERM, raise_terminated)


def _print_settings(settings: TuneSettings) -> None:
    """Every setting with the value in force: defaults are resolved (storage, tracking URI, study name, output)."""
    from tuner.tuning.settings import dataset_reason, settings_in_force

    table = Table(title="tune: settings", show_header=False, box=None)
    for name, value in settings_in_force(settings).items():
        if name in ("dataset_defaulted", "worker_id"):
            continue
        shown = f"{value}  ({dataset_reason(settings)})" if name == "dataset" else str(value)
        table.add_row(name.replace("_", "-"), shown)
    console.print(table)


def _print_outcome(outcome: TuneOutcome) -> None:
    """Two tables: every row on the tuning split, then held-out deltas against no calibration."""
    out = make_console()
    groups = list(outcome.rows[0].tuning.group_ndcg10)
    tuning = Table(title=f"{outcome.study}: tuning split (HM floor {100 * outcome.floor:.2f})")
    for column in ["", *groups, "HM", "PSI", "nDCG@10", "R@10"]:
        tuning.add_column(column, justify="right" if column else "left")
    for row in outcome.rows:
        r = row.tuning
        tuning.add_row(
            row.label,
            *(f"{100 * r.group_ndcg10[g]:.2f}" for g in groups),
            f"{100 * r.hm:.2f}" if r.hm is not None else "–",
            f"{r.psi:.3f}",
            f"{100 * r.ndcg10:.2f}",
            f"{100 * r.recall10:.2f}",
        )
    out.print(tuning)
    for name in outcome.rows[0].heldout:
        held = Table(title=f"held out, {name}: Δ vs no calibration, 95% paired-bootstrap intervals")
        for column in ["", "HM", "PSI", "nDCG@10", "ΔHM", "ΔPSI", "ΔnDCG@10"]:
            held.add_column(column, justify="right" if column else "left")
        for row in outcome.rows:
            r, d = row.heldout[name].report, row.heldout[name].delta
            held.add_row(
                row.label,
                f"{100 * r.hm:.2f}" if r.hm is not None else "–",
                f"{r.psi:.3f}",
                f"{100 * r.ndcg10:.2f}",
                d.hm.format() if d and d.hm else "–",
                d.psi.format(scale=1, digits=3) if d and d.psi else "–",
                d.ndcg10.format() if d else "–",
            )
        out.print(held)
    winner = outcome.config
    console.print(
        f"winner: trial {outcome.winner_trial}: {winner.variant}, λ {winner.strength}, layers {winner.layers}, "
        f"basket {winner.basket_size}" + (f", w {winner.weight}" if winner.variant == "cls_hard" else "")
    )
    console.print(f"chosen by the {outcome.selection.rule} rule: {outcome.selection.describe()}", markup=False)
    if outcome.pareto:
        console.print(f"feasible Pareto front (PSI↓, HM↑): trials {outcome.pareto}")
    console.print(f"exported config: [bold]{escape(str(outcome.export_path))}[/bold]")
    console.print(f"MLflow: {outcome.tracking_uri}  (browse with `tune ui`)", markup=False)
    if outcome.registered:
        console.print(
            f"registered model: {outcome.registered}  (mlflow.pyfunc.load_model or "
            "`mlflow models serve -m ... --env-manager local`)",
            markup=False,
        )
