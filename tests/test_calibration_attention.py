"""The attention function (attention.py) at transformers' interface, against the oracle (reference.py).

Masks are built here as transformers builds them: a boolean (B, 1, Q, K) mask when a batch has
padding (padding keys hidden, and for a decoder the causal triangle too), and no mask at all for an
unpadded batch, in which case causality comes from `is_causal` (argument, else the module's
attribute, else True) as in transformers' own SDPA function.
"""

from __future__ import annotations

import inspect
import warnings
from contextlib import nullcontext
from unittest import mock

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from tuner.calibration import CalibrationConfig, calibrating
from tuner.calibration import attention as engine_module
from tuner.calibration import kernels as kernel_module
from tuner.calibration.attention import calibrated_attention
from tuner.calibration.reference import (
    calibrated_query_rows,
    reference_attention,
    reference_calibrate,
    reference_isolated,
)

SCALE = 8**-0.5
ABSENT = object()


class FakeAttention(torch.nn.Module):
    """What transformers passes as `module`: a layer index, the GQA group count and (usually) `is_causal`."""

    def __init__(self, layer: int, groups: int, causal: bool | object) -> None:
        super().__init__()
        self.layer_idx, self.num_key_value_groups = layer, groups
        if causal is not ABSENT:
            self.is_causal = causal


def build_inputs(
    lengths: list[int], left: bool, heads: int, kv_heads: int, dtype: torch.dtype, seed: int, keys: int = 0
):
    """Random query/key/value for items of `lengths` real tokens (padded to `keys`) and the real-key mask."""
    generator = torch.Generator().manual_seed(seed)
    batch, tokens, dim = len(lengths), max(keys, *lengths), 8
    key_valid = torch.zeros(batch, tokens, dtype=torch.bool)
    for b, n in enumerate(lengths):
        if left:
            key_valid[b, tokens - n :] = True
        else:
            key_valid[b, :n] = True
    q = torch.randn(batch, heads, tokens, dim, generator=generator).to(dtype)
    k = torch.randn(batch, kv_heads, tokens, dim, generator=generator).to(dtype) * 2
    v = torch.randn(batch, kv_heads, tokens, dim, generator=generator).to(dtype)
    return q, k, v, key_valid


def mask_of(key_valid: torch.Tensor, causal: bool) -> torch.Tensor:
    """The boolean (B, 1, Q, K) mask transformers hands over for a padded batch."""
    batch, tokens = key_valid.shape
    allowed = key_valid[:, None, None, :].expand(batch, 1, tokens, tokens).clone()
    return allowed & torch.ones(tokens, tokens, dtype=torch.bool).tril() if causal else allowed


def engine(config: CalibrationConfig, module: torch.nn.Module, q, k, v, mask, **kwargs) -> torch.Tensor:
    with calibrating(config.resolve(1)):
        return calibrated_attention(module, q, k, v, mask, scaling=SCALE, **kwargs)[0]


