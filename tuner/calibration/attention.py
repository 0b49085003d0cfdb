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
  per-basket outputs and log-sum-exps are blended, so the B×H×Q×K matrix is never formed (an
  observed layer also forms it tile by tile over the query axis, for the profile only). The fused
  kernel is torch's private `_scaled_dot_product_flash_attention_for_cpu` on CPU and the memory-efficient
  `_scaled_dot_product_efficient_attention` (asked for its log-sum-exp) on CUDA, each used only after a
  one-time probe shows it answering as expected; otherwise each basket's scores are formed (small).

No per-layer code asks the device a question (a host sync stalls a GPU's stream): what the data decide
(the baskets, which of them need a mask or have rows that see none of their keys) is read back once per
batch, for all layers; the running sums are rescaled unconditionally.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache
from typing import Any, NamedTuple, Protocol

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .config import ResolvedCalibration, Role
from .rows import BasketGeometry, Run, calibrate_rows, isolated_targets

ATTENTION_NAME = "posfair"
KERNEL_KEY_MULTIPLE = 16  # the fused CPU kernel runs slower on key counts off this grid (docs/engine.md)
TILE_BYTES = 32 * 2**20  # float32 working set of one tile of an observed mean-pooling layer


class AttentionObserver(Protocol):
    """Receives the pooled row's attention before and after calibration, for every layer."""

    def __call__(self, layer: int, before: torch.Tensor, after: torch.Tensor, geometry: BasketGeometry) -> None: ...


Flags = tuple[tuple[tuple[bool, bool], ...], ...]
"""Per run and content basket: whether the kernel needs a mask, and whether some row sees none of its keys."""


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
        """`_basket_flags` of this mask, read back once for all the layers that receive it."""
        if self._flags is None:
            self._flags = _basket_flags(self.allowed(), self.geometry)
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

    def mask(self, attention_mask: torch.Tensor | None, causal: bool, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
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
    sdpa_kwargs: dict[str, Any] = {"dropout": dropout, "scaling": scaling, "is_causal": is_causal, "position_bias": bias, **kwargs}
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
        after = calibrate_rows(before.clone() if active.observer else before, geometry, active.spec, allowed[:, None, :])
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
        sums = _row_sums(query, key, value, state.allowed(), bias, scaling, geometry, by_size, state.basket_flags())
        if reuse is not None:
            reuse.offer(shared, sums)
    return _mean_rows(sums, value, geometry, active.spec, query.dtype)


def _row_sums(
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
    (`flags`: per run and basket, whether it needs a mask and has blind rows; see `_basket_flags`).

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


def _mean_rows(sums: RowSums, value: torch.Tensor, geometry: BasketGeometry, spec: ResolvedCalibration, dtype: torch.dtype) -> torch.Tensor:
    """Every row calibrated: the blend of its basket outputs (`_row_sums`) by λ, variant and w → (B, Q, H, D).

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
        bias = _additive_bias(visible, query.dtype, window_bias) if masked or window_bias is not None else None
        out, mass = _attention_with_lse(query, key[:, :, begin:end], value[:, :, begin:end], bias, scaling)
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
        (lo, min(lo + size, keys), *_kernel_window(lo, min(lo + size, keys), keys))
        for lo in range(run.start, run.start + run.n_baskets * size, size)
    ]


def _visible(allowed: torch.Tensor, content: torch.Tensor, positions: torch.Tensor, lo: int, hi: int, begin: int, end: int) -> torch.Tensor:
    """(G, 1, Q or 1, window): the keys of the window that are basket [lo, hi)'s content and that the row may see."""
    inside = (positions[begin:end] >= lo) & (positions[begin:end] < hi)
    return allowed[..., begin:end] & (content[:, begin:end] & inside)[:, None, None, :]


def _basket_flags(allowed: torch.Tensor, geometry: BasketGeometry) -> Flags:
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


def _additive_bias(visible: torch.Tensor, dtype: torch.dtype, score: torch.Tensor | None = None) -> torch.Tensor:
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


def _kernel_window(lo: int, hi: int, keys: int, multiple: int = KERNEL_KEY_MULTIPLE) -> tuple[int, int]:
    """Key slice [begin, end) ⊇ [lo, hi) whose width is a multiple of `multiple` where the keys allow.

    The fused CPU kernel is slower on a key count off that grid (docs/engine.md), so a partial basket borrows
    keys from before it (or after it), which the caller masks out.
    """
    width = min(keys, -(-(hi - lo) // multiple) * multiple)
    begin = max(0, min(lo, hi - width))
    return begin, max(hi, min(keys, begin + width))


def _attention_with_lse(
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


FusedKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, float], tuple[torch.Tensor, torch.Tensor]]


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
    projections, a key window, a bias from `_additive_bias`), it returns the attention output (B, H, Q, D)
    and the natural log-sum-exp (B, H, Q) that the public ops give; else None (the caller falls back to them)."""
    if kernel is None:
        return None
    try:
        generator = torch.Generator().manual_seed(0)
        query, key, value = (torch.randn(2, 7, 3, 8, generator=generator).to(device).transpose(1, 2) for _ in range(3))
        key, value = key[:, :, 1:6], value[:, :, 1:6]
        visible = torch.ones(7, 5, dtype=torch.bool, device=device).tril(1).expand(2, 1, 7, 5)
        bias = _additive_bias(visible, query.dtype, torch.randn(1, 3, 7, 5, generator=generator).to(device))  # per head
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
    """`_attention_with_lse` from the scores, for devices without a fused kernel that passed its probe."""
    scores = (query @ key.transpose(-1, -2)).float().mul_(scaling)
    if bias is not None:
        scores += bias
    lse = scores.logsumexp(-1)
    weights = (scores - lse[..., None]).exp_().nan_to_num_(0.0)  # a row that sees no key: all −inf
    return (weights.to(value.dtype) @ value), lse


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
