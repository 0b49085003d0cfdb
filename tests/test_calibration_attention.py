"""The attention function (attention.py) against eager attention with the oracle applied."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.calibration import CalibrationConfig, calibrating
from tuner.calibration.attention import calibrated_attention
from tuner.calibration.reference import reference_attention


class FakeAttention(torch.nn.Module):
    """What transformers passes as `module`: a layer index and, for GQA, the group count."""

    def __init__(self, layer: int, groups: int, causal: bool) -> None:
        super().__init__()
        self.layer_idx, self.num_key_value_groups, self.is_causal = layer, groups, causal


def build_inputs(lengths: list[int], left: bool, causal: bool, heads: int, kv_heads: int, dtype: torch.dtype, seed: int):
    generator = torch.Generator().manual_seed(seed)
    batch, tokens, dim = len(lengths), max(lengths), 8
    key_valid = torch.zeros(batch, tokens, dtype=torch.bool)
    for b, n in enumerate(lengths):
        if left:
            key_valid[b, tokens - n :] = True
        else:
            key_valid[b, :n] = True
    allowed = key_valid[:, None, None, :].expand(batch, 1, tokens, tokens).clone()
    if causal:
        allowed &= torch.ones(tokens, tokens, dtype=torch.bool).tril()
    q = torch.randn(batch, heads, tokens, dim, generator=generator).to(dtype)
    k = torch.randn(batch, kv_heads, tokens, dim, generator=generator).to(dtype) * 2
    v = torch.randn(batch, kv_heads, tokens, dim, generator=generator).to(dtype)
    return q, k, v, allowed, key_valid


def compare(pooling: str, lengths: list[int], left: bool, dtype: torch.dtype, seed: int, strength: float = 0.7, kv_heads: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    causal = pooling == "last"
    q, k, v, allowed, key_valid = build_inputs(lengths, left, causal, 4, kv_heads, dtype, seed)
    config = CalibrationConfig(pooling=pooling, strength=strength, basket_size=3, layers=[0], variant="cls_soft")
    spec = config.resolve(1)
    module = FakeAttention(0, 4 // kv_heads, causal)
    with calibrating(spec):
        got, _ = calibrated_attention(module, q, k, v, allowed, scaling=8**-0.5)
    want = reference_attention(q, k, v, allowed, 8**-0.5, spec)
    return got, want, key_valid


@settings(max_examples=60, deadline=None)
@given(
    pooling=st.sampled_from(["cls", "last", "mean"]),
    lengths=st.lists(st.integers(2, 30), min_size=1, max_size=8),
    left=st.booleans(),
    kv_heads=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 1000),
)
def test_attention_function_matches_oracle_fp32(pooling: str, lengths: list[int], left: bool, kv_heads: int, seed: int) -> None:
    """Attention weights agree to 1e-6 (test_calibration_rows); outputs, after the value matmul, to 1e-6 relative."""
    got, want, valid_rows = compare(pooling, lengths, left, torch.float32, seed, kv_heads=kv_heads)
    assert torch.allclose(got[valid_rows].double(), want[valid_rows], atol=1e-6, rtol=1e-6)


# Half precision: scores and calibration run in float32, the attention output is cast back, so the
# error is that of one rounding of the output to 11 (fp16) / 8 (bf16) significant bits.
HALF_TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("pooling", ["cls", "last", "mean"])
def test_attention_function_half_precision_tolerance(dtype: torch.dtype, pooling: str) -> None:
    got, want, valid_rows = compare(pooling, [25, 17, 9], pooling == "last", dtype, seed=3)
    assert got.dtype == dtype
    error = (got[valid_rows].double() - want[valid_rows]).abs().max()
    assert error < HALF_TOLERANCE[dtype]


def test_outside_a_calibrating_block_it_is_plain_sdpa() -> None:
    q, k, v, allowed, key_valid = build_inputs([12, 7], False, False, 4, 4, torch.float32, 0)
    got, _ = calibrated_attention(FakeAttention(0, 1, False), q, k, v, allowed, scaling=8**-0.5)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=8**-0.5).transpose(1, 2)
    assert torch.equal(got, want)


def test_layers_outside_the_calibrated_set_are_untouched() -> None:
    q, k, v, allowed, _ = build_inputs([30, 20], False, False, 4, 4, torch.float32, 1)
    spec = CalibrationConfig(strength=1.0, basket_size=3, layers=[1]).resolve(2)
    with calibrating(spec):
        layer0, _ = calibrated_attention(FakeAttention(0, 1, False), q, k, v, allowed, scaling=8**-0.5)
        layer1, _ = calibrated_attention(FakeAttention(1, 1, False), q, k, v, allowed, scaling=8**-0.5)
    plain, _ = calibrated_attention(FakeAttention(0, 1, False), q, k, v, allowed, scaling=8**-0.5)
    assert torch.equal(layer0, plain)
    assert not torch.allclose(layer1[:, 0], plain[:, 0])  # the pooled ([CLS]) row moved
    assert torch.equal(layer1[:, 1:], plain[:, 1:])  # every other row is SDPA's


def test_no_mask_means_every_key_is_real() -> None:
    """transformers passes no mask to a batch without padding; the function must still calibrate."""
    q, k, v, allowed, key_valid = build_inputs([20, 20], False, False, 4, 4, torch.float32, 2)
    spec = CalibrationConfig(strength=1.0, basket_size=3, layers=[0]).resolve(1)
    with calibrating(spec):
        with_mask, _ = calibrated_attention(FakeAttention(0, 1, False), q, k, v, allowed, scaling=8**-0.5)
        without, _ = calibrated_attention(FakeAttention(0, 1, False), q, k, v, None, scaling=8**-0.5)
    assert torch.allclose(with_mask, without, atol=1e-6)
