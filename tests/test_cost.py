"""The cost estimate printed before a study: tokens to encode, priced by a timed probe."""

from __future__ import annotations

import pytest

from tests.tiny import WORDS, save_tiny
from tuner.data import PositionalDataset
from tuner.engine.models import load_model
from tuner.evaluation.cost import Probe, StudyCost, duration
from tuner.evaluation.evaluator import Evaluator
from tuner.tuning.session import estimate_cost

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_study_is_the_baseline_the_trials_and_what_is_encoded_once() -> None:
    cost = StudyCost(
        Probe("cpu", rows=4, length=1000, seconds=2.0),
        passages=100,
        corpus_tokens=100_000,
        truncated=3,
        max_length=1000,
        per_trial_tokens=10_000,
        once_tokens=20_000,
    )
    assert cost.probe.seconds_per_token == 2.0 / 4000
    assert cost.trial_seconds == pytest.approx(110_000 / 2000)  # 55 s
    assert cost.study_seconds(3) == pytest.approx((20_000 + 100_000) / 2000 + 3 * 55)  # 225 s
    lines = cost.describe(trials=3, default_trials=16)
    assert "a probe of 4 passages × 1,000 tokens took 2.00 s (500 µs per token)" in lines[0]
    assert lines[1] == "corpus: 100 passages, 100,000 padded tokens (3 truncated at 1,000 tokens); one encode ≈ 50 s"
    assert lines[2] == (
        "one trial ≈ 55 s; this study (3 trials, with the baseline and the final scoring) ≈ 4 min; "
        f"the default 16 trials ≈ {duration(60 + 16 * 55)}"
    )
    # layer-tokens: 1 layer here; the baseline and once-encoded 120,000, and 3 trials of 110,000
    assert lines[3] == "layer-tokens (padded tokens × layers, resumed passes cost less): ≤ 450,000"
    assert len(lines) == 4, "under an hour: no advice"


def test_the_estimate_brackets_a_pruned_study_between_unpruned_and_every_trial_stopped_after_the_tuning_split() -> None:
    # 6 layers; a trial encodes the corpus (100,000) and two structures (30,000); the references run every rung
    cost = StudyCost(
        Probe("cpu", 4, 1000, 2.0), 100, 100_000, 0, 1000, per_trial_tokens=30_000, once_tokens=20_000, layers=6, structure_tokens=30_000
    )
    full = 6 * (20_000 + 100_000 + 10 * 130_000)
    pruned = full - 6 * 8 * 30_000
    assert f"unpruned ≤ {full:,}; pruned ≥ {pruned:,}" in cost.describe(10, 16)[3]
    slow = StudyCost(Probe("cpu", 4, 1000, 200.0), 100, 100_000, 0, 1000, 0, 0)
    assert "run it on a GPU, with fewer --trials, or on --dataset wikipos-dev" in slow.describe(16, 16)[-1]


def test_with_a_pooled_screen_the_pruned_bound_is_every_trial_but_the_references_stopped_after_it() -> None:
    # 6 layers, 10 trials; each screens ≤ 12,000 tokens first; a trial past it encodes 100,000 + 30,000
    cost = StudyCost(
        Probe("cpu", 4, 1000, 2.0),
        100,
        100_000,
        0,
        1000,
        per_trial_tokens=30_000,
        once_tokens=20_000,
        layers=6,
        structure_tokens=30_000,
        screen_tokens=12_000,
    )
    full = 6 * (20_000 + 100_000 + 10 * (130_000 + 12_000))
    pruned = 6 * (20_000 + 100_000 + 2 * 130_000 + 10 * 12_000)
    line = cost.describe(10, 16)[3]
    assert f"unpruned ≤ {full:,}; pruned ≥ {pruned:,}" in line and "pooled screen of ≈ 12,000 tokens" in line


def test_the_estimate_counts_the_corpus_batches_queries_and_a_held_out_corpus(tmp_path) -> None:
    model = load_model(str(save_tiny("bert", tmp_path / "bert")), pooling="cls")

    def dataset(name: str, lengths: list[int], queries: int) -> PositionalDataset:
        corpus = {f"{name}{i}": " ".join(WORDS[:n]) for i, n in enumerate(lengths)}
        return PositionalDataset(
            name, corpus, {f"q{name}{i}": "w1 w2 w3" for i in range(queries)}, {f"q{name}{i}": {f"{name}0": 1} for i in range(queries)}
        )

    tuning, heldout = dataset("t", [40, 30, 10], 2), dataset("h", [20, 20], 3)
    evaluator = Evaluator(model, tuning, batch_size=2, disk_cache=False)
    cost = estimate_cost(evaluator, [heldout], [], profile_docs=1)
    # Batches, long first, two a batch, [CLS] and [SEP] added: (42, 32) padded to 42, then (12): 2·42 + 12.
    assert cost.corpus_tokens == 96 and cost.passages == 3 and cost.truncated == 0
    assert cost.per_trial_tokens == 96 * 1 // 3, "one profile passage of the average padded length"
    # Queries of both parts (5 × 5 tokens) and the held-out corpus's three scorings (3 × 2 × 22).
    assert cost.once_tokens == 5 * 5 + 3 * 44
    assert cost.probe.rows == 2 and cost.probe.length == 42 and cost.probe.seconds > 0
    same_corpus = PositionalDataset("h", tuning.corpus, heldout.queries, {q: {"t0": 1} for q in heldout.queries})
    assert estimate_cost(evaluator, [same_corpus], [], profile_docs=1).once_tokens == 25, "FineWeb-PosQ's parts share it"


def test_the_probe_is_timed_after_a_warm_up_and_fills_a_gpu_with_its_whole_batch(tmp_path) -> None:
    import torch

    from tuner.engine.encoder import Batches
    from tuner.evaluation.cost import WARMUP_TOKENS, probe, probe_rows

    model = load_model(str(save_tiny("bert", tmp_path / "bert")), pooling="cls")
    batches = Batches.build(model, [" ".join(WORDS[:60])] * 6, batch_size=6)
    shapes = []
    handle = model.model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        timed = probe(model, batches)
    finally:
        handle.remove()
    assert shapes == [(4, WARMUP_TOKENS), (4, 62)], "an untimed short warm-up, then the timed pass on CPU's 4 rows"
    assert (timed.rows, timed.length) == (4, 62)
    assert probe_rows(torch.device("cuda"), 6) == 6 and probe_rows(torch.device("cpu"), 6) == 4
