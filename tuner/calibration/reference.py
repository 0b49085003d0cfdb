"""The test oracle: the equations of §3, written plainly over the full attention matrix.

Deliberately the way Appendix A describes the original implementation: eager attention
materialises the whole B×H×Q×K matrix, a per-position basket index is built for each item, basket
sums are accumulated with `scatter_add` and handed back with `gather`, in float64. Slow and
memory-hungry by design; the engine (`rows.py`, `attention.py`) must agree with it.
"""

from __future__ import annotations

import torch

from .config import ResolvedCalibration, Role


def reference_calibrate(
    attn: torch.Tensor, key_valid: torch.Tensor, rows: torch.Tensor, spec: ResolvedCalibration, roles: tuple[Role, ...]
) -> torch.Tensor:
    """Calibrate query rows `rows` (B, Q) bool of the full matrix `attn` (B, H, Q, K); returns float64."""
    out = attn.double().clone()
    for b in range(attn.shape[0]):
        valid = torch.nonzero(key_valid[b]).flatten()
        ends = {"first": int(valid[0]), "last": int(valid[-1])}
        isolated = [ends[role] for role in roles]
        content = torch.tensor([int(k) for k in valid if int(k) not in isolated], dtype=torch.long)
        if len(content) < spec.basket_size:
            continue
        basket_of = torch.arange(len(content)) // spec.basket_size
        n_baskets = int(basket_of.max()) + 1
        for q in torch.nonzero(rows[b]).flatten():
            a = out[b, :, int(q), :].clone()
            sums = torch.zeros(a.shape[0], n_baskets, dtype=a.dtype)
            sums.scatter_add_(1, basket_of.expand(a.shape[0], -1), a[:, content])
            targets = []
            for role, position in zip(roles, isolated):
                policy = spec.policy(role)
                if policy == "equal":
                    targets.append(torch.full((a.shape[0],), 1.0 / (n_baskets + len(roles)), dtype=a.dtype))
                elif policy == "original":
                    targets.append(a[:, position])
                else:
                    targets.append(torch.full((a.shape[0],), spec.weight, dtype=a.dtype))
            target = torch.stack(targets, -1) if targets else a[:, :0]
            target = target / target.sum(-1, keepdim=True).clamp_min(1.0)
            remaining = (1.0 - target.sum(-1, keepdim=True)).clamp_min(0.0)
            calibrated = torch.zeros_like(a)
            calibrated[:, content] = a[:, content] / sums.gather(1, basket_of.expand(a.shape[0], -1)) * (
                remaining / n_baskets
            )
            for column, position in enumerate(isolated):
                calibrated[:, position] = target[:, column]
            out[b, :, int(q), :] = spec.strength * calibrated + (1.0 - spec.strength) * a
    return out


def reference_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor,
    scaling: float,
    spec: ResolvedCalibration | None,
    roles: tuple[Role, ...],
    rows: torch.Tensor,
) -> torch.Tensor:
    """Eager attention in float64 with the oracle applied; query (B, H, Q, D), key/value (B, Hkv, K, D).

    `allowed` is the boolean (B, 1, Q, K) mask, `rows` (B, Q) which query rows to calibrate.
    Returns (B, Q, H, D) like a transformers attention function.
    """
    groups = query.shape[1] // key.shape[1]
    key = key.double().repeat_interleave(groups, dim=1)
    value = value.double().repeat_interleave(groups, dim=1)
    scores = query.double() @ key.transpose(-1, -2) * scaling
    attn = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)  # fully masked pad rows
    if spec is not None:
        key_valid = allowed[:, 0].any(-2)
        attn = reference_calibrate(attn, key_valid, rows, spec, roles)
    return (attn @ value).transpose(1, 2)
