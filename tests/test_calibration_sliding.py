"""Calibration under sliding-window attention, against the oracle, on passages longer than the window.

EmbeddingGemma (Gemma3, bidirectional) and ModernBERT attend within a window in most layers: a row sees the
keys within a distance of it, not the passage. A calibrated row is calibrated over what it sees: the passage's
baskets intersected with its window (a basket it sees no key of is not one of its baskets; one it sees part of
is renormalised over that part), and a masked key gets nothing. The engine reads the window from the mask
transformers builds for each layer type; the oracle builds the window itself from the `sliding_window` the
layer passes, so the two are independent computations.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoConfig, AutoModel
from transformers.masking_utils import (
    sdpa_mask,
    sliding_window_bidirectional_mask_function,
    sliding_window_causal_mask_function,
)

from tests.test_calibration_attention import efficient_on_cpu
from tests.tiny import PLAIN, build_tokenizer, load_as, random_texts
from tuner.calibration import CalibrationConfig, calibrating
from tuner.calibration import kernels as kernel_module
from tuner.calibration.attention import calibrated_attention
from tuner.calibration.kernels import _cuda_efficient
from tuner.calibration.reference import reference_attention_function, reference_mask, register_reference
from tuner.engine.encoder import CalibratedEncoder
from tuner.engine.models import LoadedModel, load_model

pytestmark = pytest.mark.usefixtures("one_thread")

SCALE = 8**-0.5
WINDOW = 8  # as a config writes it: EmbeddingGemma's 512; a bidirectional Gemma3 row then sees 4 keys either side
LONG = random_texts(6, 14, 40, seed=11)  # every passage longer than the window, of mixed lengths (padded batches)


# ------------------------------------------------------------------------------------ the attention interface


class WindowedAttention(torch.nn.Module):
    """What a sliding layer passes as `module`: a layer index, the GQA group count, `is_causal`, and the model's depth
    (for the oracle)."""

    def __init__(self, causal: bool, groups: int = 2) -> None:
        super().__init__()
        self.layer_idx, self.num_key_value_groups, self.is_causal = 0, groups, causal
        self.config = type("Config", (), {"num_hidden_layers": 1})()


def transformers_window_mask(key_valid: torch.Tensor, window: int, causal: bool) -> torch.Tensor:
    """The boolean (B, 1, Q, K) mask transformers' own mask functions build for a sliding layer whose `sliding_window`
    argument is `window`: keys nearer than `window` (and not after the row, if causal), padding hidden."""
    batch, tokens = key_valid.shape
    if causal:
        function = sliding_window_causal_mask_function(window)
    else:  # this one's argument is inclusive: |q - k| <= w
        function = sliding_window_bidirectional_mask_function(window - 1)
    mask = sdpa_mask(
        batch,
        tokens,
        tokens,
        mask_function=function,
        attention_mask=key_valid,
        allow_is_causal_skip=False,
    )
    assert mask is not None
    return mask


def inputs(lengths: list[int], left: bool, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    tokens = max(lengths)
    key_valid = torch.zeros(len(lengths), tokens, dtype=torch.bool)
    for b, n in enumerate(lengths):
        key_valid[b, slice(tokens - n, None) if left else slice(0, n)] = True
    q = torch.randn(len(lengths), 4, tokens, 8, generator=generator)
    k = torch.randn(len(lengths), 2, tokens, 8, generator=generator) * 2
    v = torch.randn(len(lengths), 2, tokens, 8, generator=generator)
    return q, k, v, key_valid


@settings(max_examples=120, deadline=None)
@given(
    pooling=st.sampled_from(["cls", "last", "mean"]),
    variant=st.sampled_from(["uniform", "cls_soft", "cls_hard"]),
    shares=st.sampled_from(["equal", "by_size"]),
    strength=st.sampled_from([1.0, 0.6]),
    basket=st.integers(1, 6),
    window=st.integers(2, 9),
    causal=st.booleans(),
    left=st.booleans(),
    kernel=st.sampled_from(["fused", "public ops", "CUDA's"]),
    lengths=st.lists(st.integers(6, 30), min_size=1, max_size=4),
    seed=st.integers(0, 1000),
)
def test_the_engine_matches_the_oracle_in_a_sliding_layer(
    pooling: str,
    variant: str,
    shares: str,
    strength: float,
    basket: int,
    window: int,
    causal: bool,
    left: bool,
    kernel: str,
    lengths: list[int],
    seed: int,
) -> None:
    """The engine gets the mask transformers builds; the oracle builds the window itself from `sliding_window`. The
    mean path runs on the fused CPU kernel, on the public ops (no usable kernel), or through the CUDA kernel's
    wrapper (its calling convention computed on CPU)."""
    q, k, v, key_valid = inputs(lengths, left, seed)
    module = WindowedAttention(causal)
    mask = transformers_window_mask(key_valid, window, causal)
    config = CalibrationConfig(
        pooling=pooling,
        variant=variant,
        basket_shares=shares,
        strength=strength,
        basket_size=basket,
        layers=[0],
    )
    kernels = {
        "fused": kernel_module._fused_kernel("cpu"),
        "public ops": None,
        "CUDA's": _cuda_efficient(efficient_on_cpu),
    }
    with calibrating(config.resolve(1)), pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernel_module, "_fused_kernel", lambda device_type: kernels[kernel])
        got, _ = calibrated_attention(module, q, k, v, mask, scaling=SCALE, sliding_window=window)
        padding = key_valid[:, None, None, :]
        want, _ = reference_attention_function(module, q, k, v, padding, scaling=SCALE, sliding_window=window)
    assert torch.allclose(got[key_valid], want[key_valid], atol=2e-6, rtol=1e-6)


def test_the_oracle_builds_the_window_from_the_layers_argument_as_transformers_does() -> None:
    """Its mask for a padded batch equals transformers' on every real row, bidirectional and causal."""
    _, _, _, key_valid = inputs([19, 12, 7], False, 0)
    for causal in (False, True):
        for window in (1, 3, 5, 30):
            want = transformers_window_mask(key_valid, window, causal)
            got = reference_mask(WindowedAttention(causal), key_valid[:, None, None, :], None, 3, 19, 19, window)
            assert torch.equal(got & key_valid[:, None, :, None], want & key_valid[:, None, :, None]), (causal, window)


