"""Calibration as a transformers attention function.

`register()` adds the function under the name "posfair" to `AttentionInterface` (and the SDPA mask
maker under the same name to `AttentionMaskInterface`, without which a new name receives no padding
mask at all). A model loaded with `attn_implementation="posfair"` then calls `calibrated_attention`
in every layer. Outside a `calibrating(...)` block it is plain SDPA, so one loaded model encodes both
uncalibrated queries and calibrated documents.

Inside a block, in the calibrated layers:
- cls / last pooling: SDPA runs for all rows as usual; only the pooled row's attention (B×H×K) is
  recomputed, calibrated and multiplied with V, and that row of the output is replaced;
- mean pooling: rows are recomputed and calibrated tile by tile over the query axis, so the full
  B×H×Q×K matrix is never held at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .config import ResolvedCalibration, Role
from .rows import BasketGeometry, calibrate_rows

ATTENTION_NAME = "posfair"
TILE_BYTES = 32 * 2**20  # float32 working set of one mean-pooling tile


class AttentionObserver(Protocol):
    """Receives the pooled row's attention before and after calibration, for every layer."""

    def __call__(self, layer: int, before: torch.Tensor, after: torch.Tensor, geometry: BasketGeometry) -> None: ...


@dataclass
class _Active:
    """The calibration in force, plus the batch geometry shared by all layers of one forward pass."""

    spec: ResolvedCalibration
    observer: AttentionObserver | None
    roles: tuple[Role, ...] = field(init=False)
    _mask: torch.Tensor | None = field(default=None, init=False)
    _shape: tuple[int, int] | None = field(default=None, init=False)
    _geometry: BasketGeometry | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.roles = tuple(role for role, _ in self.spec.policies)

    def geometry(self, mask: torch.Tensor | None, batch: int, keys: int, device: torch.device) -> BasketGeometry:
        """Build once per batch: every layer of a forward pass receives the same mask object.

        The cached mask is kept referenced, so a later batch can never reuse its identity.
        """
        if self._geometry is None or self._mask is not mask or self._shape != (batch, keys):
            key_valid = _allowed(mask)[:, 0, -1, :] if mask is not None else torch.ones(batch, keys, dtype=torch.bool, device=device)
            self._geometry = BasketGeometry.from_key_mask(key_valid, self.spec.basket_size, self.roles)
            self._mask, self._shape = mask, (batch, keys)
        return self._geometry


_ACTIVE: ContextVar[_Active | None] = ContextVar("posfair_calibration", default=None)


@contextmanager
def calibrating(spec: ResolvedCalibration, observer: AttentionObserver | None = None) -> Iterator[None]:
    """Calibrate every forward pass run inside this block (and report attention to `observer`)."""
    token = _ACTIVE.set(_Active(spec, observer))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_spec() -> ResolvedCalibration | None:
    """The calibration in force in this context, if any."""
    active = _ACTIVE.get()
    return active.spec if active is not None else None


def calibrated_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """The function transformers calls: query (B, H, Q, D), key/value (B, Hkv, K, D) → (B, Q, H, D)."""
    active = _ACTIVE.get()
    layer = getattr(module, "layer_idx", None)
    calibrate = active is not None and layer in active.spec.layers
    observe = active is not None and active.observer is not None
    if not (calibrate or observe):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    assert active is not None
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    geometry = active.geometry(attention_mask, query.shape[0], key.shape[2], query.device)
    if active.spec.pooling == "mean":
        output = _mean_rows(query, key, value, attention_mask, scaling, geometry, active, layer, calibrate)
    else:
        output, _ = sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
        _pooled_row(output, query, key, value, attention_mask, scaling, geometry, active, layer, calibrate)
    return output, None


def _pooled_row(
    output: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    geometry: BasketGeometry,
    active: _Active,
    layer: int,
    calibrate: bool,
) -> None:
    """Recompute the pooled row only (B×H×K), calibrate it and write it into `output` in place."""
    batch, heads, _, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    items = torch.arange(batch, device=query.device)
    position = geometry.isolated[:, active.roles.index("first" if active.spec.pooling == "cls" else "last")]
    row_query = query[items, :, position].view(batch, kv_heads, heads // kv_heads, dim)
    # Per item: key/value are strided views of the (B, K, H, D) projections; a batched matmul over
    # (B, H) would first copy them whole, item by item BLAS reads them in place.
    scores = torch.stack([row_query[b] @ key[b].transpose(-1, -2) for b in range(batch)])
    scores = scores.view(batch, heads, keys).float().mul_(scaling)
    allowed = _allowed(mask)[items, 0, position] if mask is not None else geometry.key_valid
    scores.masked_fill_(~allowed[:, None, :], float("-inf"))
    before = scores.softmax(-1)
    del scores
    after = calibrate_rows(before.clone() if active.observer else before, geometry, active.spec) if calibrate else before
    if active.observer is not None:
        active.observer(layer, before, after, geometry)
    if calibrate:
        weights = after.to(value.dtype).view(batch, kv_heads, heads // kv_heads, keys)
        mixed = torch.stack([weights[b] @ value[b] for b in range(batch)])
        output[items, position] = mixed.view(batch, heads, dim)


def _mean_rows(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    geometry: BasketGeometry,
    active: _Active,
    layer: int,
    calibrate: bool,
) -> torch.Tensor:
    """Every valid row is calibrated, tile by tile over the query axis."""
    batch, heads, rows, dim = query.shape
    keys = key.shape[2]
    groups = heads // key.shape[1]
    key_t = repeat_kv(key, groups).transpose(-1, -2).contiguous()  # once per call, not once per tile
    value = repeat_kv(value, groups).contiguous()
    output = query.new_empty(batch, rows, heads, dim)
    tile = max(1, TILE_BYTES // (batch * heads * keys * 4))
    blocked = ~_allowed(mask) if mask is not None else ~geometry.key_valid[:, None, None, :]  # (B, 1, Q or 1, K)
    needs_mask = bool(blocked.any())
    profile = [query.new_zeros(batch, heads, keys, dtype=torch.float32) for _ in range(2)] if active.observer else None
    for start in range(0, rows, tile):
        stop = min(start + tile, rows)
        scores = (query[:, :, start:stop] * scaling @ key_t).float()  # scale the tile's queries, not its scores
        if needs_mask:
            scores.masked_fill_(blocked[:, :, start:stop] if blocked.shape[2] > 1 else blocked, float("-inf"))
        attn = scores.softmax(-1)
        del scores
        before = attn.clone() if profile is not None else None
        if calibrate:
            attn = calibrate_rows(attn.view(batch, heads * (stop - start), keys), geometry, active.spec)
            attn = attn.view(batch, heads, stop - start, keys)
        if profile is not None:
            valid_rows = geometry.key_valid[:, None, start:stop, None]
            profile[0] += (before * valid_rows).sum(2)
            profile[1] += (attn * valid_rows).sum(2)
        output[:, start:stop] = (attn.to(value.dtype) @ value).transpose(1, 2)
    if profile is not None and active.observer is not None:
        counts = geometry.key_valid.sum(-1).clamp_min(1)[:, None, None]
        active.observer(layer, profile[0] / counts, profile[1] / counts, geometry)
    return output


def _allowed(mask: torch.Tensor) -> torch.Tensor:
    """Boolean view of a transformers mask (boolean, or additive with a large negative for 'blocked')."""
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


def register() -> None:
    """Make "posfair" a valid `attn_implementation` for every model using the attention interface."""
    AttentionInterface.register(ATTENTION_NAME, calibrated_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
