"""The cost estimate printed before a study: tokens to encode, priced by a timed probe."""

from __future__ import annotations

import pytest

from tests.tiny import WORDS, save_tiny
from tuner.data import PositionalDataset
from tuner.engine.models import load_model
from tuner.evaluation.cost import Probe, StudyCost, duration
from tuner.evaluation.evaluator import Evaluator
from tuner.tuning.estimate import estimate_cost

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
    # the baseline (trial 0) is the pass over the corpus and what is encoded once; 2 calibrated trials follow
    assert cost.study_seconds(3) == pytest.approx((20_000 + 100_000) / 2000 + 2 * 55)  # 170 s
    lines = cost.describe(trials=3, default_trials=16)
    assert "a probe of 4 passages × 1,000 tokens took 2.00 s (500 µs per token)" in lines[0]
    assert lines[1] == "corpus: 100 passages, 100,000 padded tokens (3 truncated at 1,000 tokens); one encode ≈ 50 s"
    assert lines[2] == (
        "one calibrated trial ≈ 55 s; this study (3 trials, with the baseline and the held-out scoring) ≈ 3 min; "
        f"the default 16 trials ≈ {duration(60 + 15 * 55)}"
    )
    # layer-tokens: 1 layer here; the baseline and once-encoded 120,000, and 2 trials of 110,000
    assert lines[3] == (
        "layer-tokens (padded tokens × layers run): ≈ 340,000, of which ≈ 120,000 are the baselines and queries "
        "(none that the disk cache holds)"
    )
    assert len(lines) == 4, "under an hour: no advice"


def six_layers(**changes: object) -> StudyCost:
    """A 6-layer model's study: a corpus of 100,000 tokens, 20,000 encoded once, two structures of 30,000 in all."""
    return StudyCost(
        Probe("cpu", 4, 1000, 2.0),
        100,
        100_000,
        0,
        1000,
        per_trial_tokens=30_000,
        once_tokens=20_000,
        layers=6,
        structure_tokens=30_000,
        **changes,
    )  # type: ignore[arg-type]


def test_a_trial_runs_only_the_layers_after_its_resume_point_and_its_profile_runs_every_layer() -> None:
    # 6 layers; trials run 2 of them on average; the corpus 100,000, two structures 30,000, a profile 5,000
    cost = six_layers(profile_tokens=5_000, trial_layers=2.0, heldout_tokens=50_000, heldout_queries=1_000)
    trial = 2 * 130_000 + 6 * 5_000
    assert cost.trial_layer_tokens == trial
    full = 6 * (20_000 + 100_000 + 5_000) + 9 * trial
    pruned = full - 8 * (trial - 2 * 100_000)  # all but the 2 references stop after the corpus, with no profile
    line = cost.describe(10, 16)[3]
    setup = 6 * (20_000 + 100_000)
    assert line.startswith(
        f"layer-tokens (padded tokens × layers run): ≈ {full:,} unpruned (≈ {duration(cost.study_seconds(10))} in "
        "all), "
        f"of which ≈ {setup:,} are the baselines and queries (none that the disk cache holds); ≈ {pruned:,} ("
    )
    held = 6 * (1_000 + 50_000) + 2 * 2 * 50_000  # uncalibrated through every layer; paper default and winner resumed
    assert line.endswith(f"; held-out scoring ≈ {held:,} more")
    assert cost.study_seconds(10) == pytest.approx((full + held) / 6 / 2000)  # the probe timed all 6 layers
    assert "(it runs 2 of 6 layers on average)" in cost.describe(10, 16)[2]
    slow = StudyCost(Probe("cpu", 4, 1000, 200.0), 100, 100_000, 0, 1000, 0, 0)
    assert "run it on a GPU, with fewer --trials, or on --dataset wikipos-dev+titles" in slow.describe(16, 16)[-1]


