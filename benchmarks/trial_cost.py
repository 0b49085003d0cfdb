"""What a trial costs with and without the caches of `tuner.evaluation.evaluator` (MiniLM on WikiPos-dev).

Run from the repository root:

    .venv/bin/python -m benchmarks.trial_cost                 # 32 passages, 24-trial study (~10 min on 2 cores)
    .venv/bin/python -m benchmarks.trial_cost --docs 300      # the whole of WikiPos-dev (hours on 2 CPU cores)
    .venv/bin/python -m benchmarks.trial_cost --skip-study    # per-trial costs only

Part 1, per-trial cost. One evaluator tokenises the passages once and records the hidden states
entering the layers where the search space's depths start (the baseline pass), then, interleaved,
`--repeats` times: a full uncalibrated encode (the reference every ratio divides by), a trial at 50%
depth (the paper's default: CLS-Soft, λ 0.5, basket 128, last 3 of 6 layers) from scratch, resumed
from the cached input of layer 3, and resumed with the first calibrated layer's basket sums that an
earlier trial at the same depth and basket size (Uniform, λ 0.9) left behind (mean pooling: they do
not depend on λ, variant or w); and the same three for a last-layer trial (layer 5). Each figure is
the median over repeats; each ratio is the median of the per-repeat ratios (paired, so load that
other processes put on a shared machine cancels out as far as it can).

Part 2, a 24-trial study. The study loop of `tuner.tuning.study_loop` (TPE, seed 0, the baseline and the
paper's default enqueued first, basket sizes no passage fills left out, as `tune` does) with an objective that
scores each config with `Evaluator.run` — PSI, subject to HM ≥ the baseline's HM — without MLflow logging and
without the per-trial attention profile. Three evaluators run side by side: without caching
(`disk_cache=False, cache_budget=0, reuse_baseline=False`: what the evaluator did before, keeping
only query and baseline vectors in memory); with caching on an empty cache folder ("cold": queries and baseline
computed, layer inputs recorded during the baseline pass, trials resumed); and with caching on the folder the
cold one filled ("warm": a later study on the same model, revision and dataset). Each trial's config
runs on all three, back to back, in rotating order, so drifting load from other processes hits them
alike; a study's wall time is its evaluator's set-up (queries, baseline) plus all its
`Evaluator.run` calls (encode + scoring), plus Optuna's own time, which each would pay. All must
give the same PSI in every trial.
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from benchmarks import record

TARGET_HALF = 0.6
TARGET_LAST = 0.3
TARGET_STUDY = 2.0


def subsample(dataset, docs: int, seed: int):
    """`docs` passages drawn at random, and the queries whose relevant passage is among them."""
    from tuner.data import PositionalDataset

    if docs >= len(dataset.corpus):
        return dataset
    keep = set(random.Random(seed).sample(sorted(dataset.corpus), docs))
    corpus = {d: t for d, t in dataset.corpus.items() if d in keep}
    qrels = {q: {d: r for d, r in judged.items() if d in keep} for q, judged in dataset.qrels.items()}
    qrels = {q: judged for q, judged in qrels.items() if any(r > 0 for r in judged.values())}
    return PositionalDataset(
        name=f"{dataset.name}[{docs} docs, seed {seed}]",
        corpus=corpus,
        queries={q: t for q, t in dataset.queries.items() if q in qrels},
        qrels=qrels,
        groups={q: g for q, g in dataset.groups.items() if q in qrels},
        group_order=dataset.group_order,
        strata={q: s for q, s in dataset.strata.items() if q in qrels},
    )


def timed(step: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    out = step()
    return time.perf_counter() - start, out


def _starting_layers(model) -> tuple[int, ...]:
    """The layers `tune` caches the inputs of for this search space's depths (its evaluators get them from
    `SearchSpace.starting_layers`; an Evaluator caches none by default)."""
    from tuner.tuning.search_space import DEPTHS, SearchSpace

    return SearchSpace(depths=tuple(DEPTHS)).starting_layers(model.num_layers)


def per_trial(model, dataset, args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, object]:
    from tuner.engine.encoder import forward
    from tuner.evaluation.cache_policy import FirstLayerSums
    from tuner.evaluation.evaluator import Evaluator

    folder = Path(tempfile.mkdtemp(prefix="posfair-trial-cost-"))
    evaluator = Evaluator(model, dataset, args.batch_size, cache_dir=folder, prefix_layers=_starting_layers(model))
    warm = model.tokenizer(["warm-up " * 60] * 2, return_tensors="pt").to(model.device)
    with torch.inference_mode():
        model.model(**warm)  # first-call costs (allocator, kernels) stay out of every figure
    seconds_tokenise, batches = timed(evaluator.batches)
    seconds_baseline, _ = timed(evaluator.baseline_vectors)  # full plain pass + recording the layer inputs
    say(
        f"tokenised once in {seconds_tokenise:.1f} s; baseline pass recording layers {list(evaluator.cached_layers())} "
        f"in {seconds_baseline:.1f} s ({evaluator.cache.store.layer_bytes / 2**20:.0f} MiB per layer, "
        f"{'in RAM' if all(x.in_memory for x in evaluator.cache.inputs.values()) else 'memory-mapped'})"
    )
    half = model.default_config(layers=0.5)  # CLS-Soft, λ 0.5, basket 128, last 3 of 6 layers
    last = model.default_config(layers="last")
    shared = FirstLayerSums(budget=2**40)  # the first calibrated layer's sums, as an earlier trial left them
    cases: dict[str, Callable[[], object]] = {}
    for label, config in (("50% depth", half), ("last layer", last)):
        spec = config.resolve(model.num_layers)
        start = evaluator.resume_layer(min(spec.layers))
        assert start == min(spec.layers), (label, start)
        if spec.pooling == "mean":  # an earlier trial at this depth and basket size leaves its first-layer sums
            earlier = model.default_config(variant="uniform", strength=0.9, layers=config.layers).resolve(
                model.num_layers
            )
            forward(model, batches, earlier, around=evaluator.cache.resumed_from(start), first_layer=shared.for_batch)
        cases[f"{label}, scratch"] = lambda spec=spec: forward(model, batches, spec)
        cases[f"{label}, resumed from layer {start}"] = lambda spec=spec, start=start: forward(
            model, batches, spec, around=evaluator.cache.resumed_from(start)
        )
        if spec.pooling == "mean":
            cases[f"{label}, resumed from layer {start}, its sums shared"] = lambda spec=spec, start=start: forward(
                model, batches, spec, around=evaluator.cache.resumed_from(start), first_layer=shared.for_batch
            )
    reference = "full uncalibrated encode"
    cases = {reference: lambda: forward(model, batches, None), **cases}
    times: dict[str, list[float]] = {k: [] for k in cases}
    outputs: dict[str, np.ndarray] = {}
    for repeat in range(args.repeats):
        for label, case in cases.items():
            seconds, out = timed(case)
            times[label].append(seconds)
            outputs[label] = out  # type: ignore[assignment]
            say(f"  repeat {repeat + 1}/{args.repeats}  {label:<32} {seconds:7.1f} s")

    def paired(label: str, over: str) -> float:
        return statistics.median(t / r for t, r in zip(times[label], times[over]))

    ratios = {label: paired(label, reference) for label in cases}
    scratch_ratio = {}
    for depth in ("50% depth", "last layer"):
        scratch, *resumed = (k for k in cases if k.startswith(depth))
        for case in resumed:
            assert np.abs(outputs[scratch] - outputs[case]).max() <= 1e-6, f"{case}: differs from scratch"
            scratch_ratio[case] = paired(case, scratch)
    return {
        "times": {k: statistics.median(v) for k, v in times.items()},
        "ratios": ratios,
        "vs_scratch": scratch_ratio,
        "baseline_seconds": seconds_baseline,
        "tokenise_seconds": seconds_tokenise,
        "reference": reference,
    }


def study_walls(model, dataset, args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, object]:
    """Both studies side by side: each config runs on both evaluators back to back, in alternating order."""
    import optuna

    from tuner.evaluation.evaluator import Evaluator
    from tuner.tuning.search_space import BASELINE_PARAMS, DEPTHS, PAPER_DEFAULT_PARAMS, SearchSpace
    from tuner.tuning.study import enqueue_once, open_study
    from tuner.tuning.study_loop import run_trials

    folder = Path(tempfile.mkdtemp(prefix="posfair-study-cost-"))
    modes = ("uncached", "cold", "warm")
    spent = dict.fromkeys(modes, 0.0)
    psi: dict[str, list[float]] = {mode: [] for mode in modes}
    depths: list[str] = []
    evaluators: dict[str, Evaluator] = {}
    prefix = _starting_layers(model)
    make = {
        "uncached": lambda: Evaluator(
            model, dataset, args.batch_size, disk_cache=False, cache_budget=0, reuse_baseline=False
        ),
        "cold": lambda: Evaluator(model, dataset, args.batch_size, cache_dir=folder / "cache", prefix_layers=prefix),
        "warm": lambda: Evaluator(
            model, dataset, args.batch_size, cache_dir=folder / "cache", prefix_layers=prefix
        ),  # after cold
    }
    what = {
        "uncached": "queries + baseline",
        "cold": "queries + baseline recording layer inputs, written to disk",
        "warm": "queries + baseline read from disk",
    }
    floor = 0.0
    for mode in modes:  # set-up as `tune` does it: evaluator, queries, baseline
        seconds, evaluator = timed(make[mode])
        more, baseline = timed(lambda: evaluator.run(None))  # noqa: B023 - called at once
        spent[mode] += seconds + more
        evaluators[mode], floor = evaluator, baseline.report.hm
        say(f"  {mode:<8} set-up ({what[mode]}) {seconds + more:6.1f} s")
    # every depth, so each depth's cost is measured (the default space stops at 50%); the fitting
    # baskets as `tune` does
    space = SearchSpace(depths=tuple(DEPTHS)).fitting(evaluators["uncached"].longest_content())

    def objective(trial: optuna.Trial) -> float:
        config = space.suggest(trial, model.spec.pooling, model.spec.padding_side)
        shift = trial.number % len(modes)
        line = []
        for mode in modes[shift:] + modes[:shift]:  # each evaluator goes first, second and third in turn
            seconds, evaluation = timed(lambda: evaluators[mode].run(config))  # noqa: B023 - called at once
            spent[mode] += seconds
            psi[mode].append(evaluation.report.psi)
            line.append(f"{mode} {seconds:5.1f} s")
        depths.append(trial.params["depth"])
        trial.set_constraint("hm_floor", floor - evaluation.report.hm)  # as the real objective does
        say(
            f"  trial {trial.number:2d}  {trial.params['depth']:>4} λ {trial.params['strength']:.2f}  "
            + ", ".join(line)
        )
        return psi["cold"][-1]

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    set_up = dict(spent)
    began = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = open_study(
            "trial-cost", f"sqlite:///{folder / 'optuna.db'}", seed=args.seed, pareto=False, identity={"k": 1}
        )
        for reference in (BASELINE_PARAMS, PAPER_DEFAULT_PARAMS):
            enqueue_once(study, *space.reference_trial(reference))
        run_trials(study, objective, args.trials)
    in_trials = sum(spent.values()) - sum(set_up.values())
    sampler = max(0.0, time.perf_counter() - began - in_trials)  # Optuna's own time (sampling, storage): both pay it
    walls = {mode: spent[mode] + sampler for mode in spent}
    for mode in modes:
        sums = evaluators[mode].first_layer_sums()
        say(
            f"{mode}: {walls[mode]:.0f} s, passes {evaluators[mode].counts}, first-layer sums reused in "
            f"{sums.hits if sums else 0} batch passes ({sums.used / 2**20 if sums else 0:.0f} MiB)"
        )
    say(f"Optuna's own time {sampler:.1f} s")
    same = all(np.allclose(psi[mode], psi["uncached"], rtol=0, atol=1e-9) for mode in modes)
    return {"walls": walls, "same_psi": same, "trials": len(depths), "depths": depths, "sampler": sampler}


def report(command: str, args: argparse.Namespace, dataset, trial: dict, study: dict | None, wall: float) -> str:
    model_label = "mean pooling" if args.pooling == "mean" else "cls pooling (cost profile of cls/last models)"
    t, r, s = trial["times"], trial["ratios"], trial["vs_scratch"]
    ref = trial["reference"]
    keys = list(t)
    half_resumed = [k for k in keys if k.startswith("50%") and "resumed" in k]
    last_resumed = [k for k in keys if k.startswith("last") and "resumed" in k]
    lines = [
        f"## Trial cost (MiniLM, {model_label}, WikiPos-dev)",
        "",
        f"`{command}` — {len(dataset.corpus)} passages (≤ 512 tokens), {len(dataset.queries)} queries, "
        f"batch {args.batch_size}, {torch.get_num_threads()} torch threads, {args.repeats} interleaved repeats "
        "(medians; ratios paired per repeat).",
        "",
        "| encode | seconds | × full uncalibrated encode | × same trial from scratch | target |",
        "|---|---:|---:|---:|---|",
    ]
    goals = {**dict.fromkeys(half_resumed, TARGET_HALF), **dict.fromkeys(last_resumed, TARGET_LAST)}
    for key in keys:
        mark = f"≤ {goals[key]}× {'met' if r[key] <= goals[key] else 'missed'}" if key in goals else ""
        lines.append(
            f"| {key} | {t[key]:.1f} | {r[key]:.2f} | {s[key]:.2f} |  {mark} |"
            if key in s
            else f"| {key} | {t[key]:.1f} | {r[key]:.2f} | {'1.00' if 'scratch' in key else ''} | {mark} |"
        )
    lines.append(
        f"\nOnce per (model, revision, dataset): tokenising {trial['tokenise_seconds']:.1f} s; the baseline pass that "
        f"records the layer inputs {trial['baseline_seconds']:.1f} s (vs {t[ref]:.1f} s for a plain encode)."
    )
    if study is not None:
        walls = study["walls"]

        def speedup(mode: str) -> str:
            ratio = walls["uncached"] / walls[mode]
            return f"{ratio:.2f}× ({'met' if ratio >= TARGET_STUDY else 'missed'})"

        lines += [
            "",
            f"| {study['trials']}-trial study (TPE seed {args.seed}; the three run side by side, in rotating order) "
            f"| wall seconds | speed-up (target ≥ {TARGET_STUDY}×) |",
            "|---|---:|---:|",
            f"| without caching | {walls['uncached']:.1f} | 1.00× |",
            "| with caching, cold (first study: computes queries and baseline, records layer inputs) "
            f"| {walls['cold']:.1f} | {speedup('cold')} |",
            "| with caching, warm (a later study on the same model, revision and dataset) "
            f"| {walls['warm']:.1f} | {speedup('warm')} |",
            "",
            f"Same PSI in every trial with and without caching: {study['same_psi']}. Depths drawn: "
            + ", ".join(f"{d}×{study['depths'].count(d)}" for d in dict.fromkeys(study["depths"]))
            + f". Optuna's own time ({study['sampler']:.0f} s) is counted in each.",
        ]
    lines.append(f"\nBenchmark wall time: {wall / 60:.1f} min.")
    return "\n".join(lines)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=32, help="passages sampled from WikiPos-dev's 300 (default 32)")
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--skip-study", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures here, as a record (benchmarks.record)")
    parser.add_argument(
        "--pooling",
        choices=("mean", "cls"),
        default="mean",
        help="mean: MiniLM as registered; cls: the same weights pooled by [CLS], where calibration "
        "recomputes only the pooled row (the cost profile of bge-m3 / Qwen3)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    began = time.perf_counter()
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    from tuner.data import load_benchmark
    from tuner.engine.models import load_model

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    model = load_model("minilm", pooling=args.pooling)
    dataset = subsample(load_benchmark("wikipos-dev"), args.docs, args.seed)
    say(
        f"MiniLM ({model.revision}, {args.pooling} pooling) on {dataset.name}: {len(dataset.corpus)} passages, "
        f"{len(dataset.queries)} queries"
    )
    trial = per_trial(model, dataset, args, say)
    study = None if args.skip_study else study_walls(model, dataset, args, say)
    command = ".venv/bin/python -m benchmarks.trial_cost " + " ".join(sys.argv[1:] if argv is None else argv)
    print(report(command.strip(), args, dataset, trial, study, time.perf_counter() - began), flush=True)
    if args.json:
        record.write(args.json, "trial_cost", command.strip(), {"trial": trial, "study": study})


if __name__ == "__main__":
    main()
