"""Calibration as a transformers attention function.

`register()` adds the function under the name "posfair" to `AttentionInterface` (and the SDPA mask
maker under the same name to `AttentionMaskInterface`, without which a new name receives no padding
mask at all). A model loaded with `attn_implementation="posfair"` then calls `calibrated_attention`
in every layer, with transformers' SDPA signature. Outside a `calibrating(...)` block it is plain
SDPA, so one loaded model encodes both uncalibrated queries and calibrated documents; so is a layer
with nothing to calibrate (λ = 0, or no passage of the batch filling one basket).

Masks: transformers hands an unpadded batch over with no mask; for a decoder (Qwen3) that call is
causal (`is_causal`, decided as transformers' SDPA function decides it), so the calibrated paths
apply the causal triangle, and a row is calibrated over the baskets it can see (see `rows.py`).
A sliding-window layer (Gemma3, ModernBERT) receives a mask that holds its window, one mask object
per kind of layer, and every path applies it: a row is calibrated over the passage's baskets as its
window shows them, because a basket must be the same stretch of text for every row and every layer
(§3's partition of the passage; Appendix A's one geometry per batch). The baskets come from which keys
are tokens (`_real_keys`), since under a window no single row of the mask sees the whole passage.
A `position_bias` (B or 1, H, Q, K), the additive score term T5 hands over and MPNet's adapter
(`tuner.engine.adapters`) too, enters every score before the softmax, as in transformers' SDPA
function: calibration redistributes the attention the model really computes.

Inside a block, in the calibrated layers:
- cls / last pooling: SDPA runs for all rows as usual; only the pooled row's attention (B×H×K) is
  recomputed, calibrated and multiplied with V, and that row of the output is replaced;
- mean pooling: every row is calibrated; the fused kernel runs once per content basket and its
  per-basket outputs and log-sum-exps are blended (`mean_pooling.py`), so the B×H×Q×K matrix is never
  formed (an observed layer also forms it tile by tile over the query axis, for the profile only). The
  fused kernel is torch's private `_scaled_dot_product_flash_attention_for_cpu` on CPU and the
  memory-efficient `_scaled_dot_product_efficient_attention` (asked for its log-sum-exp) on CUDA, each
  used only after a one-time probe shows it answering as expected; otherwise each basket's scores are
  formed, which one basket's keys keep small (`kernels.py`).

No per-layer code asks the device a question (a host sync stalls a GPU's stream): what the data decide
(the baskets, which of them need a mask or have rows that see none of their keys) is read back once per
batch, for all layers; the running sums are rescaled unconditionally.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .config import ResolvedCalibration, Role
from .mean_pooling import Flags, SharedSums, basket_flags, mean_rows, row_sums
from .rows import BasketGeometry, calibrate_rows

ATTENTION_NAME = "posfair"
TILE_BYTES = 32 * 2**20  # float32 working set of one tile of an observed mean-pooling layer


class AttentionObserver(Protocol):
    """Receives the pooled row's attention before and after calibration, for every layer."""

    def __call__(self, layer: int, before: torch.Tensor, after: torch.Tensor, geometry: BasketGeometry) -> None: ...


@dataclass
class _MaskState:
    """What one mask of a batch decides, derived on first use and kept for every layer that receives the mask.

    The mask object is kept referenced, so a later batch's mask can never reuse its identity.
    """

    mask: torch.Tensor | None
    shape: tuple[int, int]  # (batch, keys)
    geometry: BasketGeometry
    _key_mask: torch.Tensor | None = field(default=None, init=False)
    _flags: Flags | None = field(default=None, init=False)

    def allowed(self) -> torch.Tensor:
        """The boolean mask (B, 1, Q or 1, K): a single row when every query row sees the same keys.

        transformers hands a padding-only mask over as a full (Q, K) matrix per item; one row of it lets
        the mean path give the fused kernel a key mask, which it applies far faster than a matrix (a
        causal or sliding-window mask stays a matrix). Built on first use, so cls / last pooling never
        pays for the comparison.
        """
        if self._key_mask is None:
            if self.mask is None:
                self._key_mask = self.geometry.key_valid[:, None, None, :]
            else:
                allowed = _allowed(self.mask)
                same_rows = allowed.shape[2] > 1 and bool((allowed == allowed[:, :, :1]).all())
                self._key_mask = allowed[:, :, :1] if same_rows else allowed
        return self._key_mask

    def basket_flags(self) -> Flags:
        """`basket_flags` of this mask, read back once for all the layers that receive it."""
        if self._flags is None:
            self._flags = basket_flags(self.allowed(), self.geometry)
        return self._flags


