"""What a study costs and what its winner is worth: the paper's grid against TPE, with and without the
robust, pruned search (MiniLM on WikiPos-dev by default).

Run from the repository root:

    .venv/bin/python -m benchmarks.search_cost                          # every arm, seeds 0-4, all held-out sets
    .venv/bin/python -m benchmarks.search_cost --arms grid robust --seeds 0 --heldout wikipos-test   # reduced

Each arm is a real `tune` run (the same evaluator, selection and export as the command line), in a fresh
store of its own; arms share only the disk cache of query and baseline vectors, which no trial changes.

- `grid`: `tune --grid paper`: the paper's 24 configs and the baseline, every trial scored on every
  tuning structure (the tuning passages, their crops, openings and packed passages), never pruned: the yardstick.
- `tpe`: the previous default: 16 TPE trials on the tuning passages alone (no structures, no pruning,
  no reversal or drift constraint), ranked by the tuning PSI.
- `robust`: the previous default: 16 TPE trials whose objective is the worst PSI over the structures,
  with the reversal and drift constraints, pruned between structures (`--budget none`).
- `robust-third`: the default, the robust search within `--budget grid/3`, drawn by the cost-aware
  TPE (`tuner.tuning.sampler`) after the references and the paper default's cheaper siblings: it ends at
  the first trial drawn that one third of the grid's layer-tokens (estimated for this model and data before
  the study) has no room for.
- `random-start-third`: the same with `--no-paper-siblings`: random start-up draws after the references.
- `tpe-third` and `gp-third`: the default search and budget drawn by `--sampler tpe` (TPE without the cost)
  and `--sampler gp` (Optuna's GPSampler, constrained log-EI): the samplers side by side.

Per arm and seed: the study's layer-tokens (padded tokens × layers run, every trial and rung; held-out
scoring apart) and its winner on each held-out set, beside the paper default's (read from the `summary.json` the
study's parent run keeps). The arms share a disk cache, so only the first study
encodes the baselines and queries (its `setup_layer_tokens/…` attribute); every arm is charged that same
setup beside its trials, as a study on a fresh machine would be: PSI as a ratio to the uncalibrated PSI there, ΔHM
and ΔnDCG@10 with 95% paired-bootstrap intervals, and end − begin (nDCG@10 points; > 0: the end favoured).
Nothing is simulated: every figure is from encoded vectors.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks import record

ARMS = ("grid", "tpe", "robust", "robust-third", "random-start-third", "tpe-third", "gp-third")
SAMPLER_ARMS = {"robust-third": "cost-tpe", "random-start-third": "cost-tpe", "tpe-third": "tpe", "gp-third": "gp"}
"""The arms within the default budget, by the sampler that draws them."""
ARM_COMMANDS = {
    "robust-third": "plain `tune`",
    "random-start-third": "`--no-paper-siblings`",
    "tpe-third": "`--sampler tpe`",
    "gp-third": "`--sampler gp`",
}
HELDOUT = "wikipos-test,wikipos-sentences,wikipos-mixed,wikipos-lengths"


def settings_for(arm: str, seed: int, folder: Path, args: argparse.Namespace):
    from tuner.common.options import Budget
    from tuner.tuning.settings import TuneSettings

    base = TuneSettings(
        model=args.model,
        dataset=args.dataset,
        heldout=args.heldout,
        seed=seed,
        trials=args.trials,
        storage=f"sqlite:///{folder / 'optuna.db'}",
        tracking_uri=f"sqlite:///{folder / 'mlflow.db'}",
        output=folder / "winner.yaml",
        profile_docs=args.profile_docs,
        bootstrap=args.bootstrap,
        max_ndcg_drop=args.max_ndcg_drop,
    )
    if arm == "grid":
        return replace(base, grid="paper", prune=False)
    if arm == "tpe":
        return replace(base, structures=False, prune=False, max_reversal=None, max_drift=None, budget=None)
    if arm == "robust":
        return replace(base, budget=None)
    return replace(
        base, budget=Budget.parse("grid/3"), sampler=SAMPLER_ARMS[arm], paper_siblings=arm != "random-start-third"
    )


def heldout_cells(folder: Path) -> dict[str, object]:
    """The winner's and the paper default's rows of the study's held-out table, as cells against no calibration.

    Read from the `summary.json` the study's parent MLflow run keeps in FOLDER, so a record can be filled again
    from the stores `--keep` left. The paper default is None where it won (its row is the winner's)."""
    import mlflow

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    (parent,) = [r for r in client.search_runs(experiments) if "posfair.outcome" in r.data.tags]
    rows = json.loads(
        Path(
            mlflow.artifacts.download_artifacts(
                run_id=parent.info.run_id, artifact_path="summary.json", tracking_uri=uri
            )
        ).read_text()
    )
    baseline, winner = rows[0], rows[-1]
    default = next((r for r in rows[1:-1] if r["label"] == "Paper default"), None)
    return {
        "heldout": _cells(baseline, winner),
        "paper_default": {"config": _knobs(default["config"]), "heldout": _cells(baseline, default)}
        if default
        else None,
    }


def _cells(baseline: dict[str, Any], row: dict[str, Any]) -> dict[str, dict[str, object]]:
    """PSI as a ratio to no calibration's, ΔHM and ΔnDCG@10 with their intervals (points), end − begin (points)."""
    from objectives.bootstrap import Interval

    cells = {}
    for name, held in row["heldout"].items():
        metrics, intervals = held["metrics"], held["intervals"] or {}
        base = baseline["heldout"][name]["metrics"]["psi"]
        groups = [k.removeprefix("n_") for k in metrics if k.startswith("n_") and k != "n_queries"]  # in position order
        cells[name] = {
            "psi_ratio": metrics["psi"] / base if base else float("nan"),
            "hm_delta": Interval(*intervals["hm"]).format() if intervals.get("hm") else "",
            "ndcg_delta": Interval(*intervals["ndcg10"]).format() if intervals else "",
            "end_minus_begin": 100 * (metrics[f"ndcg10_{groups[-1]}"] - metrics[f"ndcg10_{groups[0]}"]),
            "psi": metrics["psi"],
            # the bootstrap SE of the PSI change against no calibration, from its 95% interval (NaN without one)
            "psi_se": (intervals["psi"][2] - intervals["psi"][1]) / (2 * 1.96)
            if intervals.get("psi")
            else float("nan"),
            "tilt": metrics["tilt"],
        }
    return cells


def _knobs(config: dict[str, Any]) -> dict[str, object]:
    return {k: config[k] for k in ("variant", "strength", "layers", "basket_size")}


def run_arm(arm: str, seed: int, args: argparse.Namespace) -> dict[str, object]:
    import optuna

    from tuner.common.trials import counted
    from tuner.tuning.accounts import setup_layer_tokens, study_layer_tokens
    from tuner.tuning.run import tune

    with contextlib.ExitStack() as stack:
        if args.keep:  # the stores stay for the benchmarks that read studies (drift_law, rung_order)
            folder = args.keep / f"{arm}-seed{seed}"
            folder.mkdir(parents=True, exist_ok=True)
        else:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"posfair-search-cost-{arm}-")))
        settings = settings_for(arm, seed, folder, args)
        started = datetime.now()
        outcome = tune(settings)
        if outcome is None:  # another process concluded it: what it measured is in its record, not this one's
            raise SystemExit(f"{folder}: this study was concluded by another run; fill a record from it with --reread")
        study = optuna.load_study(study_name=outcome.study, storage=settings.storage)
        seconds = study_seconds(study, started)
        states = [t.state.name for t in study.trials]
        setup = setup_layer_tokens(study)
        return {
            "arm": arm,
            "seed": seed,
            "trials": sum(counted(t) for t in study.trials),
            "seconds": round(seconds, 1),
            "layer_tokens": study_layer_tokens(study) - setup,  # the trials'; the setup below
            "setup_layer_tokens": setup,
            **priced(study),
            "pruned": states.count("PRUNED"),
            "model_draws": model_draws(study, arm),
            "paper_default_layer_tokens": paper_default_cost(study),
            "winner": outcome.winner_trial,
            "config": _knobs(outcome.config.model_dump()),
            **heldout_cells(folder),
        }