def test_the_pruned_estimate_is_a_floor_a_trial_stopped_after_the_cheapest_corpus_when_that_is_another_structure() -> (
    None
):
    # a structure of 20,000 tokens beside the corpus of 100,000; trials run 2 layers. Which rung comes first only
    # the baseline tells (least biased first), so the estimate prices the cheapest and says it is a floor
    cost = six_layers(trial_layers=2.0, first_rung_tokens=20_000, first_rung="dev-openings")
    trial = 2 * 130_000
    full = 6 * (20_000 + 100_000) + 9 * trial
    pruned = full - 8 * (trial - 2 * 20_000)
    line = cost.describe(10, 16)[3]
    assert f"≈ {full:,} unpruned (" in line and f"; ≈ {pruned:,} (" in line
    assert line.endswith(
        "if every trial but the references stops after one rung (a floor: the cheapest, dev-openings, ≈ 20,000 tokens; "
        "the rungs go least biased first, which the baseline decides)"
    )


def test_with_a_pooled_screen_the_pruned_estimate_is_every_trial_but_the_references_stopped_after_it() -> None:
    # 6 layers, 10 trials through every layer; each screens 12,000 tokens first; a trial past it encodes 100,000 +
    # 30,000
    cost = six_layers(screen_tokens=12_000)
    full = 6 * (20_000 + 100_000 + 9 * (130_000 + 12_000))
    pruned = 6 * (20_000 + 100_000 + 1 * (130_000 + 12_000) + 8 * 12_000)
    line = cost.describe(10, 16)[3]
    assert f"≈ {full:,} unpruned (" in line and f"; ≈ {pruned:,} (" in line
    assert line.endswith("if every trial but the references stops after the pooled screen of ≈ 12,000 tokens")


def test_the_estimate_counts_the_corpus_batches_queries_and_a_held_out_corpus(tmp_path) -> None:
    model = load_model(str(save_tiny("bert", tmp_path / "bert")), pooling="cls")

    def dataset(name: str, lengths: list[int], queries: int) -> PositionalDataset:
        corpus = {f"{name}{i}": " ".join(WORDS[:n]) for i, n in enumerate(lengths)}
        return PositionalDataset(
            name,
            corpus,
            {f"q{name}{i}": "w1 w2 w3" for i in range(queries)},
            {f"q{name}{i}": {f"{name}0": 1} for i in range(queries)},
        )

    tuning, heldout = dataset("t", [40, 30, 10], 2), dataset("h", [20, 20], 3)
    evaluator = Evaluator(model, tuning, batch_size=2, disk_cache=False)
    cost = estimate_cost(evaluator, [heldout], [], profile_docs=1)
    # Batches, long first, two a batch, [CLS] and [SEP] added: (42, 32) padded to 42, then (12): 2·42 + 12.
    assert cost.corpus_tokens == 96 and cost.passages == 3 and cost.truncated == 0
    assert cost.profile_tokens == 96 * 1 // 3, "one profile passage of the average padded length"
    assert cost.per_trial_tokens == 0 and cost.trial_layers is None, "no other structure; no depths: every layer"
    # The tuning queries (2 × 5 tokens); held out: its queries (3 × 5) and one pass over its corpus (2 × 22).
    assert cost.once_tokens == 2 * 5 and cost.heldout_queries == 3 * 5 and cost.heldout_tokens == 44
    assert cost.probe.rows == 2 and cost.probe.length == 42 and cost.probe.seconds > 0
    same_corpus = PositionalDataset("h", tuning.corpus, heldout.queries, {q: {"t0": 1} for q in heldout.queries})
    shared = estimate_cost(evaluator, [same_corpus], [], profile_docs=1)
    assert (shared.heldout_tokens, shared.heldout_queries) == (0, 15), "FineWeb-PosQ's parts share the corpus"
    crops = dataset("t-crops", [10, 10], 1)  # one batch of two passages of 12 tokens: 24, against the corpus's 96
    pruned = estimate_cost(evaluator, [], [], profile_docs=1, structures=[heldout, crops], prune=True)
    assert (pruned.first_rung_tokens, pruned.first_rung) == (24, "t-crops"), "the cheapest corpus is the first rung"


def test_the_probe_is_timed_after_a_warm_up_and_fills_a_gpu_with_its_whole_batch(tmp_path) -> None:
    import torch

    from tuner.engine.batching import Batches
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


