"""The paper's §3 on plain tensors: baskets, isolated-token policies and the λ blend.

Nothing here knows about transformers. Input rows are post-softmax attention over the key axis;
`BasketGeometry` says, per batch item, where the content span starts and how it is cut.

A row is calibrated over the keys it may see (`seen`): a content basket none of whose keys it sees
is not one of its baskets (no share: there is no mass to renormalise), an isolated token it does not
see stays 0 whatever its policy, and a row that sees no content basket is left as it is. Under a
padding mask every real row sees every real key; a causal mask hides later baskets from earlier rows,
and a sliding window the baskets beyond it (one it clips is renormalised over the keys the row sees).
The baskets are the passage's in every case, so a basket is the same stretch of text for every row.

Content baskets split what the isolated tokens leave (`basket_shares`): equally (§3: a partial last
basket gets as much as a full one), or `by_size`, in proportion to the content keys of each basket the
row sees (share_b = remainder · cnt_b / Σ cnt), so a partial basket gets a partial share.

Efficiency (Appendix A): baskets are contiguous blocks of `basket_size` keys, so once a passage's
content span is located (per item: left padding shifts it), basket sums are a reshape of a slice and
a reduction along the trailing axis, and renormalisation is a broadcast multiplication, in place. No
per-position basket index, no scatter or gather over the key axis. The geometry depends only on the
padding mask, so it is built once per batch and shared by every calibrated layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import Policy, ResolvedCalibration, Role


@dataclass(frozen=True)
class Run:
    """Consecutive batch items [begin, end) whose content starts at the same key position.

    With right padding the whole batch is one run; with left padding, the encoder's length-sorted
    batches make equal-length (hence equally shifted) passages neighbours.
    """

    begin: int
    end: int
    start: int
    n_baskets: int  # the most content baskets of any item in the run


@dataclass(frozen=True)
class BasketGeometry:
    """Per batch item: the isolated positions, the content span and its baskets."""

    key_valid: torch.Tensor  # (B, K) bool: real (non-padding) keys
    key_content: torch.Tensor  # (B, K) bool: the key is content (not padding, not isolated)
    first: torch.Tensor  # (B,) long: position of the first real token ([CLS] / <s>)
    last: torch.Tensor  # (B,) long: position of the last real token ([SEP] / </s>)
    isolated: torch.Tensor  # (B, I) long: positions of isolated tokens, in role order
    roles: tuple[Role, ...]  # the role of each isolated column
    calibrated: torch.Tensor  # (B,) bool: content fills at least one basket
    any_calibrated: bool  # some item of the batch is calibrated (else calibration is a no-op)
    runs: tuple[Run, ...]
    basket_size: int

    @classmethod
    def from_key_mask(cls, key_valid: torch.Tensor, basket_size: int, roles: tuple[Role, ...]) -> BasketGeometry:
        """Derive the geometry from which keys are real; isolated tokens are the ends of the valid span."""
        keys = key_valid.shape[1]
        positions = torch.arange(keys, device=key_valid.device)
        first = torch.where(key_valid, positions, keys).amin(-1).clamp_max(keys - 1)
        last = torch.where(key_valid, positions, -1).amax(-1).clamp_min(0)
        ends = {"first": first, "last": last}
        isolated = torch.stack([ends[role] for role in roles], -1) if roles else first[:, None][:, :0]
        start = first + int("first" in roles)
        valid = key_valid.sum(-1)
        length = (valid - len(roles)).clamp_min(0)
        n_baskets = torch.div(length + basket_size - 1, basket_size, rounding_mode="floor")
        relative = positions - start[:, None]
        runs: list[Run] = []
        for b, (s, n) in enumerate(zip(start.tolist(), n_baskets.tolist())):
            if runs and runs[-1].start == s:
                runs[-1] = Run(runs[-1].begin, b + 1, s, max(runs[-1].n_baskets, n))
            else:
                runs.append(Run(b, b + 1, s, n))
        calibrated = fills_a_basket(valid, basket_size, len(roles))
        return cls(
            key_valid=key_valid,
            key_content=(relative >= 0) & (relative < length[:, None]),
            first=first,
            last=last,
            isolated=isolated,
            roles=roles,
            calibrated=calibrated,
            any_calibrated=bool(calibrated.any()),
            runs=tuple(runs),
            basket_size=basket_size,
        )


def fills_a_basket(valid_tokens: torch.Tensor, basket_size: int, isolated: int) -> torch.Tensor:
    """Per item: whether its content (real tokens less the isolated ones) fills at least one basket.

    Calibration leaves a passage shorter than one basket alone (as the reference code does), so such a
    passage's vector is the uncalibrated one whatever the other knobs say.
    """
    return valid_tokens - isolated >= basket_size


def isolated_targets(
    isolated_mass: torch.Tensor,
    policies: tuple[Policy, ...],
    n_total: torch.Tensor,
    weight: float,
    seen: torch.Tensor,
) -> torch.Tensor:
    """The calibrated mass of each isolated token, by its policy; shape like `isolated_mass` (..., I).

    equal: 1/n_total, like a content basket (n_total: the baskets the row sees, isolated ones included,
    shaped (..., 1)); original: the mass it already had (self/sink mass, CLS-Soft); fixed: w
    (CLS-Hard). A token the row does not see (`seen`, like `isolated_mass`) gets 0. If the targets add
    up to more than 1 they are scaled to 1.
    """
    if not policies:
        return isolated_mass
    equal = 1.0 / n_total.to(isolated_mass.dtype).clamp_min(1.0)
    columns = []
    for i, policy in enumerate(policies):
        mass, sees = isolated_mass[..., i : i + 1], seen[..., i : i + 1]
        if policy == "original":
            columns.append(mass)
        else:
            value = equal if policy == "equal" else torch.full_like(mass, weight)
            columns.append(torch.where(sees, value, 0.0).expand_as(mass))
    targets = torch.cat(columns, -1)
    return targets / targets.sum(-1, keepdim=True).clamp_min(1.0)


def calibrate_rows(
    attn: torch.Tensor, geometry: BasketGeometry, spec: ResolvedCalibration, seen: torch.Tensor
) -> torch.Tensor:
    """Calibrate attention rows `attn` (B, R, K) in float32 and blend with strength λ.

    `seen` (B, R or 1, K) marks the keys each row may see. Content baskets split what the isolated
    tokens leave equally or by size (`spec.basket_shares`), keeping proportions inside a basket; keys a
    row does not see stay exactly 0 and rows still sum to 1. Items whose content is shorter than one
    basket come back unchanged, as does everything at λ = 0.

    A content key's calibrated weight is its own weight times a per-basket factor f_b, so the blend
    â = λ·a_cal + (1 − λ)·a is one in-place multiplication by λ·f_b + 1 − λ; isolated tokens are then
    written directly. `attn` is consumed (updated in place): the working set is a few (B, R, baskets) sums.
    """
    attn = attn.float()
    if spec.strength == 0.0:
        return attn
    for run in geometry.runs:
        _calibrate_run(attn[run.begin : run.end], seen[run.begin : run.end], run, geometry, spec)
    return attn


def _calibrate_run(
    rows: torch.Tensor, seen: torch.Tensor, run: Run, geometry: BasketGeometry, spec: ResolvedCalibration
) -> None:
    """One run of items sharing a content start: a window of baskets viewed as (G, R, baskets, size)."""
    size = geometry.basket_size
    items, keys = slice(run.begin, run.end), rows.shape[-1]
    policies = tuple(spec.policy(role) for role in geometry.roles)
    iso_index = geometry.isolated[items, None, :].expand(*rows.shape[:2], len(policies))
    iso_mass = rows.gather(-1, iso_index)
    iso_seen = seen.gather(-1, iso_index[:, : seen.shape[1]])
    rows.scatter_(-1, iso_index, 0.0)  # isolated tokens inside the window must not count in a basket
    whole = min(run.n_baskets, (keys - run.start) // size)  # baskets that fit before the last key
    window = slice(run.start, run.start + whole * size)
    partial = whole < run.n_baskets  # a partial last basket
    body = rows[..., window].unflatten(-1, (whole, size))
    tail = rows[..., run.start + whole * size :] if partial else None
    mass = body.sum(-1) if tail is None else torch.cat([body.sum(-1), tail.sum(-1, keepdim=True)], -1)
    # per basket, the content keys each row sees (G, R or 1, baskets); a basket is the row's if it sees one
    content_seen = seen & geometry.key_content[items, None, :]
    visible = content_seen[..., window].unflatten(-1, (whole, size)).sum(-1)
    if partial:
        visible = torch.cat([visible, content_seen[..., run.start + whole * size :].sum(-1, keepdim=True)], -1)
    n_seen = (visible > 0).sum(-1, keepdim=True)  # (G, R or 1, 1)

    n_total = n_seen + iso_seen.sum(-1, keepdim=True)
    targets = isolated_targets(iso_mass, policies, n_total, spec.weight, iso_seen)
    remaining = (1.0 - targets.sum(-1, keepdim=True)).clamp_min(0.0)
    if spec.basket_shares == "by_size":  # share_b = remaining · cnt_b / Σ cnt (baskets it does not see: 0)
        share = remaining / visible.sum(-1, keepdim=True).clamp_min(1) * visible
    else:  # equal (§3): one share per basket it sees
        share = remaining / n_seen.clamp_min(1)
    strength = (geometry.calibrated[items, None, None] & (n_seen > 0)).float() * spec.strength
    multiplier = (share / mass.clamp_min(torch.finfo(torch.float32).tiny)).mul_(strength).add_(1.0 - strength)
    body.mul_(multiplier[..., :whole, None])
    if tail is not None:
        tail.mul_(multiplier[..., whole:])
    rows.scatter_(-1, iso_index, torch.lerp(iso_mass, targets, strength))
