"""Attention with each row's log-sum-exp: SDPA's own fused kernel where it answers a one-time probe as expected,
else formed from the scores, which one basket's keys keep small."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import cache

import torch

KERNEL_KEY_MULTIPLE = 16  # the fused CPU kernel runs slower on key counts off this grid (docs/engine.md)


def additive_bias(visible: torch.Tensor, dtype: torch.dtype, score: torch.Tensor | None = None) -> torch.Tensor:
    """The score term where a key is visible (0 without one), −inf where not, in `dtype`, its rows padded in
    memory to a multiple of `KERNEL_KEY_MULTIPLE` keys (the memory-efficient CUDA kernel reads the bias in
    aligned blocks)."""
    width = visible.shape[-1]
    padded = -(-width // KERNEL_KEY_MULTIPLE) * KERNEL_KEY_MULTIPLE
    shape = visible.shape if score is None else torch.broadcast_shapes(visible.shape, score.shape)
    bias = torch.zeros((*shape[:-1], padded), dtype=dtype, device=visible.device)[..., :width]
    if score is not None:
        bias.copy_(score.expand(shape))
    return bias.masked_fill_(~visible, float("-inf"))


def kernel_window(lo: int, hi: int, keys: int, multiple: int = KERNEL_KEY_MULTIPLE) -> tuple[int, int]:
    """Key slice [begin, end) ⊇ [lo, hi) whose width is a multiple of `multiple` where the keys allow.

    The fused CPU kernel is slower on a key count off that grid (docs/engine.md), so a partial basket borrows
    keys from before it (or after it), which the caller masks out.
    """
    width = min(keys, -(-(hi - lo) // multiple) * multiple)
    begin = max(0, min(lo, hi - width))
    return begin, max(hi, min(keys, begin + width))


def attention_with_lse(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output (B, H, Q, D) and the float32 log-sum-exp of each row's scores (B, H, Q).

    On CPU and CUDA this is one of SDPA's own fused kernels, which the public function runs but whose
    log-sum-exp it drops: a private op, used only where `_fused_kernel` found it answering as expected.
    Elsewhere (or without it) the two are computed from the (B, H, Q, basket) scores, which one basket's
    keys keep small.
    """
    kernel = _fused_kernel(query.device.type)
    if kernel is not None:
        return kernel(query, key, value, bias, scaling)
    return _attention_with_lse_unfused(query, key, value, bias, scaling)


FusedKernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, float], tuple[torch.Tensor, torch.Tensor]
]


def _cpu_flash(op: Callable[..., tuple[torch.Tensor, ...]]) -> FusedKernel:
    """SDPA's fused CPU kernel: (output, log-sum-exp (B, H, Q))."""

    def kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None, scale: float):
        out, lse = op(query, key, value, attn_mask=bias, scale=scale)[:2]
        return out, lse

    return kernel


def _cuda_efficient(op: Callable[..., tuple[torch.Tensor, ...]]) -> FusedKernel:
    """SDPA's memory-efficient CUDA kernel, asked for its log-sum-exp: it takes the bias at full (B, H, Q, K)
    shape (a broadcast view is enough) and returns the log-sum-exp with its rows padded to a block."""

    def kernel(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None, scale: float):
        rows = query.shape[2]
        if bias is not None:
            bias = bias.expand(query.shape[0], query.shape[1], rows, key.shape[2])
        out, lse = op(query, key, value, bias, True, scale=scale)[:2]
        return out, lse[..., :rows]

    return kernel


# Per device type: how to call its fused kernel, and the private op's name.
FUSED_KERNELS: dict[str, tuple[Callable[[Callable[..., tuple[torch.Tensor, ...]]], FusedKernel], str]] = {
    "cpu": (_cpu_flash, "_scaled_dot_product_flash_attention_for_cpu"),
    "cuda": (_cuda_efficient, "_scaled_dot_product_efficient_attention"),
}


@cache
def _fused_kernel(device_type: str) -> FusedKernel | None:
    """The fused kernel behind SDPA on this device type, if this torch build has it and it answers our call as
    expected (probed once per process on the current device); else None, said once."""
    if device_type not in FUSED_KERNELS:
        return None
    wrap, name = FUSED_KERNELS[device_type]
    op = getattr(torch.ops.aten, name, None)
    kernel = _probe_kernel(wrap(op) if op is not None else None, torch.device(device_type))
    if kernel is None:
        warnings.warn(
            f"posfair: torch's fused attention kernel {name} is missing or did not pass its probe on {device_type}; "
            "mean-pooling calibration forms each basket's scores instead (slower, more memory)",
            RuntimeWarning,
            stacklevel=2,
        )
    return kernel


def _probe_kernel(kernel: FusedKernel | None, device: torch.device) -> FusedKernel | None:
    """`kernel` if, on a small masked call on `device` shaped as the engine calls it (views of (B, T, H, D)
    projections, a key window, a bias from `additive_bias`), it returns the attention output (B, H, Q, D)
    and the natural log-sum-exp (B, H, Q) that the public ops give; else None (the caller falls back to them)."""
    if kernel is None:
        return None
    try:
        generator = torch.Generator().manual_seed(0)
        query, key, value = (torch.randn(2, 7, 3, 8, generator=generator).to(device).transpose(1, 2) for _ in range(3))
        key, value = key[:, :, 1:6], value[:, :, 1:6]
        visible = torch.ones(7, 5, dtype=torch.bool, device=device).tril(1).expand(2, 1, 7, 5)
        bias = additive_bias(visible, query.dtype, torch.randn(1, 3, 7, 5, generator=generator).to(device))  # per head
        want_out, want_lse = _attention_with_lse_unfused(query, key, value, bias, 0.35)
        out, lse = kernel(query, key, value, bias, 0.35)
        agrees = (
            out.shape == want_out.shape
            and lse.shape == want_lse.shape
            and torch.allclose(out, want_out, atol=1e-5)
            and torch.allclose(lse.float(), want_lse, atol=1e-5)
        )
    except (RuntimeError, NotImplementedError, TypeError, ValueError, AttributeError, IndexError):
        return None
    return kernel if agrees else None


def _attention_with_lse_unfused(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`attention_with_lse` from the scores, for devices without a fused kernel that passed its probe."""
    scores = (query @ key.transpose(-1, -2)).float().mul_(scaling)
    if bias is not None:
        scores += bias
    lse = scores.logsumexp(-1)
    weights = (scores - lse[..., None]).exp_().nan_to_num_(0.0)  # a row that sees no key: all −inf
    return (weights.to(value.dtype) @ value), lse