def test_the_pooled_row_is_calibrated_over_its_window_only() -> None:
    """CLS pooling, uniform at λ 1, window 4 keys either side of [CLS]: the pooled row gives nothing beyond its
    window, and its two baskets (keys 1-3 and 4, the second cut by the window) and [CLS] a third each, worked
    from the definition (not from the oracle)."""
    q, k, v, key_valid = inputs([20, 20], False, 3)
    mask = transformers_window_mask(key_valid, 5, causal=False)  # |q - k| < 5
    config = CalibrationConfig(pooling="cls", variant="uniform", strength=1.0, basket_size=3, layers=[0])
    seen: dict[str, torch.Tensor] = {}
    with calibrating(config.resolve(1), lambda layer, before, after, geometry: seen.update(before=before, after=after)):
        calibrated_attention(WindowedAttention(False), q, k, v, mask, scaling=SCALE, sliding_window=5)
    after = seen["after"].double()  # (B, H, K)
    assert seen["before"][..., 5:].abs().max() == 0 and after[..., 5:].abs().max() == 0
    third = torch.full_like(after[..., 0], 1 / 3)
    for basket in ([0], [1, 2, 3], [4]):
        assert torch.allclose(after[..., basket].sum(-1), third, atol=1e-6), basket
    before, basket = seen["before"].double(), slice(1, 4)  # proportions inside a basket are kept
    inside = [rows[..., basket] / rows[..., basket].sum(-1, keepdim=True) for rows in (before, after)]
    assert torch.allclose(*inside)


# [CLS] 0, content 1-8 in baskets of 3 ({1, 2, 3}, {4, 5, 6}, {7, 8}), [SEP] 9; each row sees the keys within 2 of
# it, all equally (equal scores). Worked by hand from the definition, uniform variant at λ 1:
# row 0 ([CLS]) sees [CLS] and keys 1-2 of the first basket: two baskets of its own, a half each;
# row 5 sees key 3 of the first basket, the second whole and key 7 of the third: three baskets, a third each;
# row 9 ([SEP]) sees keys 7-8, the third basket, and [SEP]: a half each. Nothing beyond the window.
# by_size gives a basket the share of the keys the row sees of it: with equal attention the rows stay as they are.
BY_HAND = {
    "equal": {0: [1 / 2, 1 / 4, 1 / 4], 5: [1 / 3, 1 / 9, 1 / 9, 1 / 9, 1 / 3], 9: [1 / 4, 1 / 4, 1 / 2]},
    "by_size": {0: [1 / 2, 1 / 4, 1 / 4], 5: [1 / 5] * 5, 9: [1 / 4, 1 / 4, 1 / 2]},
}


