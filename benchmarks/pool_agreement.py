"""Does the pooled screen rank configs as the full corpus does? (the rung metric, validated offline)

Run from the repository root:

    .venv/bin/python -m benchmarks.pool_agreement                       # MiniLM on WikiPos-dev, 24 + 8 configs
    .venv/bin/python -m benchmarks.pool_agreement --per-group 8 24      # other screens
    .venv/bin/python -m benchmarks.pool_agreement --per-group --shares 0.5 0.33   # shares of the passages only

Every config of the paper's grid and eight milder ones (λ 0.25 / 0.75 on the last layer and the last 50%,
basket 128, CLS-Soft and CLS-Hard) is encoded once over the full tuning corpus. Each pool (one per
--per-group value, from the uncalibrated ranking, as `tune` builds it) is then scored *simulated from those
vectors* (a passage's calibrated vector does not depend on which other passages are encoded), which is
exactly what a screen rung would encode. Printed: the pool's size, the candidates'
recall of the relevant passages, Kendall τ of the pool's PSI / HM with the corpus's over the configs, each
config's top-10 covered by the pool, and what the screen's pruning rule would do (configs pruned against the
others, and whether any of them is within one standard error of the best on the full corpus).

A share of the passages (--shares, three random draws each) is the other cheap rung a study could run first:
those passages and the queries they answer, scored from the same vectors, at that share of a corpus encode.
For those the paired rule is printed too: a config is pruned when its PSI minus the best config's on the same
passages and the same bootstrap resamples exceeds zero by PRUNE_Z standard errors of that difference.
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
        nargs="*",
        default=[4, 12, SCREEN_QUERIES],
        help="queries per position group in the screen, one pool per value",
    )
    parser.add_argument("--depth", type=int, default=SCREEN_DEPTH, help="candidates per reference ranking")
    parser.add_argument(
        "--shares", type=float, nargs="*", default=[0.5, 0.33], help="shares of the passages, three draws each"
    )
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
        rows.append(
            (params, evaluation, full.document_vectors(config)[0], trial_evidence(base.per_query, evaluation.per_query))
        )
    print(
        f"{args.dataset}: {len(dataset.corpus)} passages, {len(dataset.queries)} queries, {len(rows)} configs encoded "
        f"over the corpus; pools simulated from those vectors (depth {args.depth}, the uncalibrated ranking)"
    )
    from tuner.evaluation.pools import balanced_queries, candidate_recall, pool

    for per_group in args.per_group:
        screen = pool(dataset, [base.run], per_group, args.depth)
        sample = balanced_queries(dataset, per_group)
        report(
            f"{per_group} queries per group: pool of {len(screen.queries)} queries over {len(screen.corpus)} passages "
            f"({len(screen.corpus) / len(dataset.corpus):.0%} of the corpus); "
            "candidates' recall of the relevant passages "
            f"{candidate_recall(dataset, sample, [base.run], args.depth):.3f}",
            model,
            screen,
            sample,
            full,
            rows,
        )
    for share in args.shares:
        for draw in range(3):
            part = passage_share(dataset, share, seed=draw)
            report(
                f"{share:.0%} of the passages (draw {draw}): {len(part.corpus)} passages, {len(part.queries)} queries",
                model,
                part,
                list(part.queries),
                full,
                rows,
            )


def passage_share(dataset, share: float, seed: int):
    """A random `share` of the passages and the queries all of whose relevant passages are among them."""
    rng = np.random.default_rng(seed)
    ids = sorted(dataset.corpus)
    kept = {ids[i] for i in rng.permutation(len(ids))[: round(share * len(ids))]}
    answered = [q for q, judged in dataset.qrels.items() if all(d in kept for d, rel in judged.items() if rel > 0)]
    return dataset.subset(answered, name=f"{dataset.name}-{share:.0%}").within(kept)


def psi_resamples(per_query) -> np.ndarray:
    """PSI on the point estimate and on the evidence's bootstrap resamples (the same for every config, so two
    configs' arrays are paired resample by resample)."""
    from objectives.evidence import evidence_weights
    from objectives.metrics import aggregate

    return aggregate(per_query, evidence_weights(len(per_query.query_ids))).psi


def report(title: str, model, part, sample: list[str], full, rows) -> None:
    """A cheaper rung's rank agreement with the corpus over the configs, and what each pruning rule would prune."""
    from objectives.evidence import trial_evidence
    from objectives.robustness import PRUNE_Z
    from tuner.evaluation.evaluator import Evaluator
    from tuner.evaluation.pools import top

    scorer = Evaluator(model, part)
    index = {d: i for i, d in enumerate(full.doc_ids)}
    keep = np.array([index[d] for d in scorer.doc_ids])
    part_base = scorer.score(full.baseline_vectors()[0][keep])
    measured = []
    for _, evaluation, documents, corpus_ev in rows:
        scored = scorer.score(documents[keep]).per_query
        coverage = float(np.mean([len(set(top(evaluation.run[q], 10)) & set(part.corpus)) / 10 for q in sample]))
        measured.append((corpus_ev, trial_evidence(part_base.per_query, scored), coverage, psi_resamples(scored)))
    full_psi, part_psi = [m[0].objective for m in measured], [m[1].objective for m in measured]
    tau_psi = kendalltau(full_psi, part_psi).statistic
    tau_hm = kendalltau([m[0].hm for m in measured], [m[1].hm for m in measured]).statistic
    best = min(range(len(measured)), key=lambda i: full_psi[i])
    eligible = {i for i in range(len(measured)) if full_psi[i] <= full_psi[best] + measured[best][0].objective_se}
    threshold = min(p + m[1].objective_se for p, m in zip(part_psi, measured))
    pruned = {i for i in range(len(measured)) if part_psi[i] - PRUNE_Z * measured[i][1].objective_se > threshold}
    leader = measured[min(range(len(measured)), key=lambda i: part_psi[i])][3]
    differences = [m[3] - leader for m in measured]
    paired = {i for i, d in enumerate(differences) if d[0] - PRUNE_Z * np.nanstd(d[1:]) > 0}
    print(
        f"\n{title}; every config's top 10 in it: min {min(m[2] for m in measured):.2f}, "
        f"mean {np.mean([m[2] for m in measured]):.2f}"
    )
    print(f"  Kendall τ with the corpus over {len(measured)} configs: PSI {tau_psi:.3f}, HM {tau_hm:.3f}")
    print(
        f"  the screen rule against the best config here: {len(pruned)} of {len(measured)} pruned; the paired rule: "
        f"{len(paired)} pruned; of the {len(eligible)} within one SE of the corpus's best PSI, pruned: "
        f"{len(eligible & pruned)} and {len(eligible & paired)}"
    )
    for i, ((params, *_), (corpus_ev, part_ev, coverage, _)) in enumerate(zip(rows, measured)):
        name = f"{params['variant']} λ{params['strength']} {params['depth']} B{params['basket_size']}"
        print(
            f"  {name:32s} PSI {corpus_ev.objective:.3f} / here {part_ev.objective:.3f} ± {part_ev.objective_se:.3f}  "
            f"HM {100 * corpus_ev.hm:.2f} / here {100 * part_ev.hm:.2f}  top-10 here {coverage:.2f}"
            f"{'  pruned' if i in pruned else ''}{'  pruned (paired)' if i in paired else ''}"
            f"{'  (within 1 SE of the best)' if i in eligible else ''}"
        )


if __name__ == "__main__":
    main()
