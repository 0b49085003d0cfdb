"""The test oracle: the equations of §3, written plainly over the full attention matrix.

Deliberately the way Appendix A describes the original implementation: eager attention
materialises the whole B×H×Q×K matrix, a per-position basket index is built for each item, basket
sums are accumulated with `scatter_add` and handed back with `gather`. Slow and memory-hungry by
design; the engine (`rows.py`, `attention.py`) must agree with it. The tests run it in float64.
"""

from __future__ import annotations

from functools import partial

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .attention import active_spec
from .config import ResolvedCalibration, Role

REFERENCE_ATTENTION_NAME = "posfair_reference"


def reference_calibrate(
    attn: torch.Tensor, key_valid: torch.Tensor, rows: torch.Tensor, spec: ResolvedCalibration, roles: tuple[Role, ...]
) -> torch.Tensor:
    """Calibrate the query rows marked in `rows` (B, Q) of the full matrix `attn` (B, H, Q, K)."""
    out = attn.clone()
    for b in range(attn.shape[0]):
        valid = torch.nonzero(key_valid[b]).flatten().tolist()
        ends = {"first": valid[0], "last": valid[-1]}
        isolated = [ends[role] for role in roles]
        content = torch.tensor([k for k in valid if k not in isolated], dtype=torch.long)
        if len(content) < spec.basket_size:
            continue
        basket_of = torch.arange(len(content)) // spec.basket_size  # per-position basket index
        n_baskets = int(basket_of.max()) + 1
        query_rows = torch.nonzero(rows[b]).flatten()
        a = out[b][:, query_rows, :]  # (H, R, K)
        index = basket_of.expand(*a.shape[:2], -1)
        sums = a.new_zeros(*a.shape[:2], n_baskets).scatter_add_(-1, index, a[..., content])
        targets = []
        for role, position in zip(roles, isolated):
            policy = spec.policy(role)
            if policy == "equal":
                targets.append(torch.full_like(a[..., 0], 1.0 / (n_baskets + len(roles))))
            elif policy == "original":
                targets.append(a[..., position])
            else:
                targets.append(torch.full_like(a[..., 0], spec.weight))
        target = torch.stack(targets, -1) if targets else a[..., :0]
        target = target / target.sum(-1, keepdim=True).clamp_min(1.0)
        remaining = (1.0 - target.sum(-1, keepdim=True)).clamp_min(0.0)
        calibrated = torch.zeros_like(a)
        calibrated[..., content] = a[..., content] / sums.gather(-1, index) * (remaining / n_baskets)
        for column, position in enumerate(isolated):
            calibrated[..., position] = target[..., column]
        out[b][:, query_rows, :] = spec.strength * calibrated + (1.0 - spec.strength) * a
    return out


def calibrated_query_rows(pooling: str, key_valid: torch.Tensor) -> torch.Tensor:
    """Which query rows a pooling scheme calibrates: the first or last real token, or all real tokens."""
    if pooling == "mean":
        return key_valid.clone()
    positions = torch.arange(key_valid.shape[1], device=key_valid.device)
    if pooling == "last":
        pick = torch.where(key_valid, positions, -1).amax(-1)
    else:
        pick = torch.where(key_valid, positions, key_valid.shape[1]).amin(-1)
    rows = torch.zeros_like(key_valid)
    rows[torch.arange(len(rows)), pick] = True
    return rows


def reference_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor,
    scaling: float,
    spec: ResolvedCalibration | None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Eager attention with the oracle applied; query (B, H, Q, D), key/value (B, Hkv, K, D).

    `allowed` is the boolean (B, 1, Q, K) mask. Returns (B, Q, H, D) in `dtype`.
    """
    groups = query.shape[1] // key.shape[1]
    key = key.to(dtype).repeat_interleave(groups, dim=1)
    value = value.to(dtype).repeat_interleave(groups, dim=1)
    scores = query.to(dtype) @ key.transpose(-1, -2) * scaling
    attn = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)  # fully masked pad rows
    if spec is not None:
        key_valid = allowed[:, 0].any(-2)
        roles = tuple(role for role, _ in spec.policies)
        attn = reference_calibrate(attn, key_valid, calibrated_query_rows(spec.pooling, key_valid), spec, roles)
    return (attn @ value).transpose(1, 2)


def reference_attention_function(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    *,
    oracle_dtype: torch.dtype = torch.float64,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """The oracle as a transformers attention function, for end-to-end comparisons and benchmarks."""
    batch, _, rows, _ = query.shape
    keys = key.shape[2]
    if attention_mask is None:
        attention_mask = torch.ones(batch, 1, rows, keys, dtype=torch.bool, device=query.device)
        if getattr(module, "is_causal", False):
            attention_mask = attention_mask.tril()
    spec = active_spec()
    layer_spec = spec if spec is not None and getattr(module, "layer_idx", None) in spec.layers else None
    output = reference_attention(
        query, key, value, attention_mask, scaling or query.shape[-1] ** -0.5, layer_spec, oracle_dtype
    )
    return output.to(query.dtype), None


def register_reference(name: str = REFERENCE_ATTENTION_NAME, dtype: torch.dtype = torch.float64) -> str:
    """Make the oracle an `attn_implementation` (float64 for tests; float32 to time the original approach)."""
    AttentionInterface.register(name, partial(reference_attention_function, oracle_dtype=dtype))
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