@pytest.mark.parametrize("shares", sorted(BY_HAND))
@pytest.mark.parametrize("computed_by", ["engine", "oracle"])
def test_rows_whose_windows_cover_different_parts_of_the_passage_by_hand(shares: str, computed_by: str) -> None:
    """Mean pooling: the pooling token at position 0 sees the passage's start, a middle row its middle, the last
    token its end. Each is calibrated over the baskets its window shows. The values are one-hot, so a row's output
    is its attention weights."""
    tokens, window = 10, 3
    q, k, v = torch.zeros(1, 1, tokens, tokens), torch.randn(1, 1, tokens, tokens), torch.eye(tokens)[None, None]
    key_valid = torch.ones(1, tokens, dtype=torch.bool)
    config = CalibrationConfig(
        pooling="mean",
        variant="uniform",
        basket_shares=shares,
        strength=1.0,
        basket_size=3,
        layers=[0],
    )
    module = WindowedAttention(False, groups=1)
    with calibrating(config.resolve(1)):
        if computed_by == "engine":
            mask = transformers_window_mask(key_valid, window, causal=False)
            weights, _ = calibrated_attention(module, q, k, v, mask, scaling=SCALE, sliding_window=window)
        else:
            weights, _ = reference_attention_function(module, q, k, v, None, scaling=SCALE, sliding_window=window)
    weights = weights[0, :, 0].double()  # (rows, keys)
    for row, want in BY_HAND[shares].items():
        seen = list(range(max(0, row - 2), min(tokens, row + 3)))
        assert torch.allclose(weights[row, seen], torch.tensor(want, dtype=torch.float64), atol=1e-6), row
        assert weights[row].sum().item() == pytest.approx(1.0), row  # so nothing beyond the window
    distance = (torch.arange(tokens)[:, None] - torch.arange(tokens)[None, :]).abs()
    assert weights[distance >= window].abs().max() == 0


# ------------------------------------------------------------------------------------------- tiny models


SHAPES = {
    # EmbeddingGemma's layout in small: bidirectional, a full layer between sliding ones (the masks alternate)
    "gemma3_text": {
        "num_key_value_heads": 2,
        "head_dim": 8,
        "query_pre_attn_scalar": 8,
        "use_bidirectional_attention": True,
        "sliding_window": WINDOW,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    },
    # ModernBERT: local attention of 8 tokens (4 either side) in the layers between its global ones
    "modernbert": {"local_attention": WINDOW, "global_attn_every_n_layers": 2},
}


def save_windowed(family: str, folder: Path) -> Path:
    """A tiny random bidirectional model of `family` with a sliding window far shorter than the passages."""
    config = AutoConfig.for_model(
        family,
        vocab_size=204,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=66,
        pad_token_id=1,
        initializer_range=0.1,
        **SHAPES[family],
    )
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(folder)
    build_tokenizer("xlmr", 64).save_pretrained(folder)  # <s> text </s>, like EmbeddingGemma's <bos> text <eos>
    return folder


@pytest.fixture(scope="module", params=sorted(SHAPES))
def windowed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_windowed(request.param, tmp_path_factory.mktemp(f"windowed-{request.param}"))