@dataclass
class _Active:
    """The calibration in force, plus what the batch's masks decide, shared by all layers of one forward pass."""

    spec: ResolvedCalibration
    observer: AttentionObserver | None
    first_layer: SharedSums | None = None
    roles: tuple[Role, ...] = field(init=False)
    _states: dict[object, _MaskState] = field(default_factory=dict, init=False)
    _causal: torch.Tensor | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.roles = tuple(role for role, _ in self.spec.policies)

    def mask(
        self, attention_mask: torch.Tensor | None, causal: bool, query: torch.Tensor, key: torch.Tensor
    ) -> torch.Tensor | None:
        """The mask the calibrated paths apply: transformers' own, or for a causal call without one (an
        unpadded decoder batch) the causal triangle, row i seeing keys 0..i, as SDPA's `is_causal` does.
        None means every key is visible to every row. The triangle is kept for the batch, so every layer
        hands the same object to `state`."""
        if attention_mask is not None or not causal:
            return attention_mask
        batch, rows, keys = query.shape[0], query.shape[2], key.shape[2]
        if self._causal is None or self._causal.shape != (batch, 1, rows, keys) or self._causal.device != query.device:
            triangle = torch.ones(rows, keys, dtype=torch.bool, device=query.device).tril()
            self._causal = triangle.expand(batch, 1, rows, keys)
        return self._causal

    def state(
        self,
        mask: torch.Tensor | None,
        window: object,
        batch: int,
        keys: int,
        device: torch.device,
    ) -> _MaskState:
        """What `mask` decides (its baskets first), built once per batch and kind of layer.

        Layers of one kind receive the same mask object; a model with sliding-window and full layers
        (Gemma3, ModernBERT) builds one mask per kind and hands them over alternately, each kind's layers
        passing their own `sliding_window` (`window`; None for a full layer). Keeping one state per kind
        keeps both for the whole batch, so no layer rebuilds them (a rebuild reads values back from the device).
        """
        state = self._states.get(window)
        if state is None or state.mask is not mask or state.shape != (batch, keys):
            real = _real_keys(mask) if mask is not None else torch.ones(batch, keys, dtype=torch.bool, device=device)
            geometry = BasketGeometry.from_key_mask(real, self.spec.basket_size, self.roles)
            state = _MaskState(mask, (batch, keys), geometry)
            self._states[window] = state
        return state


_ACTIVE: ContextVar[_Active | None] = ContextVar("posfair_calibration", default=None)


@contextmanager
def calibrating(
    spec: ResolvedCalibration, observer: AttentionObserver | None = None, first_layer: SharedSums | None = None
) -> Iterator[None]:
    """Calibrate every forward pass run inside this block (and report attention to `observer`).

    With `first_layer` (one batch's), mean-pooling sums of the first calibrated layer are looked up there and kept.
    """
    token = _ACTIVE.set(_Active(spec, observer, first_layer))
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
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """The function transformers calls: query (B, H, Q, D), key/value (B, Hkv, K, D) → (B, Q, H, D).

    The signature is transformers' `sdpa_attention_forward`'s, and so is the rule for causality: with
    no mask, the call is causal if `is_causal` says so, else if the module's `is_causal` does (True if
    it has none), for more than one query row. Nothing to calibrate in this layer (outside a
    `calibrating` block, a layer not calibrated, λ = 0, or no passage of the batch filling a basket)
    is SDPA's own call, unless an observer wants the profile.
    """
    active = _ACTIVE.get()
    bias = kwargs.pop("position_bias", None)
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"position_bias must be a tensor, not {type(bias).__name__}")
    layer = getattr(module, "layer_idx", None)
    calibrate = active is not None and layer in active.spec.layers and active.spec.strength > 0.0
    observe = active is not None and active.observer is not None
    mask = state = geometry = None
    if active is not None and (calibrate or observe):
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        mask = active.mask(attention_mask, bool(causal) and query.shape[2] > 1, query, key)
        # the mask encodes a sliding layer's window; `sliding_window` only tells the layer kinds apart
        state = active.state(mask, kwargs.get("sliding_window"), query.shape[0], key.shape[2], query.device)
        geometry = state.geometry
        calibrate = calibrate and geometry.any_calibrated
    # Any: transformers' forward passes its own keyword arguments through untyped (`**kwargs`)
    sdpa_kwargs: dict[str, Any] = {
        "dropout": dropout,
        "scaling": scaling,
        "is_causal": is_causal,
        "position_bias": bias,
        **kwargs,
    }
    if active is None or state is None or geometry is None or not (calibrate or observe):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **sdpa_kwargs)
    if layer is None:  # only an observer gets here without one: a calibrated layer is one of spec.layers
        raise ValueError(f"posfair cannot profile attention in {type(module).__name__}: the module has no layer_idx")
    if calibrate:
        _warn_of_dropout(dropout)
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    mean = active.spec.pooling == "mean"
    if mean and calibrate:
        output = _mean_layer(query, key, value, state, bias, scaling, active, layer)
    else:
        output, _ = sdpa_attention_forward(module, query, key, value, attention_mask, **sdpa_kwargs)
    if not mean:
        _pooled_row(output, query, key, value, mask, bias, scaling, geometry, active, layer, calibrate)
    elif active.observer is not None:
        before, after = _mean_profile(query, key, mask, bias, scaling, geometry, active.spec, calibrate)
        active.observer(layer, before, after, geometry)
    return output, None