def compare(
    pooling: str,
    lengths: list[int],
    left: bool,
    dtype: torch.dtype,
    seed: int,
    strength: float = 0.7,
    kv_heads: int = 2,
):
    causal = pooling == "last"
    q, k, v, key_valid = build_inputs(lengths, left, 4, kv_heads, dtype, seed)
    allowed = mask_of(key_valid, causal)
    config = CalibrationConfig(pooling=pooling, strength=strength, basket_size=3, layers=[0], variant="cls_soft")
    got = engine(config, FakeAttention(0, 4 // kv_heads, causal), q, k, v, allowed)
    return got, reference_attention(q, k, v, allowed, SCALE, config), key_valid


POLICIES = ("equal", "original", "fixed")


@st.composite
def attention_cases(draw: st.DrawFn) -> tuple:
    """Every variant and explicit policies, any isolation (none included), either basket_shares, causal or
    not, padded (left or right) or not, any λ, basket size and batch size; an unpadded batch comes with or
    without a mask."""
    pooling = draw(st.sampled_from(["cls", "last", "mean"]))
    isolate = draw(st.none() | st.lists(st.sampled_from(["first", "last"]), unique=True, max_size=2))
    config = CalibrationConfig(
        pooling=pooling,
        variant=draw(st.sampled_from(["uniform", "cls_soft", "cls_hard"])),
        strength=draw(st.sampled_from([0.0, 1.0]) | st.floats(0.05, 1.0)),
        basket_size=draw(st.integers(1, 6)),
        weight=draw(st.floats(0.05, 0.95)),
        isolate=isolate,
        basket_shares=draw(st.sampled_from(["equal", "by_size"])),
        layers=[0],
    )
    if draw(st.booleans()):
        roles = reference_isolated(config)
        config = config.model_copy(update={"policies": {r: draw(st.sampled_from(POLICIES)) for r in roles}})
    lengths = draw(st.lists(st.integers(1, 24), min_size=1, max_size=4))
    keys = max(lengths) + draw(st.integers(0, 2))
    padded = keys > min(lengths)
    given_mask = padded or draw(st.booleans())
    causal = draw(st.booleans())
    # how a call without a mask learns it is causal: the argument (overriding the module), the module's
    # attribute, or nothing (transformers then assumes causal)
    signal = draw(st.sampled_from(["argument", "attribute"] + (["absent"] if causal else [])))
    fallback = draw(st.booleans())  # without the private fused CPU kernel (see `_fused_kernel`)
    left, kv_heads, seed = draw(st.booleans()), draw(st.sampled_from([1, 2, 4])), draw(st.integers(0, 1000))
    by_token = draw(st.booleans())  # q/k/v as transformers hands them over: views of (B, T, H, D) projections
    # an additive score term (T5's, MPNet's relative position bias): none, one for the batch, or one per item
    bias = draw(st.sampled_from([None, 1, len(lengths)]))
    return config, lengths, keys, left, given_mask, causal, signal, kv_heads, seed, fallback, by_token, bias


@settings(max_examples=200, deadline=None)
@given(attention_cases())
@example(
    (
        CalibrationConfig(pooling="cls", basket_size=3, strength=0.7, layers=[0]),
        [2, 26, 2, 2, 2, 2, 2, 29],
        29,
        False,
        True,
        False,
        "attribute",
        1,
        143,
        False,
        False,
        None,
    )
)  # SDPA's own fp32 rounding
def test_engine_matches_oracle_at_the_attention_interface(case: tuple) -> None:
    """Outputs of the real rows agree to 2e-6 + 1e-6 relative: values are of order 1, and float32 sums of up
    to 30 of them (SDPA's rows too) round by ~1e-6; the oracle runs in float64."""
    config, lengths, keys, left, given_mask, causal, signal, kv_heads, seed, fallback, by_token, bias_items = case
    q, k, v, key_valid = build_inputs(lengths, left, 4, kv_heads, torch.float32, seed, keys)
    if by_token:
        q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    allowed = mask_of(key_valid, causal)
    module = FakeAttention(0, 4 // kv_heads, {"argument": not causal, "attribute": causal, "absent": ABSENT}[signal])
    kwargs = {"is_causal": causal} if signal == "argument" else {}
    bias = position_bias(bias_items, 4, q.shape[2], seed) if bias_items else None
    with mock.patch.object(kernel_module, "_fused_kernel", lambda device_type: None) if fallback else nullcontext():
        got = engine(config, module, q, k, v, allowed if given_mask else None, position_bias=bias, **kwargs)
    want = reference_attention(q, k, v, allowed, SCALE, config, position_bias=bias)
    assert torch.allclose(got[key_valid].double(), want[key_valid], atol=2e-6, rtol=1e-6)


def position_bias(items: int, heads: int, tokens: int, seed: int) -> torch.Tensor:
    """A random additive score term (items, heads, Q, K), of the size MPNet's relative biases reach."""
    return torch.randn(items, heads, tokens, tokens, generator=torch.Generator().manual_seed(seed + 1)) * 2


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


@pytest.mark.parametrize("pooling", ["cls", "last", "mean"])
def test_an_unpadded_causal_batch_is_calibrated_under_its_causal_mask(pooling: str) -> None:
    """transformers 5 hands a decoder's unpadded batch over with no mask: "no mask" is not "every key"."""
    q, k, v, key_valid = build_inputs([20, 20], False, 4, 2, torch.float32, 4)
    config = CalibrationConfig(pooling=pooling, strength=0.8, basket_size=3, layers=[0])
    got = engine(config, FakeAttention(0, 2, True), q, k, v, None)
    want = reference_attention(q, k, v, mask_of(key_valid, causal=True), SCALE, config)
    assert torch.allclose(got.double(), want, atol=2e-6, rtol=1e-6)


@pytest.mark.parametrize(
    ("argument", "attribute", "causal"),
    [(None, True, True), (None, False, False), (None, ABSENT, True), (False, True, False), (True, False, True)],
)
def test_causality_is_decided_as_transformers_sdpa_decides(argument, attribute, causal: bool) -> None:
    """No mask: the `is_causal` argument if given, else the module's attribute, else True."""
    q, k, v, _ = build_inputs([9, 9], False, 4, 4, torch.float32, 5)
    config = CalibrationConfig(pooling="mean", strength=1.0, basket_size=2, layers=[0])
    kwargs = {} if argument is None else {"is_causal": argument}
    got = engine(config, FakeAttention(0, 1, attribute), q, k, v, None, **kwargs)
    allowed = torch.ones(2, 1, 9, 9, dtype=torch.bool)
    allowed = allowed.tril() if causal else allowed
    want = reference_attention(q, k, v, allowed, SCALE, config)
    assert torch.allclose(got.double(), want, atol=2e-6)
    plain, _ = sdpa_attention_forward(FakeAttention(0, 1, attribute), q, k, v, None, scaling=SCALE, **kwargs)
    assert torch.allclose(
        plain.double(), reference_attention(q, k, v, allowed, SCALE, None), atol=2e-6
    )  # the same rule


@pytest.mark.parametrize("pooling", ["cls", "last", "mean"])
@pytest.mark.parametrize("left", [False, True])
def test_no_isolated_token(pooling: str, left: bool) -> None:
    """isolate: [] — every real token is content; cls/last still calibrate the first/last real row."""
    q, k, v, key_valid = build_inputs([17, 12, 3], left, 4, 2, torch.float32, 6)
    allowed = mask_of(key_valid, pooling == "last")
    config = CalibrationConfig(pooling=pooling, isolate=[], strength=0.9, basket_size=4, layers=[0])
    got = engine(config, FakeAttention(0, 2, pooling == "last"), q, k, v, allowed)
    want = reference_attention(q, k, v, allowed, SCALE, config)
    assert torch.allclose(got[key_valid].double(), want[key_valid], atol=2e-6, rtol=1e-6)
    assert not torch.allclose(
        got[key_valid].double(), reference_attention(q, k, v, allowed, SCALE, None)[key_valid], atol=1e-4
    )


@pytest.mark.parametrize("pooling", ["cls", "last", "mean"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", ["strength 0", "no basket filled"])
def test_nothing_to_calibrate_is_exactly_plain_sdpa(pooling: str, causal: bool, case: str) -> None:
    """λ = 0, or a batch whose passages are all shorter than one basket, take SDPA's own path: the very
    same numbers, not a recomputation that agrees to rounding."""
    q, k, v, key_valid = build_inputs([14, 9], False, 4, 2, torch.float32, 7)
    module = FakeAttention(0, 2, causal)
    strength, basket = (0.0, 3) if case == "strength 0" else (1.0, 14)
    config = CalibrationConfig(pooling=pooling, strength=strength, basket_size=basket, layers=[0])
    for mask in (mask_of(key_valid, causal), None):
        got = engine(config, module, q, k, v, mask)
        want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=SCALE)
        assert torch.equal(got, want)


def test_outside_a_calibrating_block_it_is_plain_sdpa() -> None:
    q, k, v, key_valid = build_inputs([12, 7], False, 4, 4, torch.float32, 0)
    allowed = mask_of(key_valid, False)
    got, _ = calibrated_attention(FakeAttention(0, 1, False), q, k, v, allowed, scaling=SCALE)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=SCALE).transpose(1, 2)
    assert torch.equal(got, want)


def test_layers_outside_the_calibrated_set_are_untouched() -> None:
    q, k, v, key_valid = build_inputs([30, 20], False, 4, 4, torch.float32, 1)
    allowed = mask_of(key_valid, False)
    spec = CalibrationConfig(strength=1.0, basket_size=3, layers=[1]).resolve(2)
    with calibrating(spec):
        layer0, _ = calibrated_attention(FakeAttention(0, 1, False), q, k, v, allowed, scaling=SCALE)
        layer1, _ = calibrated_attention(FakeAttention(1, 1, False), q, k, v, allowed, scaling=SCALE)
    plain, _ = calibrated_attention(FakeAttention(0, 1, False), q, k, v, allowed, scaling=SCALE)
    assert torch.equal(layer0, plain)
    assert not torch.allclose(layer1[:, 0], plain[:, 0])  # the pooled ([CLS]) row moved
    assert torch.equal(layer1[:, 1:], plain[:, 1:])  # every other row is SDPA's


def test_no_mask_on_a_bidirectional_model_means_every_key_is_real() -> None:
    """transformers passes no mask to an encoder's batch without padding; the function must still calibrate."""
    q, k, v, key_valid = build_inputs([20, 20], False, 4, 4, torch.float32, 2)
    config = CalibrationConfig(strength=1.0, basket_size=3, layers=[0])
    with_mask = engine(config, FakeAttention(0, 1, False), q, k, v, mask_of(key_valid, False))
    without = engine(config, FakeAttention(0, 1, False), q, k, v, None)
    assert torch.allclose(with_mask, without, atol=1e-6)


def test_the_signature_is_transformers_sdpa_signature() -> None:
    """transformers calls attention functions by keyword, but the order must match for positional callers."""
    ours = list(inspect.signature(calibrated_attention).parameters)
    theirs = list(inspect.signature(sdpa_attention_forward).parameters)
    assert (
        ours[:8]
        == theirs[:8]
        == ["module", "query", "key", "value", "attention_mask", "dropout", "scaling", "is_causal"]
    )
    q, k, v, key_valid = build_inputs([10, 10], False, 4, 4, torch.float32, 3)
    config = CalibrationConfig(strength=1.0, basket_size=3, layers=[0])
    with calibrating(config.resolve(1)):
        positional, _ = calibrated_attention(FakeAttention(0, 1, True), q, k, v, None, 0.0, SCALE, False)
    assert torch.equal(positional, engine(config, FakeAttention(0, 1, False), q, k, v, None))


def test_dropout_in_a_calibrated_layer_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calibrated rows are computed without dropout (a model in train mode); say so once per process."""
    monkeypatch.setattr(engine_module, "_WARNED", set())
    q, k, v, key_valid = build_inputs([10, 10], False, 4, 4, torch.float32, 3)
    config = CalibrationConfig(strength=1.0, basket_size=3, layers=[0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine(config, FakeAttention(0, 1, False), q, k, v, None, dropout=0.0)
        assert not caught
        for _ in range(3):
            engine(config, FakeAttention(0, 1, False), q, k, v, None, dropout=0.1)
        calibrated_attention(FakeAttention(0, 1, False), q, k, v, None, dropout=0.1, scaling=SCALE)  # not calibrating
    assert len(caught) == 1
    assert "dropout" in str(caught[0].message) and "eval()" in str(caught[0].message)


@pytest.mark.parametrize("pooling", ["cls", "last", "mean"])
@pytest.mark.parametrize("strength", [0.0, 0.8])
def test_a_position_bias_enters_every_score_calibrated_or_not(pooling: str, strength: float) -> None:
    """The score term is part of the attention the model computes: left out of calibrated rows, the vectors
    would move for a reason that is not calibration. At λ = 0 the layer is transformers' own SDPA with it."""
    q, k, v, key_valid = build_inputs([14, 9], pooling == "last", 4, 4, torch.float32, 3)
    allowed = mask_of(key_valid, pooling == "last")
    bias = position_bias(1, 4, q.shape[2], 3)
    config = CalibrationConfig(pooling=pooling, strength=strength, basket_size=3, layers=[0])
    module = FakeAttention(0, 1, pooling == "last")
    got = engine(config, module, q, k, v, allowed, position_bias=bias)
    want = reference_attention(q, k, v, allowed, SCALE, config, position_bias=bias)
    assert torch.allclose(got[key_valid].double(), want[key_valid], atol=2e-6, rtol=1e-6)
    unbiased = reference_attention(q, k, v, allowed, SCALE, config)
    assert (got[key_valid].double() - unbiased[key_valid]).abs().max() > 1e-2, "the bias must matter in this case"
    if strength == 0.0:
        plain, _ = sdpa_attention_forward(module, q, k, v, allowed, scaling=SCALE, position_bias=bias)
        assert torch.equal(got, plain)


@pytest.mark.parametrize("shares", ["equal", "by_size"])
def test_mean_pooling_under_any_mask_is_calibrate_rows_applied_to_the_masked_softmax(shares: str) -> None:
    """The mean path (per-basket kernel) and the row path (rows.py) compute the same thing under a causal mask."""
    from tuner.calibration.attention import _Active
    from tuner.calibration.rows import calibrate_rows

    q, k, v, key_valid = build_inputs([23, 30, 11], False, 4, 2, torch.float32, 5)
    allowed = mask_of(key_valid, True)
    spec = CalibrationConfig(
        pooling="mean", strength=0.8, basket_size=4, layers=[0], variant="cls_soft", basket_shares=shares
    ).resolve(1)
    with calibrating(spec):
        got, _ = calibrated_attention(FakeAttention(0, 2, True), q, k, v, allowed, scaling=SCALE)
    keys = k.repeat_interleave(2, dim=1)
    attn = (q @ keys.transpose(-1, -2) * SCALE).masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
    geometry = _Active(spec, None).state(allowed, None, 3, 30, q.device).geometry
    seen = allowed.expand_as(attn).flatten(1, 2)
    weights = calibrate_rows(attn.flatten(1, 2), geometry, spec, seen).view_as(attn)
    want = (weights @ v.repeat_interleave(2, dim=1)).transpose(1, 2)
    assert torch.allclose(got[key_valid], want[key_valid], atol=1e-6)


def test_the_unfused_path_matches_the_fused_kernel() -> None:
    """Output and log-sum-exp per row, with a bias that hides some keys and all keys of one row."""
    from tuner.calibration.kernels import _attention_with_lse_unfused, attention_with_lse

    q, k, v, _ = build_inputs([9, 9], False, 4, 4, torch.float32, 6)
    bias = torch.zeros(2, 1, 9, 9)
    bias[0, 0, :, 5:] = float("-inf")
    bias[1, 0, 3] = float("-inf")
    fused_out, fused_lse = attention_with_lse(q, k, v, bias, SCALE)
    out, lse = _attention_with_lse_unfused(q, k, v, bias, SCALE)
    seen = torch.ones(2, 1, 9, dtype=torch.bool)
    seen[1, 0, 3] = False
    assert torch.allclose(out, fused_out, atol=1e-6)
    assert torch.allclose(lse[seen.expand_as(lse)], fused_lse[seen.expand_as(lse)], atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_without_the_private_cpu_kernel_the_fallback_agrees(monkeypatch: pytest.MonkeyPatch, causal: bool) -> None:
    """Where the capability probe finds no usable fused CPU kernel, the mean path runs on the public ops."""
    q, k, v, key_valid = build_inputs([21, 16, 9], True, 4, 2, torch.float32, 8)
    allowed = mask_of(key_valid, causal)
    config = CalibrationConfig(pooling="mean", variant="cls_hard", strength=0.6, basket_size=4, layers=[0])
    module = FakeAttention(0, 2, causal)
    assert kernel_module._fused_kernel("cpu") is not None  # torch 2.13 CPU has it: both paths are exercised here
    fused = engine(config, module, q, k, v, allowed)
    monkeypatch.setattr(kernel_module, "_fused_kernel", lambda device_type: None)
    fallback = engine(config, module, q, k, v, allowed)
    want = reference_attention(q, k, v, allowed, SCALE, config)
    assert torch.allclose(fallback[key_valid], fused[key_valid], atol=2e-6)
    assert torch.allclose(fallback[key_valid].double(), want[key_valid], atol=2e-6, rtol=1e-6)


CPU = torch.device("cpu")


def test_the_kernel_probe_refuses_an_op_that_is_missing_or_answers_otherwise() -> None:
    from tuner.calibration.kernels import _cpu_flash, _probe_kernel

    real = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    kernel = _cpu_flash(real)
    assert _probe_kernel(kernel, CPU) is kernel

    def missing(*args, **kwargs):
        raise RuntimeError("no such op on this build")

    def output_only(query, key, value, attn_mask=None, scale=None):
        return (real(query, key, value, attn_mask=attn_mask, scale=scale)[0],)

    def lse_per_token(query, key, value, attn_mask=None, scale=None):  # another layout: (B, Q, H)
        out, lse = real(query, key, value, attn_mask=attn_mask, scale=scale)
        return out, lse.transpose(1, 2).contiguous()

    def log2_lse(query, key, value, attn_mask=None, scale=None):  # same shape, other meaning
        out, lse = real(query, key, value, attn_mask=attn_mask, scale=scale)
        return out, lse / torch.log(torch.tensor(2.0))

    assert _probe_kernel(None, CPU) is None
    for op in (missing, output_only, lse_per_token, log2_lse):
        assert _probe_kernel(_cpu_flash(op), CPU) is None


def efficient_on_cpu(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
    """The memory-efficient CUDA kernel's calling convention, computed on CPU: a full (B, H, Q, K) bias in, four
    outputs out, the log-sum-exp's rows padded to a multiple of 32 with what the padding happens to hold."""
    assert attn_bias is None or attn_bias.shape == (*query.shape[:3], key.shape[2])
    assert compute_log_sumexp and dropout_p == 0.0 and not is_causal
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, attn_mask=attn_bias, scale=scale
    )
    padded = torch.full((*lse.shape[:2], -(-lse.shape[2] // 32) * 32), 7.0)
    padded[..., : lse.shape[2]] = lse
    return out, padded, torch.zeros(()), torch.zeros(())


def test_the_cuda_kernel_is_probed_and_falls_back_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA branch cannot run here: its wrapper is exercised with the CUDA kernel's calling convention on
    CPU (the engine then agrees with the oracle), and the real CUDA op, which has no CPU kernel, fails its probe."""
    from tuner.calibration.kernels import _cuda_efficient, _probe_kernel

    assert _probe_kernel(_cuda_efficient(torch.ops.aten._scaled_dot_product_efficient_attention), CPU) is None
    kernel = _probe_kernel(_cuda_efficient(efficient_on_cpu), CPU)
    assert kernel is not None
    q, k, v, key_valid = build_inputs([21, 16, 9], True, 4, 2, torch.float32, 8)
    allowed = mask_of(key_valid, True)
    config = CalibrationConfig(pooling="mean", variant="cls_soft", strength=0.8, basket_size=4, layers=[0])
    monkeypatch.setattr(kernel_module, "_fused_kernel", lambda device_type: kernel)
    got = engine(config, FakeAttention(0, 2, True), q, k, v, allowed)
    want = reference_attention(q, k, v, allowed, SCALE, config)
    assert torch.allclose(got[key_valid].double(), want[key_valid], atol=2e-6, rtol=1e-6)


def test_a_kernel_that_fails_its_probe_is_said_once_and_the_engine_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU build whose fused kernel answers otherwise: one warning, then every call takes the scores path."""
    from tuner.calibration.kernels import _cuda_efficient

    monkeypatch.setitem(
        kernel_module.FUSED_KERNELS, "cpu", (_cuda_efficient, "_scaled_dot_product_efficient_attention")
    )
    kernel_module._fused_kernel.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="did not pass its probe on cpu"):
            assert kernel_module._fused_kernel("cpu") is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert kernel_module._fused_kernel("cpu") is None  # probed once
        q, k, v, key_valid = build_inputs([13, 9], False, 4, 4, torch.float32, 3)
        allowed = mask_of(key_valid, False)
        config = CalibrationConfig(pooling="mean", strength=0.6, basket_size=3, layers=[0])
        got = engine(config, FakeAttention(0, 1, False), q, k, v, allowed)
        assert torch.allclose(
            got[key_valid].double(),
            reference_attention(q, k, v, allowed, SCALE, config)[key_valid],
            atol=2e-6,
            rtol=1e-6,
        )
    finally:
        kernel_module._fused_kernel.cache_clear()


@pytest.mark.parametrize("shares", ["equal", "by_size"])
def test_an_observer_sees_the_average_row_before_and_after_calibration(shares: str) -> None:
    """Mean pooling: averages over the real query rows of the oracle's weights, per head."""
    q, k, v, key_valid = build_inputs([26, 19], False, 4, 4, torch.float32, 7)
    allowed = mask_of(key_valid, False)
    config = CalibrationConfig(
        pooling="mean", strength=0.6, basket_size=5, layers=[0], variant="uniform", basket_shares=shares
    )
    seen = observe(config, q, k, v, allowed, FakeAttention(0, 1, False))
    assert_profile(seen, q, k, allowed, key_valid, config)


@pytest.mark.parametrize("pooling", ["cls", "last"])
def test_an_observer_of_the_pooled_row_sees_by_size_calibration(pooling: str) -> None:
    """cls / last pooling: the observed pooled row is the oracle's, by_size shares included."""
    q, k, v, key_valid = build_inputs([26, 19], pooling == "last", 4, 4, torch.float32, 8)
    allowed = mask_of(key_valid, pooling == "last")
    config = CalibrationConfig(pooling=pooling, strength=0.9, basket_size=5, layers=[0], basket_shares="by_size")
    seen = observe(config, q, k, v, allowed, FakeAttention(0, 1, pooling == "last"))
    attn = (
        (q.double() @ k.double().transpose(-1, -2) * SCALE)
        .masked_fill(~allowed, float("-inf"))
        .softmax(-1)
        .nan_to_num(0.0)
    )
    rows = calibrated_query_rows(pooling, key_valid)
    after = reference_calibrate(attn, key_valid, allowed, rows, config)
    assert torch.allclose(seen["after"].double(), after.transpose(1, 2)[rows], atol=1e-6)


def test_an_observer_of_an_unpadded_causal_batch_sees_the_causal_rows() -> None:
    """No mask and a causal module: the profile averages causal rows (also at λ = 0, where nothing is calibrated)."""
    q, k, v, key_valid = build_inputs([17, 17], False, 4, 4, torch.float32, 9)
    allowed = mask_of(key_valid, True)
    for strength in (0.0, 0.7):
        config = CalibrationConfig(pooling="mean", strength=strength, basket_size=3, layers=[0], variant="cls_soft")
        seen = observe(config, q, k, v, None, FakeAttention(0, 1, True))
        assert_profile(seen, q, k, allowed, key_valid, config)


def test_an_observer_sees_the_rows_a_position_bias_shapes() -> None:
    """Mean pooling with a score term: the profile is of the attention the model computes, bias included."""
    q, k, v, key_valid = build_inputs([21, 16], False, 4, 4, torch.float32, 10)
    allowed = mask_of(key_valid, False)
    bias = position_bias(1, 4, q.shape[2], 10)
    config = CalibrationConfig(pooling="mean", strength=0.7, basket_size=4, layers=[0], variant="cls_soft")
    seen = observe(config, q, k, v, allowed, FakeAttention(0, 1, False), position_bias=bias)
    assert_profile(seen, q, k, allowed, key_valid, config, bias)


def observe(config: CalibrationConfig, q, k, v, mask, module, **kwargs) -> dict[str, torch.Tensor]:
    seen: dict[str, torch.Tensor] = {}
    with calibrating(config.resolve(1), lambda layer, before, after, geometry: seen.update(before=before, after=after)):
        calibrated_attention(module, q, k, v, mask, scaling=SCALE, **kwargs)
    return seen


def assert_profile(
    seen: dict[str, torch.Tensor], q, k, allowed, key_valid, config: CalibrationConfig, bias=None
) -> None:
    scores = q.double() @ k.double().transpose(-1, -2) * SCALE + (bias.double() if bias is not None else 0.0)
    attn = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    after = reference_calibrate(attn, key_valid, allowed, calibrated_query_rows("mean", key_valid), config)
    rows = key_valid[:, None, :, None].double()
    for name, weights in (("before", attn), ("after", after)):
        want = (weights * rows).sum(2) / rows.sum(2)
        assert torch.allclose(seen[name].double(), want, atol=1e-6), name


def test_a_row_that_sees_no_key_comes_out_zero_not_nan() -> None:
    """Left padding under a causal mask: a padding row sees nothing, as SDPA's kernel it returns 0."""
    q, k, v, key_valid = build_inputs([12, 5], True, 4, 4, torch.float32, 8)
    config = CalibrationConfig(pooling="mean", strength=1.0, basket_size=2, layers=[0])
    got = engine(config, FakeAttention(0, 1, True), q, k, v, mask_of(key_valid, True))
    assert not got.isnan().any()
    assert torch.equal(got[1, :7], torch.zeros_like(got[1, :7]))


@given(keys=st.integers(1, 600), data=st.data())
def test_a_basket_is_handed_to_the_kernel_in_a_window_of_whole_key_blocks(keys: int, data: st.DataObject) -> None:
    """The fused kernel is fast on multiples of 16 keys: the window covers the basket, stays inside the
    keys, and is a multiple of 16 wide unless it is all the keys (the extra keys are masked out)."""
    from tuner.calibration.kernels import KERNEL_KEY_MULTIPLE, kernel_window

    lo = data.draw(st.integers(0, keys - 1))
    hi = data.draw(st.integers(lo + 1, keys))
    begin, end = kernel_window(lo, hi, keys)
    assert 0 <= begin <= lo < hi <= end <= keys
    assert (end - begin) % KERNEL_KEY_MULTIPLE == 0 or end - begin == keys
    assert end - begin < (hi - lo) + KERNEL_KEY_MULTIPLE


def test_by_size_moves_a_partial_last_basket_and_not_full_ones() -> None:
    """At the interface, for every pooling: by_size differs from equal on passages whose last basket is
    partial, and agrees with it (to rounding) where every basket is full."""
    for pooling in ("cls", "last", "mean"):
        causal = pooling == "last"
        module = FakeAttention(0, 2, causal)
        config = CalibrationConfig(pooling=pooling, strength=1.0, basket_size=4, layers=[0], isolate=["first", "last"])
        by_size = config.model_copy(update={"basket_shares": "by_size"})
        q, k, v, key_valid = build_inputs([14, 14], False, 4, 2, torch.float32, 11)  # 12 content: 3 full baskets
        full = mask_of(key_valid, False) if not causal else None  # mean: every row sees every basket whole
        assert torch.allclose(engine(by_size, module, q, k, v, full), engine(config, module, q, k, v, full), atol=1e-6)
        q, k, v, key_valid = build_inputs([15, 15], False, 4, 2, torch.float32, 11)  # 13 content: 4, 4, 4, 1
        partial = mask_of(key_valid, causal)
        got, want = engine(by_size, module, q, k, v, partial), engine(config, module, q, k, v, partial)
        assert not torch.allclose(got, want, atol=1e-3), pooling
        assert torch.allclose(got.double(), reference_attention(q, k, v, partial, SCALE, by_size), atol=2e-6, rtol=1e-6)


def test_shared_first_layer_sums_never_serve_the_other_basket_shares() -> None:
    """The mean path's first-layer sums differ by basket_shares (Σ O_b against Σ cnt_b·O_b), so a trial with
    the other mode computes its own; a trial with the same mode reuses them. Each agrees with the oracle."""
    from tuner.evaluation.cache_policy import FirstLayerSums

    q, k, v, key_valid = build_inputs([22, 15, 9], False, 4, 2, torch.float32, 12)
    allowed = mask_of(key_valid, False)
    shared = FirstLayerSums(budget=2**30)
    module = FakeAttention(0, 2, False)
    hits = []
    for shares, variant in (
        ("equal", "cls_soft"),
        ("by_size", "cls_soft"),
        ("by_size", "uniform"),
        ("equal", "uniform"),
    ):
        config = CalibrationConfig(
            pooling="mean", variant=variant, strength=0.9, basket_size=4, layers=[0], basket_shares=shares
        )
        with calibrating(config.resolve(1), first_layer=shared.for_batch(0)):
            got, _ = calibrated_attention(module, q, k, v, allowed, scaling=SCALE)
        want = reference_attention(q, k, v, allowed, SCALE, config)
        assert torch.allclose(got[key_valid].double(), want[key_valid], atol=2e-6, rtol=1e-6), (shares, variant)
        hits.append(shared.hits)
    assert hits == [0, 0, 1, 2]
    assert len(shared.entries) == 2
