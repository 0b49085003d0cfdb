"""Fast trials: a trial resumed from cached layer inputs equals a trial computed from scratch."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import POOLING
from tests.tiny import WORDS, random_texts
from tuner.calibration import CalibrationConfig
from tuner.calibration.rows import fills_a_basket
from tuner.data import PositionalDataset
from tuner.engine.batching import auto_batch_size
from tuner.engine.encoder import CalibratedEncoder, forward
from tuner.engine.models import LoadedModel, load_model
from tuner.engine.prefix import Batches, LayerStack, ResumeUnsupportedError, record_layer_inputs
from tuner.evaluation.evaluator import Evaluator
from tuner.evaluation.layer_inputs import choose_layers
from tuner.tuning.search_space import DEPTHS, SearchSpace

BATCH = 4


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_dataset(docs: int = 10, seed: int = 0, name: str = "tiny-pos") -> PositionalDataset:
    """Documents of mixed lengths (some shorter than one 8-token basket); each query is a document's first words."""
    rng = random.Random(seed)
    texts = random_texts(docs, 3, 60, seed=seed)
    corpus = {f"d{i}": text for i, text in enumerate(texts)}
    queries, qrels, groups = {}, {}, {}
    for i, text in enumerate(texts):
        words = text.split()
        for group, part in zip(("begin", "middle", "end"), (words[:3], words[len(words) // 2 :][:3], words[-3:])):
            qid = f"q{i}-{group}"
            queries[qid] = " ".join(part) or rng.choice(WORDS)
            qrels[qid] = {f"d{i}": 1}
            groups[qid] = (group,)
    return PositionalDataset(name, corpus, queries, qrels, groups, ("begin", "middle", "end"))


def scratch(model: LoadedModel, dataset: PositionalDataset, config: CalibrationConfig) -> np.ndarray:
    """The reference: `CalibratedEncoder` runs the whole model, with the same batching."""
    return CalibratedEncoder(model, config).encode(list(dataset.corpus.values()), batch_size=BATCH)


@pytest.fixture(scope="module", params=["bert-cls", "qwen3-last", "bert-mean", "mpnet-mean", "gte-cls"])
def tiny(request: pytest.FixtureRequest, tiny_model_dir) -> LoadedModel:
    kind, pooling = POOLING[request.param]
    return load_model(str(tiny_model_dir(kind)), pooling=pooling)


def configs(model: LoadedModel) -> list[CalibrationConfig]:
    """Calibration starting at layer 2 (last), at layer 1 (last:2) and at layer 0 (all), of a 3-layer model."""
    return [
        model.default_config(variant=v, strength=0.8, basket_size=8, layers=layers)
        for v, layers in (("cls_soft", "last"), ("cls_hard", "last:2"), ("uniform", 1.0))
    ]


def test_every_layer_resumes_whatever_a_layer_returns(tiny: LoadedModel) -> None:
    """Layers return their hidden states bare (BERT, Qwen3, GTE) or in a tuple (MPNet); a skipped layer passes
    its input on in the same form, so no family silently falls back to full forward passes."""
    from tuner.engine.prefix import LayerStack

    assert LayerStack(tiny).resumable([1, 2]) == [1, 2]


def test_a_pass_resumes_at_the_deepest_cached_layer_at_or_before_its_first_calibrated_one() -> None:
    """One rule for where a config's pass resumes, read by the cache policy (the pass itself) and by the study's
    cost estimate (`tuner.tuning.estimate.layers_run`) alike."""
    from tuner.engine.prefix import resume_point

    assert resume_point((2, 5, 9), 6) == 5
    assert resume_point((2, 5, 9), 5) == 5, "a layer's own recorded input: it runs from there"
    assert resume_point([9, 2, 5], 12) == 9, "in any order"
    assert resume_point((5, 9), 4) is None, "nothing cached before it: the full forward"
    assert resume_point((), 3) is None


@pytest.mark.parametrize("ram", ["in memory", "memory-mapped"])
def test_a_resumed_trial_equals_a_trial_from_scratch(tiny: LoadedModel, tmp_path: Path, ram: str) -> None:
    dataset = tiny_dataset()
    limit = 2**40 if ram == "in memory" else None  # None: the process's allowance, none by default (`RAM_FRACTION`)
    evaluator = Evaluator(tiny, dataset, BATCH, cache_dir=tmp_path, prefix_layers=(1, 2), ram_limit=limit)
    baseline, _ = evaluator.run(None), None
    assert evaluator.cached_layers() == (1, 2)
    assert all(inputs.in_memory == (ram == "in memory") for inputs in evaluator.cache.inputs.values())
    for config in configs(tiny):
        got, _ = evaluator.document_vectors(config)
        want = scratch(tiny, dataset, config)
        assert np.abs(got - want).max() <= 1e-6
        assert np.abs(got - evaluator.baseline_vectors()[0]).max() > 1e-4  # calibration did something
    # one full pass for the baseline (which recorded the layer inputs), one for the all-layers trial
    assert evaluator.counts.full == 2 and evaluator.counts.resumed == {2: 1, 1: 1}
    assert baseline.report.hm is not None


def test_the_evaluators_of_a_process_share_one_ram_allowance_and_get_it_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A study holds one evaluator per structure and held-out set, each keeping shared sums (and, where asked,
    layer inputs) in RAM: together they keep at most `RAM_FRACTION` of the memory available when the first asked,
    not that share each, and what a dropped holder took comes back."""
    import gc
    import types

    import psutil

    from tuner.evaluation import layer_inputs as store

    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(available=1000))
    monkeypatch.setattr(store, "_PROCESS_RAM", None, raising=False)
    monkeypatch.setattr(store, "RAM_FRACTION", 0.5)
    allowance = store.ram_allowance(None)
    assert store.ram_allowance(None) is allowance and allowance.left == 500

    class Holder:
        """A store or a sums table: what holds the reservation."""

    first, second = Holder(), Holder()
    assert allowance.take(first, 400) is not None
    assert allowance.take(second, 200) is None, "the share is the process's, not each holder's"
    del first
    gc.collect()
    assert allowance.take(second, 200) is not None, "what a dropped holder took comes back"
    assert (
        store.ram_allowance(300) is not allowance and store.ram_allowance(300).left == 300
    )  # an explicit limit: its own


def test_an_evaluators_ram_limit_bounds_its_layer_inputs_and_shared_sums_together(
    tiny_model_dir, tmp_path: Path
) -> None:
    """`ram_limit` is one allowance for what the evaluator holds in RAM: layer inputs that fill it leave no room
    for the first-layer sums, which are then recomputed by each trial."""
    kind, pooling = POOLING["bert-mean"]
    model = load_model(str(tiny_model_dir(kind)), pooling=pooling)
    dataset = tiny_dataset()
    probe = Evaluator(model, dataset, BATCH, cache_dir=tmp_path / "probe", prefix_layers=(1, 2))
    probe.run(None)
    limit = 2 * probe.cache.store.layer_bytes  # the two cached layers, and not a byte more
    evaluator = Evaluator(model, dataset, BATCH, cache_dir=tmp_path / "bounded", prefix_layers=(1, 2), ram_limit=limit)
    evaluator.run(None)
    assert [inputs.in_memory for inputs in evaluator.cache.inputs.values()] == [True, True]
    sums = evaluator.first_layer_sums()
    assert sums is not None
    for strength in (0.8, 0.4):  # the second would reuse the first's sums, had they been kept
        evaluator.document_vectors(
            model.default_config(variant="cls_soft", strength=strength, basket_size=8, layers="last:2")
        )
    assert sums.entries == {} and sums.hits == 0


def test_a_trial_starting_after_the_deepest_cached_layer_resumes_from_it(tiny: LoadedModel, tmp_path: Path) -> None:
    dataset = tiny_dataset()
    evaluator = Evaluator(tiny, dataset, BATCH, cache_dir=tmp_path, prefix_layers=(1,))
    config = configs(tiny)[0]  # calibrates layer 2 only: layer 1 runs plain from the cached input
    got, _ = evaluator.document_vectors(config)
    assert evaluator.counts.resumed == {1: 1}
    assert np.abs(got - scratch(tiny, dataset, config)).max() <= 1e-6


def test_strength_zero_is_the_baseline_and_costs_nothing(tiny: LoadedModel, tmp_path: Path) -> None:
    evaluator = Evaluator(tiny, tiny_dataset(), BATCH, cache_dir=tmp_path)
    plain, _ = evaluator.document_vectors(None)
    zero, _ = evaluator.document_vectors(tiny.default_config(strength=0.0, layers="last"))
    assert zero is plain and evaluator.counts.full == 1


def test_a_batch_the_config_cannot_change_is_copied_from_the_baseline(tiny: LoadedModel, tmp_path: Path) -> None:
    """Passages shorter than one basket are left uncalibrated (§3), so such batches are never encoded."""
    dataset = tiny_dataset()
    evaluator = Evaluator(tiny, dataset, BATCH, cache_dir=tmp_path, prefix_layers=())
    baseline, _ = evaluator.document_vectors(None)
    lengths = [int(b["attention_mask"].sum(-1).max()) for b in evaluator.batches().inputs]  # longest first
    isolated = len(tiny.default_config().isolated_roles())  # [CLS]; also [SEP] or </s> by pooling
    basket = lengths[1] - isolated + 1  # only the first batch holds a passage whose content fills one
    config = tiny.default_config(strength=0.8, basket_size=basket, layers=1.0)
    assert fills_a_basket(torch.tensor(lengths), basket, isolated).tolist() == [True, False, False]
    forwards: list[int] = []
    hook = tiny.model.register_forward_pre_hook(lambda *a: forwards.append(1))
    try:
        got, _ = evaluator.document_vectors(config)
    finally:
        hook.remove()
    assert len(forwards) == 1
    rows = evaluator.batches().rows
    later = np.concatenate(rows[1:])
    assert np.array_equal(got[later], baseline[later])
    assert np.abs(got - scratch(tiny, dataset, config)).max() <= 1e-6
    assert np.abs(got[rows[0]] - baseline[rows[0]]).max() > 1e-4


def test_a_batch_whose_longest_passage_exactly_fills_one_basket_is_encoded(tiny: LoadedModel, tmp_path: Path) -> None:
    """The boundary of the copy: content (real tokens less the isolated ones) equal to the basket size is
    calibrated (§3: a passage is left alone only when shorter than one basket), so that batch runs the model."""
    dataset = tiny_dataset()
    evaluator = Evaluator(tiny, dataset, BATCH, cache_dir=tmp_path, prefix_layers=())
    baseline, _ = evaluator.document_vectors(None)
    lengths = [int(b["attention_mask"].sum(-1).max()) for b in evaluator.batches().inputs]  # longest first
    isolated = len(tiny.default_config().isolated_roles())
    basket = lengths[1] - isolated  # batch 1's longest content is exactly one basket
    encoded = [b for b, length in enumerate(lengths) if length - isolated >= basket]
    assert encoded[:2] == [0, 1]
    # CLS-Hard fixes [CLS]'s self-mass, so even a passage of one basket changes (CLS-Soft would leave it as it was)
    config = tiny.default_config(variant="cls_hard", strength=0.8, basket_size=basket, layers=1.0)
    forwards: list[int] = []
    hook = tiny.model.register_forward_pre_hook(lambda *a: forwards.append(1))
    try:
        got, _ = evaluator.document_vectors(config)
    finally:
        hook.remove()
    assert len(forwards) == len(encoded)
    assert np.abs(got - scratch(tiny, dataset, config)).max() <= 1e-6
    rows = evaluator.batches().rows
    assert np.abs(got[rows[1]] - baseline[rows[1]]).max() > 1e-4


def test_configs_that_resolve_to_the_same_calibration_share_one_pass(tiny: LoadedModel, tmp_path: Path) -> None:
    evaluator = Evaluator(tiny, tiny_dataset(), BATCH, cache_dir=tmp_path, prefix_layers=())
    last, _ = evaluator.document_vectors(tiny.default_config(strength=0.8, basket_size=8, layers="last"))
    explicit, _ = evaluator.document_vectors(tiny.default_config(strength=0.8, basket_size=8, layers=[2]))
    assert explicit is last and evaluator.counts.full == 1
    by_size, _ = evaluator.document_vectors(
        tiny.default_config(strength=0.8, basket_size=8, layers=[2], basket_shares="by_size")
    )
    assert by_size is not last and evaluator.counts.full == 2  # another calibration: its own pass


def test_batches_match_the_encoder_and_the_full_pass_is_bitwise_equal(tiny: LoadedModel) -> None:
    dataset = tiny_dataset()
    texts = list(dataset.corpus.values())
    batches = Batches.build(tiny, texts, BATCH)
    assert [len(r) for r in batches.rows] == [4, 4, 2]
    lengths = [t for _, t in batches.shapes]
    assert lengths == sorted(lengths, reverse=True)  # long first: little padding
    config = configs(tiny)[1]
    assert np.array_equal(forward(tiny, batches, config.resolve(3)), scratch(tiny, dataset, config))


def test_recording_only_stops_at_the_deepest_wanted_layer(tiny: LoadedModel) -> None:
    batches = Batches.build(tiny, random_texts(5, 3, 30), BATCH)
    stack = LayerStack(tiny)
    reached: list[int] = []
    handles = [
        layer.register_forward_pre_hook(lambda m, a, i=i: reached.append(i)) for i, layer in enumerate(stack.layers)
    ]
    try:
        seen: list[tuple[int, int, tuple[int, ...]]] = []
        record_layer_inputs(tiny, batches, stack, [1], lambda b, layer, h: seen.append((b, layer, tuple(h.shape))))
    finally:
        for handle in handles:
            handle.remove()
    assert set(reached) == {0, 1}  # layer 2 never ran
    assert [(b, layer) for b, layer, _ in seen] == [(0, 1), (1, 1)]
    assert [s[:2] for *_, s in seen] == batches.shapes


def test_a_model_whose_layers_share_state_is_not_resumed_there(tiny_model_dir, caplog) -> None:
    """Layer 1 reads a value layer 0 leaves behind: passing layer 0 through changes it, so layer 1 is refused,
    and the log says so (on a GPU a kernel could differ between full and resumed passes just as silently)."""
    model = load_model(str(tiny_model_dir("bert")), pooling="cls")
    layers = LayerStack(model).layers
    side: dict[str, torch.Tensor] = {}
    hooks = [
        layers[0].register_forward_hook(lambda m, args, out: side.__setitem__("x", out.mean())),
        layers[1].register_forward_hook(lambda m, args, out: out + side["x"]),
    ]
    try:
        with caplog.at_level("WARNING", logger="tuner.engine.prefix"):
            assert LayerStack(model).resumable([1, 2]) == [2]
        assert [r.getMessage() for r in caplog.records] == [
            (
                "layer 1: a pass resumed there on cpu does not reproduce the full forward bit for bit, "
                "so its inputs are not "
                "cached: trials calibrating from it run the full forward (slower)"
            )
        ]
        dataset = tiny_dataset()
        evaluator = Evaluator(model, dataset, BATCH, disk_cache=False, prefix_layers=(1, 2))
        config = model.default_config(strength=0.8, basket_size=8, layers="last:2")  # starts at layer 1
        got, _ = evaluator.document_vectors(config)
        assert evaluator.cached_layers() == (2,) and evaluator.counts.resumed == {}
        assert np.abs(got - scratch(model, dataset, config)).max() <= 1e-6
    finally:
        for hook in hooks:
            hook.remove()


def test_a_model_without_a_recognisable_layer_list_falls_back_to_full_passes(
    tiny_model_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = load_model(str(tiny_model_dir("bert")), pooling="cls")
    monkeypatch.setattr(
        "tuner.engine.prefix._find_layers", lambda *a: (_ for _ in ()).throw(ResumeUnsupportedError("no layer list"))
    )
    evaluator = Evaluator(model, tiny_dataset(), BATCH, disk_cache=False)
    config = configs(model)[0]
    got, _ = evaluator.document_vectors(config)
    assert evaluator.cached_layers() == () and evaluator.counts.full == 1
    assert np.abs(got - scratch(model, tiny_dataset(), config)).max() <= 1e-6


def test_the_layers_worth_caching_are_where_the_search_space_starts() -> None:
    every_depth = SearchSpace(depths=tuple(DEPTHS))
    assert every_depth.starting_layers(6) == (1, 3, 4, 5)  # MiniLM: 75%, 50%, 25%, last; never layer 0
    assert SearchSpace().starting_layers(6) == (3, 4, 5)  # the default space: 50%, 25%, last
    assert every_depth.starting_layers(3) == (1, 2)
    assert SearchSpace(depths=("100%",)).starting_layers(6) == ()
    assert SearchSpace(depths=("last", "50%")).starting_layers(24) == (12, 23)


def test_the_budget_picks_the_layers_that_skip_the_most() -> None:
    candidates = (1, 3, 4, 5)
    assert choose_layers(candidates, 100, 10_000) == (1, 3, 4, 5)
    assert choose_layers(candidates, 100, 99) == ()
    assert choose_layers(candidates, 100, 100) == (3,)  # skips 3 layers in 3 of 4 starts
    assert choose_layers(candidates, 100, 250) == (3, 4)


def test_a_budget_of_one_layer_caches_one_layer(tiny: LoadedModel, tmp_path: Path) -> None:
    evaluator = Evaluator(tiny, tiny_dataset(), BATCH, cache_dir=tmp_path, prefix_layers=(1, 2))
    evaluator.batches()
    probe = Evaluator(tiny, tiny_dataset(), BATCH, cache_dir=tmp_path / "probe", prefix_layers=(1, 2))
    probe.cache.plan_layer_inputs(probe.batches())
    layer_bytes = probe.cache.store.layer_bytes
    assert layer_bytes == sum(r * t for r, t in evaluator.batches().shapes) * 32 * 4
    one = Evaluator(
        tiny, tiny_dataset(), BATCH, cache_dir=tmp_path / "one", cache_budget=layer_bytes, prefix_layers=(1, 2)
    )
    assert one.cached_layers() == (1,)
    none = Evaluator(tiny, tiny_dataset(), BATCH, cache_dir=tmp_path / "none", cache_budget=0, prefix_layers=(1, 2))
    none.document_vectors(configs(tiny)[0])
    assert none.cached_layers() == () and none.counts.full == 1
    assert not list((tmp_path / "none").rglob("layer-input-*"))


def test_the_batch_size_is_chosen_from_free_memory_as_a_capped_power_of_two(tiny: LoadedModel, monkeypatch) -> None:
    import psutil

    from tuner.engine.batching import CPU_BATCH_CAP

    assert auto_batch_size(tiny) == CPU_BATCH_CAP  # plenty of RAM: the CPU cap, whatever is free
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("Memory", (), {"available": 2**20})())
    small = auto_batch_size(tiny)
    assert 1 <= small < CPU_BATCH_CAP and small & (small - 1) == 0
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("Memory", (), {"available": 0})())
    assert auto_batch_size(tiny) == 1  # never 0: one passage at a time is always tried
    assert Evaluator(tiny, tiny_dataset(), cache_budget=0, disk_cache=False).batch_size == 1


def test_trials_sharing_first_calibrated_layer_and_basket_size_share_its_sums(tiny_model_dir, tmp_path: Path) -> None:
    """Mean pooling: λ, the variant and w enter only the blend, so the sums of the first calibrated layer
    computed for one trial serve the next; another basket size, first layer or basket_shares computes its own."""
    kind, pooling = POOLING["bert-mean"]
    model = load_model(str(tiny_model_dir(kind)), pooling=pooling)
    dataset = tiny_dataset()
    evaluator = Evaluator(
        model, dataset, BATCH, cache_dir=tmp_path, prefix_layers=(1, 2), ram_limit=2**30
    )  # RAM for the sums
    evaluator.run(None)
    trials = [
        model.default_config(variant="cls_soft", strength=0.8, basket_size=8, layers="last:2"),  # computes them
        model.default_config(variant="uniform", strength=0.4, basket_size=8, layers="last:2"),  # reuses them
        model.default_config(variant="cls_hard", strength=1.0, weight=0.2, basket_size=8, layers="last:2"),  # too
        model.default_config(variant="cls_soft", strength=0.8, basket_size=4, layers="last:2"),  # other baskets
        model.default_config(variant="cls_soft", strength=0.8, basket_size=8, layers="last"),  # other first layer
        model.default_config(
            variant="cls_soft", strength=0.8, basket_size=8, layers="last:2", basket_shares="by_size"
        ),  # other sums
        model.default_config(
            variant="uniform", strength=0.4, basket_size=8, layers="last:2", basket_shares="by_size"
        ),  # reuses those
    ]
    sums = evaluator.first_layer_sums()
    assert sums is not None
    hits = []
    for config in trials:
        got, _ = evaluator.document_vectors(config)
        assert np.abs(got - scratch(model, dataset, config)).max() <= 1e-6
        hits.append(sums.hits)
    batches = hits[1]  # the encoded batches (others are copied from the baseline): each reused once per trial
    assert batches > 0 and hits == [0, batches, 2 * batches, 2 * batches, 2 * batches, 2 * batches, 3 * batches]
    assert Evaluator(model, dataset, BATCH, cache_dir=tmp_path / "off", cache_budget=0).first_layer_sums() is None
