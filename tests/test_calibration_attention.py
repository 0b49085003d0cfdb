"""The attention function (attention.py) against eager attention with the oracle applied."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
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
@example(pooling="cls", lengths=[2, 26, 2, 2, 2, 2, 2, 29], left=False, kv_heads=1, seed=143)  # SDPA's own fp32 rounding
def test_attention_function_matches_oracle_fp32(pooling: str, lengths: list[int], left: bool, kv_heads: int, seed: int) -> None:
    """Attention weights agree to 1e-6 (test_calibration_rows); outputs, after the value matmul, to 2e-6 + 1e-6
    relative: values are of order 1, and float32 sums of up to 30 of them (SDPA's rows too) round by ~1e-6."""
    got, want, valid_rows = compare(pooling, lengths, left, torch.float32, seed, kv_heads=kv_heads)
    assert torch.allclose(got[valid_rows].double(), want[valid_rows], atol=2e-6, rtol=1e-6)


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


def test_mean_pooling_under_any_mask_is_calibrate_rows_applied_to_the_masked_softmax() -> None:
    """A causal mask hides whole baskets from early rows: such a basket gets no mass (rows.py's rule)."""
    from tuner.calibration.attention import _Active
    from tuner.calibration.rows import calibrate_rows

    q, k, v, allowed, _ = build_inputs([23, 30, 11], False, True, 4, 2, torch.float32, 5)
    spec = CalibrationConfig(pooling="mean", strength=0.8, basket_size=4, layers=[0], variant="cls_soft").resolve(1)
    with calibrating(spec):
        got, _ = calibrated_attention(FakeAttention(0, 2, True), q, k, v, allowed, scaling=8**-0.5)
    keys = k.repeat_interleave(2, dim=1)
    attn = (q @ keys.transpose(-1, -2) * 8**-0.5).masked_fill(~allowed, float("-inf")).softmax(-1)
    geometry = _Active(spec, None).geometry(allowed, 3, 30, q.device)
    weights = calibrate_rows(attn.flatten(1, 2), geometry, spec).view_as(attn)
    want = (weights @ v.repeat_interleave(2, dim=1)).transpose(1, 2)
    assert torch.allclose(got, want, atol=1e-6)


def test_the_unfused_path_for_other_devices_matches_the_fused_kernel() -> None:
    """Output and log-sum-exp per row, with a bias that hides some keys and all keys of one row."""
    from tuner.calibration.attention import _attention_with_lse, _attention_with_lse_unfused

    q, k, v, _, _ = build_inputs([9, 9], False, False, 4, 4, torch.float32, 6)
    bias = torch.zeros(2, 1, 9, 9)
    bias[0, 0, :, 5:] = float("-inf")
    bias[1, 0, 3] = float("-inf")
    fused_out, fused_lse = _attention_with_lse(q, k, v, bias, 8**-0.5)
    out, lse = _attention_with_lse_unfused(q, k, v, bias, 8**-0.5)
    seen = torch.ones(2, 1, 9, dtype=torch.bool)
    seen[1, 0, 3] = False
    assert torch.allclose(out, fused_out, atol=1e-6)
    assert torch.allclose(lse[seen.expand_as(lse)], fused_lse[seen.expand_as(lse)], atol=1e-5)


def test_an_observer_sees_the_average_row_before_and_after_calibration() -> None:
    """Mean pooling: averages over the real query rows of the oracle's weights, per head."""
    from tuner.calibration.reference import calibrated_query_rows, reference_calibrate

    q, k, v, allowed, key_valid = build_inputs([26, 19], False, False, 4, 4, torch.float32, 7)
    spec = CalibrationConfig(pooling="mean", strength=0.6, basket_size=5, layers=[0], variant="uniform").resolve(1)
    seen = {}
    with calibrating(spec, lambda layer, before, after, geometry: seen.update(before=before, after=after)):
        calibrated_attention(FakeAttention(0, 1, False), q, k, v, allowed, scaling=8**-0.5)
    attn = (q.double() @ k.double().transpose(-1, -2) * 8**-0.5).masked_fill(~allowed, float("-inf")).softmax(-1)
    roles = tuple(role for role, _ in spec.policies)
    after = reference_calibrate(attn, key_valid, calibrated_query_rows("mean", key_valid), spec, roles)
    rows = key_valid[:, None, :, None].double()
    for name, weights in (("before", attn), ("after", after)):
        want = (weights * rows).sum(2) / rows.sum(2)
        assert torch.allclose(seen[name].double(), want, atol=1e-6), name


def test_a_row_that_sees_no_key_comes_out_zero_not_nan() -> None:
    """Left padding under a causal mask: a padding row sees nothing, as SDPA's kernel it returns 0."""
    q, k, v, allowed, key_valid = build_inputs([12, 5], True, True, 4, 4, torch.float32, 8)
    spec = CalibrationConfig(pooling="mean", strength=1.0, basket_size=2, layers=[0]).resolve(1)
    with calibrating(spec):
        got, _ = calibrated_attention(FakeAttention(0, 1, True), q, k, v, allowed, scaling=8**-0.5)
    assert not got.isnan().any()
    assert torch.equal(got[1, :7], torch.zeros_like(got[1, :7]))


@given(keys=st.integers(1, 600), data=st.data())
def test_a_basket_is_handed_to_the_kernel_in_a_window_of_whole_key_blocks(keys: int, data: st.DataObject) -> None:
    """The fused kernel is fast on multiples of 16 keys: the window covers the basket, stays inside the
    keys, and is a multiple of 16 wide unless it is all the keys (the extra keys are masked out)."""
    from tuner.calibration.attention import KERNEL_KEY_MULTIPLE, _kernel_window

    lo = data.draw(st.integers(0, keys - 1))
    hi = data.draw(st.integers(lo + 1, keys))
    begin, end = _kernel_window(lo, hi, keys)
    assert 0 <= begin <= lo < hi <= end <= keys
    assert (end - begin) % KERNEL_KEY_MULTIPLE == 0 or end - begin == keys
    assert end - begin < (hi - lo) + KERNEL_KEY_MULTIPLE