def study_seconds(study, started: datetime) -> float:
    """The study's wall time to now: from this run's start or, for a study resumed from a store an earlier run was
    stopped in, from its first trial's start (Optuna's naive local times, as `datetime.now()` gives)."""
    first = min((t.datetime_start for t in study.trials if t.datetime_start is not None), default=started)
    return (datetime.now() - min(first, started)).total_seconds()


def model_draws(study, arm: str) -> int:
    """The trials the sampler's model drew and the study ran: not queued (the references and siblings, λ
    bisection's), past the start-up, which TPE counts in complete and pruned trials and GPSampler in complete ones
    alone, and not left unrun because the budget was spent."""
    from optuna.trial import TrialState

    from tuner.common.trials import never_ran
    from tuner.tuning.sampler import STARTUP_TRIALS

    if arm not in SAMPLER_ARMS:
        return 0
    counts = (TrialState.COMPLETE,) if SAMPLER_ARMS[arm] == "gp" else (TrialState.COMPLETE, TrialState.PRUNED)
    drawn, seen = 0, 0
    for trial in sorted(study.trials, key=lambda t: t.number):  # one process: a trial starts after the last ended
        if "fixed_params" not in trial.system_attrs and not never_ran(trial) and seen >= STARTUP_TRIALS:
            drawn += 1
        seen += trial.state in counts
    return drawn