def hidden_states(
    model: LoadedModel,
    texts: list[str],
    config: CalibrationConfig | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The last hidden states of a padded batch of `texts` (calibrated by `config`), and which rows are real."""
    batch = model.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        if config is None:
            return model.model(**batch).last_hidden_state, batch["attention_mask"].bool()
        with calibrating(config.resolve(model.num_layers)):
            return model.model(**batch).last_hidden_state, batch["attention_mask"].bool()


def the_layers_slide(model: LoadedModel) -> None:
    """The case that matters: sliding layers whose window is shorter than every passage."""
    types = list(model.model.config.layer_types)
    assert "sliding_attention" in types and "full_attention" in types
    lengths = [len(model.tokenizer(text)["input_ids"]) for text in LONG]
    assert min(lengths) > WINDOW + 1, lengths


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
@pytest.mark.parametrize("variant", ["uniform", "cls_soft", "cls_hard"])
def test_a_windowed_model_calibrates_as_the_oracle(windowed: Path, pooling: str, variant: str) -> None:
    """Hidden states of every real row and pooled vectors, every layer calibrated (sliding and full), padded
    batches of passages two to four windows long (19-40 tokens, windows of 9 keys); the oracle-calibrated
    vectors are far from the ones a window-blind oracle gives, so an engine that ignored the window could not
    pass."""
    padding = "left" if pooling == "last" else "right"
    loaded = load_model(str(windowed), pooling=pooling, padding_side=padding)
    the_layers_slide(loaded)
    oracle = dataclasses.replace(loaded, model=load_as(windowed, register_reference()))
    config = loaded.default_config(variant=variant, strength=0.9, basket_size=3, layers=1.0)
    got, real = hidden_states(loaded, LONG[:4], config)
    want, _ = hidden_states(oracle, LONG[:4], config)
    assert (got[real] - want[real]).abs().max() < 1e-5
    vectors = CalibratedEncoder(loaded, config).encode(LONG, batch_size=3)
    assert np.abs(vectors - CalibratedEncoder(oracle, config).encode(LONG, batch_size=3)).max() < 1e-5
    assert np.abs(vectors - CalibratedEncoder(loaded).encode(LONG, batch_size=3)).max() > 1e-3, "calibration moved them"
    blind = dataclasses.replace(loaded, model=load_as(windowed, register_reference(), sliding_window=1024))
    window_blind = CalibratedEncoder(blind, config).encode(LONG, batch_size=3)
    assert np.abs(vectors - window_blind).max() > 1e-2, "the window matters"


@pytest.mark.parametrize("strength", [0.0, 1e-7])
def test_at_no_strength_a_windowed_model_is_its_own_sdpa_and_eager(windowed: Path, strength: float) -> None:
    """λ = 0 is SDPA's own call; at a vanishing λ the calibrated paths (the per-basket mean path, the pooled row)
    run and must give the model's own windowed attention: neither sees a key its window hides."""
    for pooling in ("mean", "cls"):
        loaded = load_model(str(windowed), pooling=pooling)
        config = loaded.default_config(strength=strength, basket_size=3, layers=1.0)
        got, real = hidden_states(loaded, LONG, config)
        for implementation in (PLAIN, "eager"):
            plain = dataclasses.replace(loaded, model=load_as(windowed, implementation))
            want, _ = hidden_states(plain, LONG, None)
            assert (got[real] - want[real]).abs().max() < 1e-5, (pooling, implementation)
    oracle = dataclasses.replace(loaded, model=load_as(windowed, register_reference()))
    want, _ = hidden_states(oracle, LONG, loaded.default_config(strength=0.0, layers=1.0))
    assert (got[real] - want[real]).abs().max() < 1e-5, "the oracle's own window is transformers'"


def test_a_windowed_model_resumed_from_a_layer_calibrates_as_the_oracle(tmp_path: Path) -> None:
    """The fast trials' path on EmbeddingGemma's layout: layer inputs recorded in the baseline pass, trials resumed
    from a sliding and from a full layer (mean pooling sharing its first-layer sums), equal to the oracle's vectors."""
    from tuner.data import PositionalDataset
    from tuner.evaluation.evaluator import Evaluator

    folder = save_windowed("gemma3_text", tmp_path / "gemma")
    loaded = load_model(str(folder), pooling="mean")
    oracle = dataclasses.replace(loaded, model=load_as(folder, register_reference()))
    corpus = {f"d{i}": text for i, text in enumerate(LONG)}
    queries = {f"q{i}": " ".join(text.split()[:3]) for i, text in enumerate(LONG)}
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(len(LONG))}
    dataset = PositionalDataset("windowed", corpus, queries, qrels, {q: ("begin",) for q in queries}, ("begin",))
    evaluator = Evaluator(loaded, dataset, 3, cache_dir=tmp_path / "cache", prefix_layers=(1, 2), ram_limit=2**30)
    evaluator.run(None)
    for layers, variant in (("last", "cls_soft"), ("last:2", "uniform"), ("last:2", "cls_hard")):
        config = loaded.default_config(variant=variant, strength=0.9, basket_size=3, layers=layers)
        got, _ = evaluator.document_vectors(config)
        assert np.abs(got - CalibratedEncoder(oracle, config).encode(LONG, batch_size=3)).max() < 1e-5, layers
    assert evaluator.counts.resumed == {2: 1, 1: 2}


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_alternating_masks_are_read_back_once_per_batch_and_kind(pooling: str, tmp_path: Path) -> None:
    """Sliding and full layers get a mask each, in turns (sliding, full, sliding): what each mask decides is read
    back from the device once per batch, so calibrating the second sliding layer too costs no host sync, with 2
    baskets or 20."""
    from benchmarks.gpu_counters import HostSyncs

    model = load_model(str(save_windowed("gemma3_text", tmp_path / "gemma")), pooling=pooling)
    batch = model.tokenizer(LONG[:3], padding=True, return_tensors="pt")
    counts = {}
    for basket in (2, 20):
        for layers in ([0, 1], [0, 1, 2]):
            config = model.default_config(strength=0.7, basket_size=basket, layers=layers)
            with torch.inference_mode(), calibrating(config.resolve(model.num_layers)), HostSyncs() as syncs:
                model.model(**batch)
            counts[basket, len(layers)] = syncs.total
    assert len(set(counts.values())) == 1, counts