def test_a_trial_resumes_at_the_deepest_cached_layer_before_its_first_calibrated_one(tmp_path) -> None:
    from tuner.calibration import CalibrationConfig
    from tuner.tuning.estimate import layers_run
    from tuner.tuning.search_space import DEPTHS, SearchSpace

    model = load_model(str(save_tiny("bert", tmp_path / "bert", layers=4)), pooling="cls")
    tuning = PositionalDataset("t", {"d0": " ".join(WORDS[:40])}, {"q": "w1 w2"}, {"q": {"d0": 1}})
    space = SearchSpace(depths=("last", "50%"))  # 4 layers: calibrating layer 3, or layers 2 and 3
    cached = Evaluator(model, tuning, batch_size=2, disk_cache=False, prefix_layers=space.starting_layers(4))
    assert cached.cached_layers() == (2, 3)
    assert layers_run(cached, space.depths) == (1 + 2) / 2
    assert layers_run(Evaluator(model, tuning, batch_size=2, disk_cache=False, cache_budget=0), space.depths) == 4, (
        "nothing cached"
    )
    only_half = Evaluator(model, tuning, batch_size=2, disk_cache=False, prefix_layers=(2,))
    assert layers_run(only_half, ["last"]) == 2, "the last layer resumes from layer 2's inputs: layers 2 and 3 run"
    for depth in space.depths:  # the estimate counts from where the pass itself resumes
        first = min(CalibrationConfig(layers=DEPTHS[depth]).resolve_layers(4))
        assert layers_run(only_half, [depth]) == 4 - (only_half.resume_layer(first) or 0)


def test_under_a_budget_the_study_is_at_most_the_budget_and_the_estimate_says_where_it_ends() -> None:
    # the first test's study, ended by a budget of 230,000 layer-tokens: the baselines (120,000) and one trial
    cost = StudyCost(Probe("cpu", 4, 1000, 2.0), 100, 100_000, 3, 1000, 10_000, 20_000, budget_layer_tokens=230_000)
    lines = cost.describe(trials=3, default_trials=16)
    assert lines[2] == (
        "one calibrated trial ≈ 55 s; this study (at most 3 trials within its budget, "
        "with the baseline and the held-out "
        f"scoring) ≈ {duration(230_000 / 2000)}; the default 16 trials ≈ {duration(60 + 15 * 55)}"
    )
    assert lines[3].endswith(f"; the budget ends the study at ≈ 230,000 (≈ {duration(230_000 / 2000)} in all)")
    roomy = StudyCost(Probe("cpu", 4, 1000, 2.0), 100, 100_000, 3, 1000, 10_000, 20_000, budget_layer_tokens=1e9)
    assert "budget ends" not in roomy.describe(3, 16)[3]  # --trials ends it first: nothing to say


def test_a_pass_costs_what_it_encodes_and_a_batch_no_basket_fills_is_copied_not_encoded(tmp_path) -> None:
    from tuner.calibration import CalibrationConfig

    model = load_model(str(save_tiny("bert", tmp_path / "bert", layers=4)), pooling="cls")
    corpus = {f"d{i}": " ".join(WORDS[:n]) for i, n in enumerate([120, 100, 10, 8])}
    tuning = PositionalDataset("t", corpus, {"q": "w1 w2"}, {"q": {"d0": 1}})
    evaluator = Evaluator(model, tuning, batch_size=2, disk_cache=False, prefix_layers=(3,))
    evaluator.run(None)  # the baseline, which the pass copies unchanged batches from, and the cached layer input
    # batches, long first: (122, 102) padded to 122, then (12, 10) padded to 12; from layer 3 one layer runs
    for basket, encoded in (
        (64, 2 * 122),
        (8, 2 * 122 + 2 * 12),
        (256, 0),
    ):  # a basket fills the long pair, both, neither
        config = CalibrationConfig(layers="last", basket_size=basket)
        before = evaluator.counts.layer_tokens
        evaluator.run(config)
        assert evaluator.pass_cost(config) == evaluator.counts.layer_tokens - before == encoded, basket