def paper_default_cost(study) -> int:
    """What the paper default's trial spent (0 where the study ran none): a reference every study pays for."""
    return sum(
        int(t.user_attrs.get("layer_tokens", 0)) for t in study.trials if t.user_attrs.get("role") == "paper default"
    )


def priced(study) -> dict[str, object]:
    """What the study's `--budget` priced on this data as on a fresh machine: the paper grid's study and the
    baselines and queries (a study that found them in the disk cache measured less)."""
    from tuner.common.budget import BUDGET_ATTR

    budget = study.user_attrs.get(BUDGET_ATTR) or {}
    return {"grid_layer_tokens": budget.get("grid"), "setup_priced": budget.get("setup")}


def reread(path: Path, keep: Path) -> None:
    """Fill what a record written by an earlier version lacks (the priced budget, the paper default's row)
    from the stores `--keep` left."""
    import optuna

    data = record.read(path)
    for study in data["results"]["studies"]:
        folder = keep / f"{study['arm']}-seed{study['seed']}"
        url = f"sqlite:///{folder / 'optuna.db'}"
        stored = optuna.load_study(study_name=optuna.get_all_study_names(url)[0], storage=url)
        study.update(
            priced(stored),
            model_draws=model_draws(stored, study["arm"]),
            paper_default_layer_tokens=paper_default_cost(stored),
        )
        study.update(heldout_cells(folder))
    record.amend(path, data)


