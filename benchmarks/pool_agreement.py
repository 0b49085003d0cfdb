"""Does the pooled screen rank configs as the full corpus does? (issue 21: validate the rung metric offline)

Run from the repository root:

    .venv/bin/python -m benchmarks.pool_agreement                       # MiniLM on WikiPos-dev, 24 + 8 configs
    .venv/bin/python -m benchmarks.pool_agreement --per-group 8 24      # other screens

Every config of the paper's grid and eight milder ones (λ 0.25 / 0.75 on the last layer and the last 50%,
basket 128, CLS-Soft and CLS-Hard) is encoded once over the full tuning corpus. Each pool (one per
--per-group value, from the uncalibrated ranking, as `tune` builds it) is then scored *simulated from those
vectors* (a passage's calibrated vector does not depend on which other passages are encoded), which is
exactly what a screen rung would encode. Printed: the pool's size, the candidates'
recall of the relevant passages, Kendall τ of the pool's PSI / HM with the corpus's over the configs, each
config's top-10 covered by the pool, and what the screen's pruning rule would do (configs pruned against the
others, and whether any of them is within one standard error of the best on the full corpus).
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
from scipy.stats import kendalltau

from tuner.common.options import SCREEN_QUERIES
from tuner.evaluation.pools import SCREEN_DEPTH


def configs(pooling: str, padding_side: str):
    from tuner.tuning.search_space import PAPER_GRID, SearchSpace, config_of

    grid = [dict(zip(PAPER_GRID, values)) for values in itertools.product(*PAPER_GRID.values())]
    grid = [p if p["variant"] == "cls_hard" else {k: v for k, v in p.items() if k != "weight"} for p in grid]
    grid = list({str(sorted(p.items())): p for p in grid}.values())
    milder = [
        {"strength": s, "depth": d, "basket_size": 128, "variant": v, **({"weight": 0.3} if v == "cls_hard" else {})}
        for s in (0.25, 0.75)
        for d in ("last", "50%")
        for v in ("cls_soft", "cls_hard")
    ]
    return [(p, config_of(p, SearchSpace().basket_shares[0], pooling, padding_side)) for p in grid + milder]  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--dataset", default="wikipos-dev")
    parser.add_argument(
        "--per-group",
        type=int,
        nargs="+",
        default=[4, 12, SCREEN_QUERIES],
        help="queries per position group in the screen, one pool per value",
    )
    parser.add_argument("--depth", type=int, default=SCREEN_DEPTH, help="candidates per reference ranking")
    args = parser.parse_args()

    from objectives.evidence import trial_evidence
    from tuner.data import load_benchmark
    from tuner.engine.models import load_model
    from tuner.evaluation.evaluator import Evaluator
    from tuner.tuning.search_space import SearchSpace

    model = load_model(args.model)
    dataset = load_benchmark(args.dataset)
    full = Evaluator(model, dataset, prefix_layers=SearchSpace().starting_layers(model.num_layers))
    base = full.run(None)
    rows = []
    for params, config in configs(model.spec.pooling, model.spec.padding_side):
        evaluation = full.run(config)
        rows.append((params, evaluation, full.document_vectors(config)[0], trial_evidence(base.per_query, evaluation.per_query)))
    print(
        f"{args.dataset}: {len(dataset.corpus)} passages, {len(dataset.queries)} queries, {len(rows)} configs encoded "
        f"over the corpus; pools simulated from those vectors (depth {args.depth}, the uncalibrated ranking)"
    )
    for per_group in args.per_group:
        report_pool(model, dataset, full, base, rows, per_group, args.depth)


def report_pool(model, dataset, full, base, rows, per_group: int, depth: int) -> None:
    """One pool's size, recall and rank agreement with the corpus over the configs, and what the rule would prune."""
    from objectives.evidence import trial_evidence
    from objectives.robustness import PRUNE_Z
    from tuner.evaluation.evaluator import Evaluator
    from tuner.evaluation.pools import balanced_queries, candidate_recall, pool, top

    screen = pool(dataset, [base.run], per_group, depth)
    sample = balanced_queries(dataset, per_group)
    pooled = Evaluator(model, screen)
    index = {d: i for i, d in enumerate(full.doc_ids)}
    keep = np.array([index[d] for d in pooled.doc_ids])
    pooled_base = pooled.score(full.baseline_vectors()[0][keep])
    measured = []
    for _, evaluation, documents, corpus_ev in rows:
        pool_ev = trial_evidence(pooled_base.per_query, pooled.score(documents[keep]).per_query)
        coverage = float(np.mean([len(set(top(evaluation.run[q], 10)) & set(screen.corpus)) / 10 for q in sample]))
        measured.append((corpus_ev, pool_ev, coverage))
    full_psi, pool_psi = [c.objective for c, _, _ in measured], [p.objective for _, p, _ in measured]
    tau_psi = kendalltau(full_psi, pool_psi).statistic
    tau_hm = kendalltau([c.hm for c, _, _ in measured], [p.hm for _, p, _ in measured]).statistic
    best = min(range(len(measured)), key=lambda i: full_psi[i])
    eligible = {i for i in range(len(measured)) if full_psi[i] <= full_psi[best] + measured[best][0].objective_se}
    threshold = min(p + m[1].objective_se for p, m in zip(pool_psi, measured))
    pruned = {i for i in range(len(measured)) if pool_psi[i] - PRUNE_Z * measured[i][1].objective_se > threshold}
    print(
        f"\n{per_group} queries per group: pool of {len(screen.queries)} queries over {len(screen.corpus)} passages "
        f"({len(screen.corpus) / len(dataset.corpus):.0%} of the corpus); candidates' recall of the relevant passages "
        f"{candidate_recall(dataset, sample, [base.run], depth):.3f}; every config's top 10 in the pool: min "
        f"{min(m[2] for m in measured):.2f}, mean {np.mean([m[2] for m in measured]):.2f}"
    )
    print(f"  Kendall τ with the corpus over {len(measured)} configs: PSI {tau_psi:.3f}, HM {tau_hm:.3f}")
    print(
        f"  the screen rule against the best screened config: {len(pruned)} of {len(measured)} pruned; of the "
        f"{len(eligible)} within one SE of the corpus's best PSI, pruned: {len(eligible & pruned)}"
    )
    for i, ((params, *_), (corpus_ev, pool_ev, coverage)) in enumerate(zip(rows, measured)):
        name = f"{params['variant']} λ{params['strength']} {params['depth']} B{params['basket_size']}"
        print(
            f"  {name:32s} PSI {corpus_ev.objective:.3f} / pool {pool_ev.objective:.3f} ± {pool_ev.objective_se:.3f}  "
            f"HM {100 * corpus_ev.hm:.2f} / pool {100 * pool_ev.hm:.2f}  top-10 in pool {coverage:.2f}"
            f"{'  pruned' if i in pruned else ''}{'  (within 1 SE of the best)' if i in eligible else ''}"
        )


if __name__ == "__main__":
    main()
