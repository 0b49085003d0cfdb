"""How sharply a tuning design tells the candidate configs apart, per layer-token it costs (MiniLM by default).

Run from the repository root:

    .venv/bin/python -m benchmarks.tuning_signal --json docs/results/tuning-signal-minilm.json
    .venv/bin/python -m benchmarks.tuning_signal --designs descriptions both squad:squad-tune   # add the natural set

A fixed set of candidate configs (the families the default studies choose between: CLS-Soft B128 at λ 0.5 on
the last layer, λ 0.5-0.65 on the last two, the paper default) is scored on each tuning design exactly as a study
scores a trial: PSI per structure with its common query resamples (`objectives.evidence`), the objective the worst
PSI over the structures resample by resample. For every pair of candidates: the gap between their objectives and
the paired standard error of that gap, which is what selection's one-SE band is made of. Cost: the layer-tokens of
one trial of each candidate (its passages, every structure) and of the setup (the uncalibrated passages once, the
queries once), padded tokens × layers as the study counts them.

Designs over WikiPos-dev and its structures (crops, openings, packed), the same passages in each:
`descriptions` (today: the short description asks for its summary), `titles` (the article title asks for it),
`both` (both queries over the same passages). `squad:NAME`: a natural set's windows (with its length halves).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import record

CANDIDATES = {
    "λ0.5 L[5]": {"strength": 0.5, "layers": "last:1"},
    "λ0.5 L[4,5]": {"strength": 0.5, "layers": "last:2"},
    "λ0.6 L[4,5]": {"strength": 0.6, "layers": "last:2"},
    "λ0.65 L[4,5]": {"strength": 0.65, "layers": "last:2"},
    "paper default": {},
}
WIKIPOS_DESIGNS = ("descriptions", "titles", "both")
STRUCTURES = ("crops", "openings", "packed")


def restrict(per_query: Any, keep: set[str]) -> Any:
    """The rows of `per_query` whose query is in `keep` (the same order)."""
    rows = np.array([qid in keep for qid in per_query.query_ids])
    return replace(
        per_query,
        query_ids=tuple(q for q in per_query.query_ids if q in keep),
        ndcg10=per_query.ndcg10[rows],
        recall10=per_query.recall10[rows],
        membership=per_query.membership[rows],
        stratum_membership=per_query.stratum_membership[rows],
        positions=None if per_query.positions is None else per_query.positions[rows],
        placed=None if per_query.placed is None else per_query.placed[rows],
    )


def query_layer_tokens(model: Any, texts: list[str]) -> int:
    from tuner.engine.batching import Batches, choose_batching

    batch_size, _ = choose_batching(model)
    batches = Batches.build(model, texts, batch_size)
    return batches.layer_tokens(range(len(batches)), model.num_layers)


def score_structures(model: Any, datasets: list[Any], configs: dict[str, Any]) -> list[dict[str, Any]]:
    """Per structure: the baseline's and every config's per-query scores, and each config's layer-tokens."""
    from tuner.engine.prefix import starting_layers
    from tuner.evaluation.evaluator import Evaluator

    out = []
    for dataset in datasets:
        evaluator = Evaluator(model, dataset, prefix_layers=starting_layers(configs.values(), model.num_layers))
        baseline = evaluator.run(None)
        runs = {name: evaluator.run(config) for name, config in configs.items()}
        print(f"  {dataset.name}: {len(dataset.corpus)} passages, {len(dataset.queries)} queries scored", flush=True)
        out.append(
            {
                "dataset": dataset,
                "baseline": baseline.per_query,
                "runs": {name: run.per_query for name, run in runs.items()},
                "trial_layer_tokens": {name: run.layer_tokens for name, run in runs.items()},
                "passage_layer_tokens": baseline.layer_tokens,
            }
        )
    return out