def table(results: list[dict[str, Any]]) -> str:
    """The docs' tables, each narrow enough to read at a laptop's width: one row per arm and seed (what it spent and
    pruned, the wall time it took on the machine that ran it, its winner), then per held-out set each winner's and
    the paper default's change against no calibration."""
    from tuner.evaluation.cost import duration

    sets = sorted({name for r in results for name in r["heldout"]})
    lines = [
        "| arm | seed | layer-tokens on a fresh machine (× grid) | pruned | time here | winner |",
        "|---|---:|---:|---:|---:|---|",
    ]
    setup = fresh_setup(results)
    ran = grid_as_run(results, setup)
    for r in results:
        cost = r["layer_tokens"] + setup
        grid = ran or r.get("grid_layer_tokens")  # the grid as run, else as priced by the study's budget
        share = f" ({cost / grid:.2f}×)" if grid else ""
        lines.append(
            f"| {r['arm']} | {r['seed']} | {cost:,}{share} | {r['pruned']} | {duration(r['seconds'])} "
            f"| trial {r['winner']}: {_named(r['config'])} |"
        )
    # the same config and sets in every study: the first study that ran it beside its winner speaks for all
    default = next((r["paper_default"] for r in results if r.get("paper_default")), None)
    if default:
        lines.append(f"| paper default | | | | | {_named(default['config'])} |")
    for name in sets:
        lines += [
            "",
            f"Held out, {name.removeprefix('wikipos-')}: PSI as a share of no calibration's, "
            "ΔHM and ΔnDCG@10 (95% intervals) and end − begin (nDCG@10 points):",
            "",
            "| arm | seed | PSI× | ΔHM | ΔnDCG@10 | end−begin |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        lines += [f"| {r['arm']} | {r['seed']} | {_set_cells(r['heldout'].get(name))}" for r in results]
        if default:
            lines.append(f"| paper default | | {_set_cells(default['heldout'].get(name))}")
    return "\n".join(lines)


def fresh_setup(results: list[dict[str, Any]]) -> int:
    """The baselines and queries: what the first study encoded, or as priced for a fresh machine where the disk
    cache held them."""
    return max(max(r["setup_layer_tokens"], r.get("setup_priced") or 0) for r in results)


def grid_as_run(results: list[dict[str, Any]], setup: int) -> int | None:
    """The grid's study with the setup, as it ran; None where it did not."""
    return next((r["layer_tokens"] + setup for r in results if r["arm"] == "grid"), None)


def sampler_table(results: list[dict[str, Any]]) -> str:
    """The docs' sampler table: per arm, what its seeds spent and how their winners compare with the grid's on
    each held-out set, and how far apart the seeds' winners land there."""
    grid = next((r for r in results if r["arm"] == "grid"), None)
    sets = sorted({name for r in results for name in r["heldout"]})
    setup = fresh_setup(results)
    grid_cost = grid_as_run(results, setup) or results[0]["grid_layer_tokens"]  # as run, else as the budget priced it
    arms = [a for a in SAMPLER_ARMS if any(r["arm"] == a for r in results)]
    lines = [
        "| | " + " | ".join(f"{a}: {ARM_COMMANDS[a]}" for a in arms) + " |",
        "|---|" + "---:|" * len(arms),
    ]

    def row(title: str, cell) -> None:
        lines.append(f"| {title} | " + " | ".join(cell([r for r in results if r["arm"] == a]) for a in arms) + " |")

    def share(rs: list[dict[str, Any]]) -> str:
        shares = [(r["layer_tokens"] + setup) / grid_cost for r in rs]
        return f"{sum(shares) / len(shares):.2f}× ({min(shares):.2f}–{max(shares):.2f})"

    def before_search(rs: list[dict[str, Any]]) -> str:
        default = max(r.get("paper_default_layer_tokens", 0) for r in rs)
        return f"{setup / grid_cost:.2f}× · {default / grid_cost:.2f}×"

    row("seeds", lambda rs: ", ".join(str(r["seed"]) for r in rs))
    row("layer-tokens on a fresh machine, × the grid's: mean (range)", share)
    row("of which the baselines and queries · the paper default's trial", before_search)
    row("trials run (pruned)", lambda rs: ", ".join(f"{r['trials']} ({r['pruned']})" for r in rs))
    row("trials the sampler's model drew and ran", lambda rs: ", ".join(str(r.get("model_draws", "?")) for r in rs))
    row("winners", lambda rs: "; ".join(_named(r["config"]) for r in rs))
    for name in sets:
        label = name.removeprefix("wikipos-")
        row(
            f"{label}: PSI × uncalibrated, per seed",
            lambda rs, n=name: ", ".join(f"{r['heldout'][n]['psi_ratio']:.2f}" for r in rs),
        )
        row(f"{label}: seeds' PSI spread ÷ its bootstrap SE", lambda rs, n=name: _spread(rs, n))
        if grid:
            row(f"{label}: seeds at least as good as the grid's winner", lambda rs, n=name: _as_good(rs, grid, n))
    lines.append("")
    if grid:
        lines.append(
            f"The grid's winner: {_named(grid['config'])}; {grid_cost:,} layer-tokens. "
            "At least as good: on that held-out set, the winner's ΔHM and ΔnDCG@10 are no lower than the grid winner's "
            "95% intervals and its PSI no higher than the grid winner's plus 1.96 bootstrap SE. "
        )
    lines.append(
        "Spread ÷ SE: the largest minus the smallest of the seeds' held-out PSI, divided by the median bootstrap SE "
        "of their PSI change against no calibration (≤ 1: the seeds agree within one SE)."
    )
    return "\n".join(lines)


def _spread(results: list[dict[str, Any]], name: str) -> str:
    psi = [r["heldout"][name]["psi"] for r in results]
    ses = sorted(r["heldout"][name]["psi_se"] for r in results)
    return f"{(max(psi) - min(psi)) / ses[len(ses) // 2]:.1f}"


def _as_good(results: list[dict[str, Any]], grid: dict[str, Any], name: str) -> str:
    g = grid["heldout"][name]
    good = 0
    for r in results:
        h = r["heldout"][name]
        good += (
            _point(h["hm_delta"]) >= _interval(g["hm_delta"])[0]
            and _point(h["ndcg_delta"]) >= _interval(g["ndcg_delta"])[0]
            and h["psi"] <= g["psi"] + 1.96 * g["psi_se"]
        )
    return f"{good} of {len(results)}"


def _point(cell: str) -> float:
    """'+2.71 [+1.96, +3.51]' → 2.71 (an empty cell, no interval: 0, no change)."""
    return float(cell.split()[0]) if cell else 0.0


def _interval(cell: str) -> tuple[float, float]:
    """'+2.71 [+1.96, +3.51]' → (1.96, 3.51)."""
    low, high = cell[cell.index("[") + 1 : cell.index("]")].split(",")
    return float(low), float(high)


def _named(config: dict[str, Any]) -> str:
    if not config["strength"]:
        return "no calibration"
    return f"{config['variant']} λ {config['strength']:.2f} L{config['layers']} B{config['basket_size']}"


def _set_cells(held: dict[str, Any] | None) -> str:
    """One held-out set's cells of a row: PSI×, ΔHM, ΔnDCG@10, end − begin (empty where the set was not scored)."""
    if held is None:
        return " | | | |"
    return f"{held['psi_ratio']:.2f}× | {held['hm_delta']} | {held['ndcg_delta']} | {held['end_minus_begin']:+.1f} |"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's arguments (`benchmarks.natural` runs an arm with them too)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--dataset", default="wikipos-dev")
    parser.add_argument("--heldout", default=HELDOUT)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--profile-docs", type=int, default=8)
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument(
        "--max-ndcg-drop",
        type=float,
        default=0.0,
        help="`tune --max-ndcg-drop` (0-1 scale; 0.005: half a point of nDCG@10)",
    )
    parser.add_argument(
        "--keep", type=Path, help="keep each study's stores in FOLDER/ARM-seedN (default: a temporary folder)"
    )
    parser.add_argument("--json", type=Path, help="write the record here (docs/results/…), rewritten after every study")
    parser.add_argument(
        "--reread",
        type=Path,
        metavar="KEEP",
        help="only fill the --json record's priced budgets and held-out rows from KEEP's stores",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.reread:
        reread(args.json, args.reread)
        return 0

    from tuner.tuning.library_logs import quiet_libraries

    quiet_libraries()
    results = []
    # seed by seed across the arms, so that a run cut short leaves them compared on the same seeds; the grid last
    # (it draws nothing: one seed is all seeds)
    runs = [(arm, seed) for seed in args.seeds for arm in args.arms if arm != "grid"] + [("grid", args.seeds[0])] * (
        "grid" in args.arms
    )
    for arm, seed in runs:
        results.append(run_arm(arm, seed, args))
        print(json.dumps(results[-1]), flush=True)
        if args.json:  # a long run leaves what it has measured so far
            command = "python -m benchmarks.search_cost " + " ".join(sys.argv[1:] if argv is None else argv)
            record.write(
                args.json, "search_cost", command, {"model": args.model, "dataset": args.dataset, "studies": results}
            )
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