_WARNED: set[str] = set()


def _warn_of_dropout(dropout: float) -> None:
    """A calibrated layer computes its calibrated rows without dropout (warned once per process)."""
    if dropout > 0.0 and "dropout" not in _WARNED:
        _WARNED.add("dropout")
        warnings.warn(
            f"posfair: attention dropout {dropout:g} is not applied to calibrated rows (is the model in train "
            "mode?); calibration is meant for inference: call model.eval()",
            RuntimeWarning,
            stacklevel=3,
        )


def _pooled_row(
    output: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    bias: torch.Tensor | None,
    scaling: float,
    geometry: BasketGeometry,
    active: _Active,
    layer: int,
    calibrate: bool,
) -> None:
    """Recompute the pooled row only (B×H×K), calibrate it and write it into `output` in place."""
    batch, heads, rows, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    items = torch.arange(batch, device=query.device)
    position = geometry.first if active.spec.pooling == "cls" else geometry.last
    row_query = query[items, :, position].view(batch, kv_heads, heads // kv_heads, dim)
    scores = _per_head(row_query, key, transpose=True).view(batch, heads, keys).float().mul_(scaling)
    if bias is not None:
        scores += bias.expand(batch, heads, rows, keys)[items, :, position]
    allowed = _allowed(mask)[items, 0, position] if mask is not None else geometry.key_valid
    scores.masked_fill_(~allowed[:, None, :], float("-inf"))
    before = scores.softmax(-1)
    del scores
    if calibrate:
        after = calibrate_rows(
            before.clone() if active.observer else before, geometry, active.spec, allowed[:, None, :]
        )
    else:
        after = before
    if active.observer is not None:
        active.observer(layer, before, after, geometry)
    if calibrate:
        weights = after.to(value.dtype).view(batch, kv_heads, heads // kv_heads, keys)
        output[items, position] = _per_head(weights, value, transpose=False).reshape(batch, heads, dim)


def _per_head(rows: torch.Tensor, keyed: torch.Tensor, transpose: bool) -> torch.Tensor:
    """One batched matmul per head without copying K or V: rows (B, Hkv, G, n) against keyed (B, Hkv, K, D)
    → rows @ keyedᵀ (B, Hkv, G, K) if `transpose`, else rows @ keyed (B, Hkv, G, D).

    K and V are strided views of the (B, K, Hkv·D) projections, which a matmul batched over (B, Hkv) would
    first copy whole. Seen as one (K, Hkv·D) matrix per item they need no copy: the rows are spread
    block-diagonally over the heads (zeros elsewhere) for one matmul batched over B, and only the diagonal
    head blocks of its result are kept. That does Hkv× the multiply-adds of a per-head product, which on
    one row per passage is a fraction of a percent of the layer's attention.
    """
    batch, kv_heads, groups, _ = rows.shape
    by_token = keyed.transpose(1, 2)  # (B, K, Hkv, D)
    if by_token.stride(-1) != 1 or by_token.stride(-2) != by_token.shape[-1]:  # not (B, K, Hkv·D) memory
        return rows @ (keyed.transpose(-1, -2) if transpose else keyed)
    dim = keyed.shape[-1]
    matrix = by_token.flatten(2)  # (B, K, Hkv·D), a view
    eye = torch.eye(kv_heads, dtype=rows.dtype, device=rows.device)
    if transpose:  # (B, Hkv·G, Hkv·D) @ (B, Hkv·D, K): head h's rows meet only head h's keys
        spread = (rows[:, :, :, None, :] * eye[None, :, None, :, None]).view(batch, kv_heads * groups, kv_heads * dim)
        return (spread @ matrix.transpose(1, 2)).view(batch, kv_heads, groups, -1)
    mixed = (rows.flatten(1, 2) @ matrix).view(batch, kv_heads, groups, kv_heads, dim)  # every head's V, per row
    return mixed.diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2)  # head h's rows with head h's V


def _mean_layer(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    state: _MaskState,
    bias: torch.Tensor | None,
    scaling: float,
    active: _Active,
    layer: int,
) -> torch.Tensor:
    """A calibrated mean-pooling layer: its `RowSums` (shared ones, in the first calibrated layer), blended."""
    groups = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    geometry = state.geometry
    reuse = active.first_layer if layer == min(active.spec.layers) else None
    by_size = active.spec.basket_shares == "by_size"
    shared = (layer, geometry.basket_size, geometry.roles, active.spec.basket_shares)
    sums = reuse.lookup(shared) if reuse is not None else None
    if sums is None:
        sums = row_sums(query, key, value, state.allowed(), bias, scaling, geometry, by_size, state.basket_flags())
        if reuse is not None:
            reuse.offer(shared, sums)
    return mean_rows(sums, value, geometry, active.spec, query.dtype)


def _mean_profile(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    bias: torch.Tensor | None,
    scaling: float,
    geometry: BasketGeometry,
    spec: ResolvedCalibration,
    calibrate: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention an observer sees: averages over valid rows before and after calibration (B, H, K).

    Only the observed (profiled) passages pay for this: rows are formed tile by tile over the query
    axis, so the full B×H×Q×K matrix is never held at once.
    """
    batch, heads, rows, _ = query.shape
    keys = key.shape[2]
    key_t = repeat_kv(key, heads // key.shape[1]).transpose(-1, -2)
    tile = max(1, TILE_BYTES // (batch * heads * keys * 4))
    blocked = ~_allowed(mask) if mask is not None else ~geometry.key_valid[:, None, None, :]  # (B, 1, Q or 1, K)
    before, after = (query.new_zeros(batch, heads, keys, dtype=torch.float32) for _ in range(2))
    for start in range(0, rows, tile):
        stop = min(start + tile, rows)
        scores = (query[:, :, start:stop] @ key_t).float().mul_(scaling)
        if bias is not None:
            scores += bias[:, :, start:stop]
        tile_blocked = blocked[:, :, start:stop] if blocked.shape[2] > 1 else blocked
        scores.masked_fill_(tile_blocked, float("-inf"))
        attn = scores.softmax(-1).nan_to_num_(0.0)  # a row that sees no key (padding under a causal mask)
        valid_rows = geometry.key_valid[:, None, start:stop, None]
        before += (attn * valid_rows).sum(2)
        if calibrate:
            seen = (~tile_blocked).expand(batch, heads, stop - start, keys).reshape(batch, -1, keys)
            attn = calibrate_rows(attn.view(batch, heads * (stop - start), keys), geometry, spec, seen)
        after += (attn.view(batch, heads, stop - start, keys) * valid_rows).sum(2)
    counts = geometry.key_valid.sum(-1).clamp_min(1)[:, None, None]
    return before / counts, after / counts


def _real_keys(mask: torch.Tensor) -> torch.Tensor:
    """(B, K): which keys are tokens, not padding, under a transformers mask (B, 1, Q or 1, K).

    Under a sliding window no row sees every key (a bidirectional window's last row sees only the passage's
    end), but every token sees itself and no row sees a padding key: the diagonal says which keys are real.
    """
    allowed = _allowed(mask)[:, 0]
    return allowed.diagonal(dim1=1, dim2=2) if allowed.shape[1] == allowed.shape[2] else allowed.any(1)


def _allowed(mask: torch.Tensor) -> torch.Tensor:
    """Boolean view of a transformers mask (boolean, or additive with a large negative for 'blocked')."""
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


def register() -> None:
    """Make "posfair" a valid `attn_implementation` for every model using the attention interface."""
    AttentionInterface.register(ATTENTION_NAME, calibrated_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