def design_figures(model: Any, scored: list[dict[str, Any]], keep: set[str] | None) -> dict[str, Any]:
    """The objective of each candidate, and each pair's gap and paired SE, on the queries in `keep` (None: all)."""
    from objectives.evidence import trial_evidence

    objective: dict[str, np.ndarray] = {}
    per_structure: dict[str, dict[str, float]] = {}
    queries: list[str] = []
    for structure in scored:
        base = structure["baseline"] if keep is None else restrict(structure["baseline"], keep)
        queries += [structure["dataset"].queries[q] for q in base.query_ids]
        for name, per_query in structure["runs"].items():
            evidence = trial_evidence(base, per_query if keep is None else restrict(per_query, keep))
            row = np.concatenate([[evidence.objective], evidence.psi_resamples])
            objective[name] = row if name not in objective else np.fmax(objective[name], row)
            per_structure.setdefault(name, {})[structure["dataset"].name] = evidence.objective
    pairs = []
    for a, b in itertools.combinations(objective, 2):
        difference = objective[a][1:] - objective[b][1:]
        pairs.append(
            {"pair": [a, b], "gap": float(objective[a][0] - objective[b][0]), "paired_se": float(np.nanstd(difference))}
        )
    return {
        "queries": len(queries),
        "query_layer_tokens": query_layer_tokens(model, queries),
        "objective": {name: float(row[0]) for name, row in objective.items()},
        "objective_se": {name: float(np.nanstd(row[1:])) for name, row in objective.items()},
        "per_structure": per_structure,
        "pairs": pairs,
        "median_paired_se": float(np.median([p["paired_se"] for p in pairs])),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--designs", nargs="+", default=list(WIKIPOS_DESIGNS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from tuner.data import load_benchmark
    from tuner.data.registry import length_halves
    from tuner.data.wikipos import load_wikipos, load_wikipos_structure
    from tuner.engine.models import load_model

    model = load_model(args.model)
    configs = {name: model.default_config(**values) for name, values in CANDIDATES.items()}
    results: dict[str, Any] = {
        "model": args.model,
        "candidates": {k: str(v) for k, v in configs.items()},
        "designs": {},
    }
    wikipos = [d for d in args.designs if d in WIKIPOS_DESIGNS]
    if wikipos:  # one encoding of the passages serves every WikiPos design: they differ only in their queries
        datasets = [
            load_wikipos("dev", titles=True),
            *(load_wikipos_structure("dev", k, titles=True) for k in STRUCTURES),
        ]
        scored = score_structures(model, datasets, configs)
        for design in wikipos:
            keep = None
            if design != "both":
                keep = {q for d in datasets for q in d.queries if ("/t" in q) == (design == "titles")}
            results["designs"][design] = _with_cost(design_figures(model, scored, keep), scored)
    for design in (d for d in args.designs if d.startswith("squad:")):
        tuning = load_benchmark(design.removeprefix("squad:"))
        scored = score_structures(model, [tuning], configs)
        halves = length_halves(tuning)  # the same corpus: the study's other structures for a set like this
        for half in halves:
            keep_half = set(half.queries)
            scored.append(
                {
                    **scored[0],
                    "dataset": half,
                    "baseline": restrict(scored[0]["baseline"], keep_half),
                    "runs": {name: restrict(pq, keep_half) for name, pq in scored[0]["runs"].items()},
                    "trial_layer_tokens": dict.fromkeys(configs, 0),
                    "passage_layer_tokens": 0,
                }
            )
        results["designs"][design] = _with_cost(design_figures(model, scored, None), scored)
    for name, figures in results["designs"].items():
        print(
            f"{name}: {figures['queries']} queries, median paired SE {figures['median_paired_se']:.4f}, "
            f"paper-default trial {figures['trial_layer_tokens']['paper default']:,} layer-tokens",
            flush=True,
        )
    if args.json:
        record.write(
            args.json, "tuning_signal", "python -m benchmarks.tuning_signal " + " ".join(argv or sys.argv[1:]), results
        )
    return 0


def _with_cost(figures: dict[str, Any], scored: list[dict[str, Any]]) -> dict[str, Any]:
    """A design's figures with what it costs: each candidate's trial over every structure, and the setup."""
    trial = {name: sum(s["trial_layer_tokens"][name] for s in scored) for name in scored[0]["runs"]}
    passages = sum(s["passage_layer_tokens"] for s in scored)
    return {**figures, "trial_layer_tokens": trial, "setup_layer_tokens": passages + figures["query_layer_tokens"]}


if __name__ == "__main__":
    sys.exit(main())
