"""A calibrated mean-pooling layer without the B×H×Q×K matrix: each row's attention output and mass per content
basket (one fused kernel call per basket), blended by λ, the variant and w.

Every row is calibrated, so every row's attention would be formed; instead the kernel runs on each basket's
keys alone and returns the row's output renormalised inside the basket and the basket's log mass, which
carry everything the blend needs (`mean_rows`). What a batch decides (which baskets need a mask, which have
rows that see none of their keys) is read back once per batch (`basket_flags`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

from .config import ResolvedCalibration
from .kernels import additive_bias, attention_with_lse, kernel_window
from .rows import BasketGeometry, Run, isolated_targets

Flags = tuple[tuple[tuple[bool, bool], ...], ...]
"""Per run and content basket: whether the kernel needs a mask, and whether some row sees none of its keys."""


class RunSums(NamedTuple):
    """One run's sums over its content baskets b (see `_basket_outputs`); float32.

    w_b is what basket b's share is proportional to: 1 for a basket the row sees (equal) or the number of
    its content keys the row sees (by_size); 0 for a basket it does not see.
    """

    mixed: torch.Tensor  # Σ_b e^(m_b − top)·O_b  (G, H, Q, D)
    even: torch.Tensor  # Σ_b w_b·O_b  (G, H, Q, D)
    top: torch.Tensor  # max_b m_b  (G, H, Q, 1)
    content: torch.Tensor  # log Σ_b e^(m_b), the log content mass  (G, H, Q, 1)
    baskets: torch.Tensor  # the number of baskets the row sees  (G, 1, Q or 1, 1)
    weights: torch.Tensor  # Σ_b w_b (equal: `baskets` itself)  (G, 1, Q or 1, 1)


@dataclass(frozen=True)
class RowSums:
    """What a mean-pooling layer's calibration needs from its attention, before λ, variant or w enter.

    Per run of items (see `Run`): its `RunSums`; and the isolated tokens' scores (B, H, Q, I), −inf where
    a row may not see the token. They depend on `basket_shares` (through w_b), not on λ, variant or w.
    """

    iso_scores: torch.Tensor
    runs: tuple[RunSums, ...]

    @property
    def nbytes(self) -> int:
        tensors = {id(t): t for t in (self.iso_scores, *(x for run in self.runs for x in run))}
        return sum(t.numel() * t.element_size() for t in tensors.values())


class SharedSums(Protocol):
    """Where a calibrated pass looks up, and leaves, the `RowSums` of its first calibrated layer for the batch
    it is encoding (mean pooling). The caller owns it and hands one over per batch
    (`tuner.evaluation.cache_policy.FirstLayerSums.for_batch`); the engine keeps nothing between calls."""

    def lookup(self, key: tuple[object, ...]) -> RowSums | None: ...

    def offer(self, key: tuple[object, ...], sums: RowSums) -> None: ...


def row_sums(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor,
    bias: torch.Tensor | None,
    scaling: float,
    geometry: BasketGeometry,
    by_size: bool,
    flags: Flags,
) -> RowSums:
    """The attention half of a mean-pooling layer's calibration, one fused SDPA call per content basket
    (`flags`: per run and basket, whether it needs a mask and has blind rows; see `basket_flags`).

    SDPA's fused kernel returns a row's attention output renormalised inside basket b (O_b) and the log of
    the basket's mass (its log-sum-exp) when given the keys of b alone, so the B×H×Q×K matrix is never
    formed and the work is about one SDPA's over K keys.
    """
    batch, heads, _, dim = query.shape
    iso = geometry.isolated[:, None, :, None].expand(batch, heads, -1, dim)
    iso_scores = (query @ key.gather(2, iso).transpose(-1, -2)).float().mul_(scaling)  # (B, H, Q, I)
    if bias is not None:
        bias = bias.expand(batch, heads, *bias.shape[2:])
        iso_scores += bias.gather(-1, geometry.isolated[:, None, None, :].expand(*iso_scores.shape))
    iso_seen = allowed.gather(-1, geometry.isolated[:, None, None, :].expand(*allowed.shape[:3], -1))
    iso_scores.masked_fill_(~iso_seen, float("-inf"))
    runs = tuple(
        _basket_outputs(
            query[run.begin : run.end],
            key[run.begin : run.end],
            value[run.begin : run.end],
            allowed[run.begin : run.end],
            bias[run.begin : run.end] if bias is not None else None,
            geometry.key_content[run.begin : run.end],
            run,
            geometry.basket_size,
            scaling,
            by_size,
            run_flags,
        )
        for run, run_flags in zip(geometry.runs, flags, strict=True)
    )
    return RowSums(iso_scores, runs)


def mean_rows(
    sums: RowSums, value: torch.Tensor, geometry: BasketGeometry, spec: ResolvedCalibration, dtype: torch.dtype
) -> torch.Tensor:
    """Every row calibrated: the blend of its basket outputs (`row_sums`) by λ, variant and w → (B, Q, H, D).

    A content key's calibrated weight is a_j·(λ·share_b/mass_b + 1 − λ) (see `calibrate_rows`), so a row's
    output is Σ_b c_b·O_b + Σ_t w_t·v_t with c_b = λ·share_b + (1 − λ)·mass_b, where O_b is the row's
    attention output renormalised inside basket b and mass_b = e^(m_b − total). share_b is the remainder
    the isolated tokens leave times w_b / Σ w (w_b: 1 per basket seen, or its seen content keys for
    by_size), so two sums over baskets, Σ e^(m_b − top)·O_b and Σ w_b·O_b, and Σ w carry everything λ,
    the variant and w need. `sums` is only read: it may be shared with later trials.
    """
    batch, heads, _, dim = value.shape
    iso = geometry.isolated[:, None, :, None].expand(batch, heads, -1, dim)
    iso_value = value.gather(2, iso).float()
    policies = tuple(spec.policy(role) for role in geometry.roles)
    parts = []
    for run, (mixed, even, top, content, n_seen, weights_seen) in zip(geometry.runs, sums.runs):
        items = slice(run.begin, run.end)
        iso_scores = sums.iso_scores[items]
        iso_seen = iso_scores > float("-inf")
        # log of the row's total (unnormalised) weight; a row that sees no key at all comes out 0, not NaN
        total = torch.cat([content, iso_scores], -1).logsumexp(-1, keepdim=True).clamp_min(-1e30)
        iso_mass = (iso_scores - total).exp()
        n_total = n_seen + iso_seen.sum(-1, keepdim=True)
        targets = isolated_targets(iso_mass, policies, n_total, spec.weight, iso_seen)
        share = (1.0 - targets.sum(-1, keepdim=True)).clamp_min(0.0) / weights_seen.clamp_min(1)  # per unit of w
        calibrated = geometry.calibrated[items, None, None, None] & (n_seen > 0)  # (G, 1, Q or 1, 1)
        strength = calibrated.float() * spec.strength
        blended = mixed.mul((1.0 - strength) * (top - total).exp()).addcmul_(even, strength * share)
        weights = torch.lerp(iso_mass, targets, strength)
        for t in range(weights.shape[-1]):  # in the output's own memory layout, unlike a matmul's result
            blended.addcmul_(weights[..., t : t + 1], iso_value[items, :, t : t + 1])
        parts.append(blended)
    # The kernel writes (B, Q, H, D) memory and the updates keep it, so this transpose is a free view.
    return (parts[0] if len(parts) == 1 else torch.cat(parts)).transpose(1, 2).to(dtype)


def _basket_outputs(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor,
    score_bias: torch.Tensor | None,
    content: torch.Tensor,
    run: Run,
    size: int,
    scaling: float,
    by_size: bool,
    flags: tuple[tuple[bool, bool], ...],
) -> RunSums:
    """For the items of one run, over its baskets: Σ_b e^(m_b − top)·O_b, Σ_b w_b·O_b, top, log Σ_b e^(m_b),
    the number of baskets each row sees and Σ_b w_b (`RunSums`).

    m_b is the log of the row's (unnormalised) attention mass on basket b, −inf where the row may not
    see any of its keys (a shorter item's missing baskets, or a causal mask): such a basket is not one
    of the row's (not counted, w_b = 0), and its O_b is 0. w_b is 1 for a basket the row sees, or with
    `by_size` the number of its content keys the row sees. Both sums are float32 (G, H, Q, D); `top`, the
    running maximum of the m_b, and the log of the content mass are (G, H, Q, 1); the counts are
    (G, 1, Q or 1, 1). They are kept online because the blend needs every basket's mass before it can
    weigh any.
    """
    keys = key.shape[2]
    mixed = even = None
    top = torch.full((*query.shape[:3], 1), -1e30, device=query.device)
    norm = torch.zeros_like(top)  # Σ_b e^(m_b − top)
    n_seen = torch.zeros((*allowed.shape[:3], 1), device=query.device)
    weights = torch.zeros_like(n_seen) if by_size else n_seen  # Σ_b w_b: for equal, the basket count itself
    positions = torch.arange(keys, device=query.device)
    for (lo, hi, begin, end), (masked, has_blind) in zip(_basket_windows(run, size, keys), flags, strict=True):
        visible = _visible(allowed, content, positions, lo, hi, begin, end)
        window_bias = score_bias[..., begin:end] if score_bias is not None else None
        bias = additive_bias(visible, query.dtype, window_bias) if masked or window_bias is not None else None
        out, mass = attention_with_lse(query, key[:, :, begin:end], value[:, :, begin:end], bias, scaling)
        out, mass = out.float(), mass[..., None]
        blind = ~visible.any(-1)[..., None]  # (G, 1, Q or 1, 1): the row sees none of the basket's keys
        n_seen += ~blind
        count = visible.sum(-1, keepdim=True, dtype=torch.float32) if by_size else None  # w_b
        if count is not None:
            weights += count
        if has_blind:  # kernels differ in what they report for a row that sees no key
            out, mass = out.masked_fill_(blind, 0.0), mass.masked_fill(blind, float("-inf"))
        peak = torch.maximum(top, mass)
        rescale, weight = (top - peak).exp_(), (mass - peak).exp_()
        norm.mul_(rescale).add_(weight)
        if mixed is None or even is None:
            mixed = out * weight
            even = out if count is None else out.mul_(count)  # the kernel's output is ours to update
        else:
            mixed.mul_(rescale).addcmul_(out, weight)
            if count is None:
                even.add_(out)
            else:
                even.addcmul_(out, count)
        top = peak
    if mixed is None or even is None:  # a run of passages too short for one basket has none
        mixed = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
        even = torch.zeros_like(mixed)
    return RunSums(mixed, even, top, top + norm.log(), n_seen, weights)


def _basket_windows(run: Run, size: int, keys: int) -> list[tuple[int, int, int, int]]:
    """Per content basket of the run: its keys [lo, hi) and the kernel's window [begin, end) around them."""
    return [
        (lo, min(lo + size, keys), *kernel_window(lo, min(lo + size, keys), keys))
        for lo in range(run.start, run.start + run.n_baskets * size, size)
    ]


def _visible(
    allowed: torch.Tensor, content: torch.Tensor, positions: torch.Tensor, lo: int, hi: int, begin: int, end: int
) -> torch.Tensor:
    """(G, 1, Q or 1, window): the keys of the window that are basket [lo, hi)'s content and that the row may see."""
    inside = (positions[begin:end] >= lo) & (positions[begin:end] < hi)
    return allowed[..., begin:end] & (content[:, begin:end] & inside)[:, None, None, :]


def basket_flags(allowed: torch.Tensor, geometry: BasketGeometry) -> Flags:
    """Per run and content basket: whether the kernel needs a mask (some key of its window is hidden from some
    row) and whether some row sees none of the basket's keys. Both depend on the batch alone, so they are read
    back once per batch, in one host sync for all baskets, and no layer asks the device again."""
    keys = allowed.shape[-1]
    positions = torch.arange(keys, device=allowed.device)
    per_run, questions = [], []
    for run in geometry.runs:
        items = slice(run.begin, run.end)
        windows = _basket_windows(run, geometry.basket_size, keys)
        per_run.append(len(windows))
        for window in windows:
            visible = _visible(allowed[items], geometry.key_content[items], positions, *window)
            questions += [~visible.all(), (~visible.any(-1)).any()]
    answers = torch.stack(questions).tolist() if questions else []
    flags, at = [], 0
    for count in per_run:
        flags.append(tuple(zip(answers[at : at + 2 * count : 2], answers[at + 1 : at + 2 * count : 2], strict=True)))
        at += 2 * count
    return tuple(flags)
