"""The paper's §3 on plain tensors: baskets, isolated-token policies and the λ blend.

Nothing here knows about transformers. Input rows are post-softmax attention over the key axis;
`BasketGeometry` says, per batch item, where the content span starts and how it is cut.

Efficiency (Appendix A): baskets are contiguous blocks of `basket_size` keys, so after aligning each
item's content span to offset 0 (one gather), basket sums are a reshape and a reduction along the
trailing axis; no per-position basket index is scattered into. The geometry depends only on the
padding mask, so it is built once per batch and shared by every calibrated layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import Policy, ResolvedCalibration, Role


@dataclass(frozen=True)
class BasketGeometry:
    """Per batch item: the isolated positions, the content span and its baskets."""

    key_valid: torch.Tensor  # (B, K) bool: real (non-padding) keys
    isolated: torch.Tensor  # (B, I) long: positions of isolated tokens, in role order
    roles: tuple[Role, ...]  # the role of each isolated column
    align_index: torch.Tensor  # (B, N*S) long: key position of aligned content slot j
    align_valid: torch.Tensor  # (B, N*S) bool: slot j holds a content key
    key_basket: torch.Tensor  # (B, K) long: basket of each key (0 where not content)
    key_content: torch.Tensor  # (B, K) bool: the key is content (not padding, not isolated)
    n_baskets: torch.Tensor  # (B,) long: content baskets of each item
    calibrated: torch.Tensor  # (B,) bool: content fills at least one basket
    basket_size: int

    @classmethod
    def from_key_mask(cls, key_valid: torch.Tensor, basket_size: int, roles: tuple[Role, ...]) -> BasketGeometry:
        """Derive the geometry from which keys are real; isolated tokens are the ends of the valid span."""
        batch, keys = key_valid.shape
        device = key_valid.device
        positions = torch.arange(keys, device=device)
        n_valid = key_valid.sum(-1)
        first = torch.where(key_valid, positions, keys).amin(-1).clamp_max(keys - 1)
        last = torch.where(key_valid, positions, -1).amax(-1).clamp_min(0)
        ends = {"first": first, "last": last}
        isolated = torch.stack([ends[role] for role in roles], -1) if roles else first[:, :0]

        content_start = first + int("first" in roles)
        content_len = (n_valid - len(roles)).clamp_min(0)
        n_baskets = torch.div(content_len + basket_size - 1, basket_size, rounding_mode="floor")
        slots = max(int(n_baskets.max()), 1) * basket_size

        offsets = torch.arange(slots, device=device)
        align_valid = offsets < content_len[:, None]
        align_index = (content_start[:, None] + offsets).clamp_max(keys - 1)

        relative = positions - content_start[:, None]
        key_content = (relative >= 0) & (relative < content_len[:, None])
        key_basket = torch.where(key_content, torch.div(relative, basket_size, rounding_mode="floor"), 0)
        return cls(
            key_valid=key_valid,
            isolated=isolated,
            roles=roles,
            align_index=align_index,
            align_valid=align_valid,
            key_basket=key_basket,
            key_content=key_content,
            n_baskets=n_baskets,
            calibrated=content_len >= basket_size,
            basket_size=basket_size,
        )


def isolated_targets(
    isolated_mass: torch.Tensor, policies: tuple[Policy, ...], n_total: torch.Tensor, weight: float
) -> torch.Tensor:
    """The calibrated mass of each isolated token, by its policy; shape like `isolated_mass` (B, R, I).

    equal: 1/n_baskets_total, like a content basket; original: the mass it already had (self/sink
    mass, CLS-Soft); fixed: w (CLS-Hard). If the targets add up to more than 1 they are scaled to 1.
    """
    columns = []
    for i, policy in enumerate(policies):
        if policy == "original":
            columns.append(isolated_mass[..., i])
        elif policy == "equal":
            columns.append((1.0 / n_total).to(isolated_mass.dtype)[:, None].expand_as(isolated_mass[..., i]))
        else:
            columns.append(torch.full_like(isolated_mass[..., i], weight))
    if not columns:
        return isolated_mass
    targets = torch.stack(columns, -1)
    return targets / targets.sum(-1, keepdim=True).clamp_min(1.0)


def calibrate_rows(attn: torch.Tensor, geometry: BasketGeometry, spec: ResolvedCalibration) -> torch.Tensor:
    """Calibrate attention rows `attn` (B, R, K) in float32 and blend with strength λ.

    Content baskets split what the isolated tokens leave equally, keeping proportions inside a basket;
    padded keys stay exactly 0 and rows still sum to 1. Items whose content is shorter than one basket
    come back unchanged, as does everything at λ = 0. `attn` is consumed (updated in place) to keep
    the working set at two rows' worth of memory.
    """
    attn = attn.float()
    batch, rows, keys = attn.shape
    slots = geometry.align_index.shape[1]
    size = geometry.basket_size

    aligned = attn.gather(-1, geometry.align_index[:, None, :].expand(batch, rows, slots))
    aligned.mul_(geometry.align_valid[:, None, :])
    basket_mass = aligned.view(batch, rows, slots // size, size).sum(-1)
    del aligned

    policies = tuple(spec.policy(role) for role in geometry.roles)
    n_total = geometry.n_baskets + len(policies)
    iso_index = geometry.isolated[:, None, :].expand(batch, rows, len(policies))
    targets = isolated_targets(attn.gather(-1, iso_index), policies, n_total, spec.weight)

    remaining = (1.0 - targets.sum(-1, keepdim=True)).clamp_min(0.0)
    share = remaining / geometry.n_baskets.clamp_min(1)[:, None, None]
    factor = share / basket_mass.clamp_min(torch.finfo(torch.float32).tiny)
    calibrated = factor.gather(-1, geometry.key_basket[:, None, :].expand(batch, rows, keys))
    calibrated.mul_(geometry.key_content[:, None, :]).mul_(attn)
    calibrated.scatter_(-1, iso_index, targets)

    strength = (geometry.calibrated.float() * spec.strength)[:, None, None]
    return attn.lerp_(calibrated, strength)
