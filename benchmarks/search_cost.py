"""What a study costs and what its winner is worth: the paper's grid against TPE, with and without the
robust, pruned search (MiniLM on WikiPos-dev by default).

Run from the repository root:

    .venv/bin/python -m benchmarks.search_cost                          # every arm, seeds 0 1 2, all held-out sets
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
  TPE (`tuner.tuning.sampler`): it ends at the first trial drawn that one third of the grid's
  layer-tokens (estimated for this model and data before the study) has no room for.

Per arm and seed: the study's layer-tokens (padded tokens × layers run, every trial and rung; held-out
scoring apart) and its winner on each held-out set. The arms share a disk cache, so only the first study
encodes the baselines and queries (its `setup_layer_tokens/…` attribute); every arm is charged that same
setup beside its trials, as a study on a fresh machine would be: PSI as a ratio to the uncalibrated PSI there, ΔHM
and ΔnDCG@10 with 95% paired-bootstrap intervals, and end − begin (nDCG@10 points; > 0: reversed).
Nothing is simulated: every figure is from encoded vectors.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from benchmarks import record

ARMS = ("grid", "tpe", "robust", "robust-third")
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
    )
    if arm == "grid":
        return replace(base, grid="paper", prune=False)
    if arm == "tpe":
        return replace(base, structures=False, prune=False, max_reversal=None, max_drift=None, budget=None)
    if arm == "robust":
        return replace(base, budget=None)
    return replace(base, budget=Budget.parse("grid/3"))


def heldout_cells(outcome) -> dict[str, dict[str, object]]:
    """The winner's row on each held-out set against the uncalibrated row."""
    baseline, winner = outcome.rows[0], outcome.rows[-1]
    cells = {}
    for name, held in winner.heldout.items():
        base = baseline.heldout[name].report
        report, delta = held.report, held.delta
        groups = list(report.group_ndcg10)
        cells[name] = {
            "psi_ratio": report.psi / base.psi if base.psi else float("nan"),
            "hm_delta": delta.hm.format() if delta and delta.hm else "",
            "ndcg_delta": delta.ndcg10.format() if delta else "",
            "end_minus_begin": 100 * (report.group_ndcg10[groups[-1]] - report.group_ndcg10[groups[0]]),
            "tilt": report.tilt,
        }
    return cells


def run_arm(arm: str, seed: int, args: argparse.Namespace) -> dict[str, object]:
    import optuna

    from tuner.common.trials import counted
    from tuner.tuning.conclusion import setup_layer_tokens, study_layer_tokens
    from tuner.tuning.run import tune

    with contextlib.ExitStack() as stack:
        if args.keep:  # the stores stay for the benchmarks that read studies (drift_law, rung_order)
            folder = args.keep / f"{arm}-seed{seed}"
            folder.mkdir(parents=True, exist_ok=True)
        else:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"posfair-search-cost-{arm}-")))
        settings = settings_for(arm, seed, folder, args)
        start = time.perf_counter()
        outcome = tune(settings)
        seconds = time.perf_counter() - start
        study = optuna.load_study(study_name=outcome.study, storage=settings.storage)
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
            "winner": outcome.winner_trial,
            "config": outcome.config.model_dump(include={"variant", "strength", "layers", "basket_size"}),
            "heldout": heldout_cells(outcome),
        }


def priced(study) -> dict[str, object]:
    """What the study's `--budget` priced on this data as on a fresh machine: the paper grid's study and the
    baselines and queries (a study that found them in the disk cache measured less)."""
    from tuner.common.budget import BUDGET_ATTR

    budget = study.user_attrs.get(BUDGET_ATTR) or {}
    return {"grid_layer_tokens": budget.get("grid"), "setup_priced": budget.get("setup")}


def reread_budgets(path: Path, keep: Path) -> None:
    """Fill `priced` into a record written before it was recorded, from the stores `--keep` left."""
    import optuna

    data = record.read(path)
    for study in data["results"]["studies"]:
        folder = keep / f"{study['arm']}-seed{study['seed']}"
        url = f"sqlite:///{folder / 'optuna.db'}"
        study.update(priced(optuna.load_study(study_name=optuna.get_all_study_names(url)[0], storage=url)))
    record.amend(path, data)


def table(results: list[dict[str, object]]) -> str:
    """The README's table: one row per arm and seed."""
    sets = sorted({name for r in results for name in r["heldout"]})  # type: ignore[union-attr]
    lines = [
        "| arm | seed | layer-tokens on a fresh machine (× grid) | pruned | winner | "
        + " | ".join(f"{s.removeprefix('wikipos-')}: PSI× · ΔHM · ΔnDCG@10 · end−begin" for s in sets)
        + " |",
        "|---|---:|---:|---:|---|" + "---|" * len(sets),
    ]
    # the baselines and queries: what the first study encoded, or as priced for a fresh machine where the disk cache held them
    setup = max(max(r["setup_layer_tokens"], r.get("setup_priced") or 0) for r in results)  # type: ignore[type-var]
    ran = next((r["layer_tokens"] + setup for r in results if r["arm"] == "grid"), None)  # type: ignore[operator]
    for r in results:
        c = r["config"]
        cost = r["layer_tokens"] + setup  # type: ignore[operator]
        grid = ran or r.get("grid_layer_tokens")  # the grid as run, else as priced by the study's budget
        share = f" ({cost / grid:.2f}×)" if grid else ""  # type: ignore[operator]
        cells = []
        for s in sets:
            h = r["heldout"].get(s)  # type: ignore[union-attr]
            cells.append(f"{h['psi_ratio']:.2f}× · {h['hm_delta']} · {h['ndcg_delta']} · {h['end_minus_begin']:+.1f}" if h else "")
        config = f"{c['variant']} λ {c['strength']:.2f} L{c['layers']} B{c['basket_size']}" if c["strength"] else "no calibration"
        lines.append(
            f"| {r['arm']} | {r['seed']} | {cost:,}{share} | {r['pruned']} | trial {r['winner']}: {config} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--dataset", default="wikipos-dev")
    parser.add_argument("--heldout", default=HELDOUT)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--profile-docs", type=int, default=8)
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--keep", type=Path, help="keep each study's stores in FOLDER/ARM-seedN (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="write the record here (docs/results/…), rewritten after every study")
    parser.add_argument(
        "--reread-budgets", type=Path, metavar="KEEP", help="only fill the --json record's priced budgets from KEEP's stores"
    )
    args = parser.parse_args(argv)
    if args.reread_budgets:
        reread_budgets(args.json, args.reread_budgets)
        return 0

    from tuner.tuning.worker import quiet_libraries

    quiet_libraries()
    results = []
    for arm in args.arms:
        for seed in args.seeds if arm != "grid" else args.seeds[:1]:  # the grid draws nothing: one seed is all seeds
            results.append(run_arm(arm, seed, args))
            print(json.dumps(results[-1]), flush=True)
            if args.json:  # a long run leaves what it has measured so far
                command = "python -m benchmarks.search_cost " + " ".join(sys.argv[1:] if argv is None else argv)
                record.write(args.json, "search_cost", command, {"model": args.model, "dataset": args.dataset, "studies": results})
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
