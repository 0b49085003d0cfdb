"""What a study's rung order costs: replay its stored trials under other orders.

Run from the repository root, on studies `tune` has run (MiniLM on WikiPos-dev by default):

    .venv/bin/python -m benchmarks.rung_order mlruns/optuna.db                 # every study in that storage
    .venv/bin/python -m benchmarks.rung_order /tmp/seed0/mlruns/optuna.db /tmp/seed1/mlruns/optuna.db

Each stored trial keeps its figures on every structure it was scored on (`structures`: PSI and its standard
error, nDCG@10 change, tilt and reversal). The replay walks the trials in their order and stops each one where
the study's own rule would (`objectives.robustness.prune_reason`, with the selection threshold of the trials
replayed as complete before it and the constraints its rungs decide), under each order of the structures; a
trial the stored study pruned counts as stopped after the first rung it has no figures for, that rung
charged (where the replayed order reaches such a rung, its figure is an estimate: the trial may have stopped
a rung earlier or gone on). Costs are the rungs'
padded tokens per layer (the evaluators' batches) times the layers the trial's depth runs, plus the profile of
a complete trial. The draws are the stored study's: in a real study pruned trials report other values to
TPE, which then draws other trials, so this ranks orders; it does not predict a study's cost.
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections.abc import Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from objectives.constraint import Constraints
from objectives.evidence import TrialEvidence
from objectives.robustness import MARGIN_Z, RobustEvidence, StructureEvidence, prune_reason
from objectives.selection import Candidate, select
from tuner.common.trials import DUPLICATE_ATTR, named_constraints

TUNING_CONSTRAINTS = ("hm_floor", "ndcg_drop")  # decided by the tuning passages' rung


def corpus_costs(model: str, tuning: str) -> tuple[dict[str, int], str, int]:
    """Padded tokens per layer of each corpus a trial encodes (the tuning passages and their other structures),
    the tuning passages' name and the model's depth."""
    from tuner.data import load_benchmark, load_structures
    from tuner.engine.models import load_model
    from tuner.evaluation.evaluator import Evaluator

    loaded = load_model(model)
    dataset = load_benchmark(tuning)
    costs = {}
    for d in [dataset, *load_structures(tuning, dataset)]:
        if d.corpus is dataset.corpus and d is not dataset:
            continue  # a length half: scored from the tuning vectors
        batches = Evaluator(loaded, d, disk_cache=False, cache_budget=0).batches()
        costs[d.name] = batches.layer_tokens(range(len(batches)), 1)
    return costs, dataset.name, loaded.num_layers


def layers_run(trial: FrozenTrial, num_layers: int) -> int:
    """The layers a trial's passes run: from its first calibrated layer on (its inputs are cached); none for λ 0."""
    from tuner.calibration import CalibrationConfig
    from tuner.tuning.search_space import DEPTHS

    if float(trial.params.get("strength", 0.0)) == 0.0:
        return 0
    return num_layers - min(CalibrationConfig(layers=DEPTHS[str(trial.params["depth"])]).resolve_layers(num_layers))


def evidence(row: dict[str, float]) -> TrialEvidence:
    """A stored structure row as the rule reads it (the reversal's sign gives the uncalibrated direction)."""
    tilt, reversal = row.get("tilt"), row.get("reversal")
    # reversal = −sign × tilt
    baseline = None if tilt is None or reversal is None else (-1.0 if math.isclose(reversal, tilt) else 1.0)
    return TrialEvidence(
        row["psi"],
        row["psi_se"],
        row["hm"],
        float("nan"),
        row["ndcg10_delta"],
        float("nan"),
        row["ndcg10_delta_high"],
        tilt,
        0.0,
        baseline,
    )


def replay(
    trials: Sequence[FrozenTrial],
    order: Sequence[str],
    tuning: str,
    costs: dict[str, int],
    num_layers: int,
    profile: int,
    z: float,
) -> tuple[int, list[int], list[int]]:
    """(layer-tokens, trials stopped early, the trials eligible under the one-SE rule) of the trials under `order`."""
    complete: list[Candidate] = []
    total, stopped = 0, []
    for trial in trials:
        rows = trial.user_attrs.get("structures", {})
        runs = layers_run(trial, num_layers)
        reference = trial.number < 2
        selection = select(complete)
        threshold = None if selection is None else selection.threshold
        seen: list[StructureEvidence] = []
        constraints = named_constraints(trial)
        stop = False
        for step, name in enumerate(order):
            if seen and not reference:
                robust = RobustEvidence(tuple(seen))
                decided = {k: v for k, v in _decided(robust, constraints, seen).items() if v > 0}
                if prune_reason(robust, threshold, list(decided), order[step:], z) is not None:
                    stop = True
                    break
            if name not in rows:  # the stored study pruned it before this rung: charged, then stopped
                total += runs * costs[name]
                stop = True
                break
            total += runs * costs[name]
            seen.append(StructureEvidence(name, evidence(rows[name]), tuning=name == tuning))
        if stop:
            stopped.append(trial.number)
            continue
        total += profile  # every complete trial encodes its attention profile, the baseline's too
        robust = RobustEvidence(tuple(seen))
        drift = trial.user_attrs.get("drift", 0.0)
        complete.append(
            Candidate(trial.number, robust.objective, robust.objective_se, drift, tuple(constraints.values()))
        )
    selection = select(complete)
    return total, stopped, list(selection.eligible) if selection else []


def _decided(robust: RobustEvidence, constraints: dict[str, float], seen: list[StructureEvidence]) -> dict[str, float]:
    """The constraint values the rungs so far decide, as the study computes them under its default limits (a
    reversal on any structure, a significant nDCG@10 loss on one beside the tuning passages), and the tuning
    passages' own as the study stored them, once those are scored."""
    values = Constraints(hm_floor=0.0).values(
        None, None, None, reversal=robust.reversal(), partial=True, structure_ndcg_loss=robust.significant_ndcg_loss()
    )
    if any(s.tuning for s in seen):
        values |= {k: v for k, v in constraints.items() if k in TUNING_CONSTRAINTS}
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("storages", nargs="+", help="SQLite study storages (optuna.db) of `tune` runs")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--dataset", default="wikipos-dev")
    parser.add_argument("--margins", nargs="+", type=float, default=[MARGIN_Z, 0.5])
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    costs, tuning, num_layers = corpus_costs(args.model, args.dataset)
    print("padded tokens per layer:", {k: f"{v:,}" for k, v in costs.items()})
    for path in args.storages:
        storage = f"sqlite:///{path}"
        for summary in optuna.get_all_study_summaries(storage):
            study = optuna.load_study(study_name=summary.study_name, storage=storage)
            if not study.trials:
                continue
            trials = [
                t
                for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
                if DUPLICATE_ATTR not in t.user_attrs and "structures" in t.user_attrs
            ]
            stored = sum(t.user_attrs.get("layer_tokens", 0) for t in study.trials)
            profile = study.trials[0].user_attrs.get("layer_tokens", 0)  # the baseline trial encodes its profile only
            print(f"\n{summary.study_name} ({path}): {len(trials)} trials, {stored:,} layer-tokens as run")
            print("| order | margin | layer-tokens | stopped early | eligible |\n|---|---:|---:|---|---|")
            for order, z in itertools.product(itertools.permutations(costs), args.margins):
                total, stopped, eligible = replay(trials, order, tuning, costs, num_layers, profile, z)
                print(f"| {', '.join(order)} | {z:g} SE | {total:,} | {stopped} | {eligible} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
