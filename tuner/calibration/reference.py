"""The test oracle: the equations of §3, written plainly over the full attention matrix.

Deliberately the way Appendix A describes the original implementation: eager attention
materialises the whole B×H×Q×K matrix, a per-position basket index is built for each item, basket
sums are accumulated with `scatter_add` and handed back with `gather`. Slow and memory-hungry by
design; the engine (`rows.py`, `attention.py`) must agree with it. The tests run it in float64.

Independent of the engine: the oracle reads only the fields a user writes in a `CalibrationConfig`
(variant, strength, layers, basket_size, weight, pooling, isolate, policies, basket_shares) and
derives the rest itself, from the paper: which tokens are isolated (Table 4), their policies (§3.1,
§3.3), the baskets, the shares and the calibrated layers. It never calls the config's own resolution
(`resolve`, `role_policies`, `resolve_layers`, `isolated_roles`), nor anything in `rows.py`.

Rows that cannot see every key (a causal mask, a sliding window): a row is calibrated over what it
sees. The baskets are the passage's; a content basket none of whose keys the row may see is not one
of its baskets (it counts in no n_baskets and gets no share: there is no mass to renormalise), one it
sees part of is renormalised over that part, an isolated token it may not see stays at 0 whatever its
policy, and a row that sees no content basket at all is left as it is. Under a padding mask every real
row sees every real key, so this only matters for causal masks and sliding windows. A sliding layer's
window is built here from the `sliding_window` the layer passes (`reference_mask`), not read from the
mask transformers builds, which the engine uses.

Content baskets split what the isolated tokens leave: equally (§3, `basket_shares: equal`), or in
proportion to the number of their content keys the row sees (`by_size`).
"""

from __future__ import annotations

from functools import partial
from typing import cast

import torch
from transformers import AttentionInterface, PretrainedConfig
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .attention import active_spec
from .config import CalibrationConfig

REFERENCE_ATTENTION_NAME = "posfair_reference"

# Table 4: which special tokens sit in a basket of their own, unless `isolate` says otherwise. The
# pooled <s> for cls pooling; <s> and the pooled </s> for last-token pooling; for mean pooling
# (not in the paper) both ends, which are attention sinks like the pooled token.
DEFAULT_ISOLATED = {"cls": ("first",), "last": ("first", "last"), "mean": ("first", "last")}
# The token whose self-mass CLS-Hard fixes at w (§3.3): the pooled one; the [CLS] sink for mean pooling.
POOLED = {"cls": "first", "last": "last", "mean": "first"}


def reference_isolated(config: CalibrationConfig) -> tuple[str, ...]:
    """The isolated tokens, in the order given (`isolate`), or by pooling (Table 4)."""
    return tuple(config.isolate) if config.isolate is not None else DEFAULT_ISOLATED[config.pooling]


def reference_policies(config: CalibrationConfig) -> dict[str, str]:
    """Each isolated token's policy: the variant's, then the explicit `policies`.

    Uniform (§3.1): every isolated token's basket is one basket among all, 1/n_baskets ("equal").
    CLS-Soft (§3.3): isolated tokens keep their own mass a_s ("original").
    CLS-Hard (§3.3): the pooled token's mass is fixed at w ("fixed"); other isolated tokens are baskets
    like any other ("equal").
    """
    policies: dict[str, str] = {}
    for role in reference_isolated(config):
        if config.variant == "uniform":
            policies[role] = "equal"
        elif config.variant == "cls_soft":
            policies[role] = "original"
        else:
            policies[role] = "fixed" if role == POOLED[config.pooling] else "equal"
    policies.update((config.policies or {}).items())
    return policies


def reference_layers(config: CalibrationConfig, num_layers: int) -> set[int]:
    """The calibrated layers (0-based) of a model `num_layers` deep.

    An explicit list; "last" / "last:k": the final k layers; a fraction f of depth: the final
    round(f · num_layers) layers, halves rounded up, at least one (the paper's "50% layers").
    """
    spec = config.layers
    if isinstance(spec, list):
        return set(spec)
    if isinstance(spec, str):
        count = int(spec.split(":")[1]) if ":" in spec else 1
    else:
        count = max(1, int(spec * num_layers + 0.5))
    return set(range(num_layers - count, num_layers))


def reference_calibrate(
    attn: torch.Tensor, key_valid: torch.Tensor, allowed: torch.Tensor, rows: torch.Tensor, config: CalibrationConfig
) -> torch.Tensor:
    """Calibrate the query rows marked in `rows` (B, Q) of the full matrix `attn` (B, H, Q, K).

    `key_valid` (B, K) marks the real (non-padding) tokens; `allowed` (B, 1 or H, Q, K) the keys each
    row may see.
    """
    out = attn.clone()
    allowed = allowed.expand_as(attn)
    roles = reference_isolated(config)
    policies = reference_policies(config)
    for b in range(attn.shape[0]):
        valid = torch.nonzero(key_valid[b]).flatten().tolist()
        if not valid:
            continue
        ends = {"first": valid[0], "last": valid[-1]}
        isolated = [ends[role] for role in roles]
        content = torch.tensor([k for k in valid if k not in isolated], dtype=torch.long)
        if len(content) < config.basket_size:  # a passage shorter than one basket is left alone
            continue
        basket_of = torch.arange(len(content)) // config.basket_size  # per-position basket index
        n_baskets = int(basket_of.max()) + 1
        query_rows = torch.nonzero(rows[b]).flatten()
        a = out[b][:, query_rows, :]  # (H, R, K)
        sees = allowed[b][:, query_rows, :]
        index = basket_of.expand(*a.shape[:2], -1)
        sums = a.new_zeros(*a.shape[:2], n_baskets).scatter_add_(-1, index, a[..., content])
        # per basket, how many of its keys each row may see; the baskets it sees: those with at least one
        sizes = a.new_zeros(*a.shape[:2], n_baskets).scatter_add_(-1, index, sees[..., content].to(a.dtype))
        seen = sizes > 0
        n_seen = seen.sum(-1, keepdim=True)  # (H, R, 1)
        iso_seen = sees[..., isolated]  # (H, R, I)
        n_total = n_seen + iso_seen.sum(-1, keepdim=True)
        targets = []
        for column, (role, position) in enumerate(zip(roles, isolated)):
            seen_it = iso_seen[..., column]
            if policies[role] == "equal":  # one basket among all the row sees
                target = seen_it.to(a.dtype) / n_total[..., 0].to(a.dtype).clamp_min(1)
            elif policies[role] == "original":  # its own mass a_s
                target = a[..., position]
            else:  # fixed: w
                target = seen_it.to(a.dtype) * config.weight
            targets.append(target)
        target = torch.stack(targets, -1) if targets else a[..., :0]
        target = target / target.sum(-1, keepdim=True).clamp_min(1.0)  # targets above 1 in all: scaled to 1
        remaining = (1.0 - target.sum(-1, keepdim=True)).clamp_min(0.0)
        if config.basket_shares == "by_size":  # in proportion to the keys of each basket the row sees
            share = remaining * sizes / sizes.sum(-1, keepdim=True).clamp_min(1)
        else:  # equal: one share per basket the row sees
            share = torch.where(seen, remaining / n_seen.clamp_min(1), 0.0)  # (H, R, n_baskets)
        per_key = torch.where(seen, share / sums.where(seen, 1.0), 0.0)  # basket share ÷ basket mass
        calibrated = torch.zeros_like(a)
        calibrated[..., content] = a[..., content] * per_key.gather(-1, index)
        for column, position in enumerate(isolated):
            calibrated[..., position] = target[..., column]
        calibrated = torch.where(n_seen > 0, calibrated, a)  # a row that sees no content basket stays
        out[b][:, query_rows, :] = config.strength * calibrated + (1.0 - config.strength) * a
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
    config: CalibrationConfig | None,
    dtype: torch.dtype = torch.float64,
    position_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eager attention, calibrated by `config` if given; query (B, H, Q, D), key/value (B, Hkv, K, D).

    `allowed` is the boolean (B, 1, Q, K) mask; `position_bias` (B or 1, H, Q, K) is added to the scores
    (T5, MPNet). Returns (B, Q, H, D) in `dtype`.
    """
    groups = query.shape[1] // key.shape[1]
    key = key.to(dtype).repeat_interleave(groups, dim=1)
    value = value.to(dtype).repeat_interleave(groups, dim=1)
    scores = query.to(dtype) @ key.transpose(-1, -2) * scaling
    if position_bias is not None:
        scores = scores + position_bias.to(dtype)
    attn = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)  # fully masked pad rows
    if config is not None:
        key_valid = allowed[:, 0].any(-2)
        attn = reference_calibrate(attn, key_valid, allowed, calibrated_query_rows(config.pooling, key_valid), config)
    return (attn @ value).transpose(1, 2)


def reference_mask(
    module: torch.nn.Module,
    attention_mask: torch.Tensor | None,
    is_causal: bool | None,
    batch: int,
    rows: int,
    keys: int,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """The boolean (B, 1, Q, K) mask that transformers' SDPA integration applies.

    Causality: the `is_causal` argument, else the module's `is_causal` attribute (True if it has none),
    and only for more than one query row; a causal row i sees keys 0..i. Without a sliding window a
    given mask is used as it is (it holds padding and causality); without one, every key is visible
    unless the call is causal.

    A sliding layer (`sliding_window` w, as the layer passes it to its attention function) is built here
    from its definition, not taken from the mask: row i sees the real keys j with |i − j| < w (and j ≤ i
    if causal), the real keys being those some row of the given mask may see. The symmetric window is
    flash attention's `window_size = (w − 1, w − 1)`, which transformers' masks for SDPA reproduce.
    """
    causal = (is_causal if is_causal is not None else getattr(module, "is_causal", True)) and rows > 1
    if sliding_window is None:
        if attention_mask is not None:
            return attention_mask
        allowed = torch.ones(batch, 1, rows, keys, dtype=torch.bool)
        return allowed.tril() if causal else allowed
    real = torch.ones(batch, keys, dtype=torch.bool) if attention_mask is None else attention_mask[:, 0].any(-2).cpu()
    distance = torch.arange(rows)[:, None] - torch.arange(keys)[None, :]  # row i − key j
    window = distance.abs() < sliding_window
    if causal:
        window &= distance >= 0
    return window[None, None] & real[:, None, None, :]


def reference_attention_function(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    *,
    oracle_dtype: torch.dtype = torch.float64,
    position_bias: torch.Tensor | None = None,
    sliding_window: int | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """The oracle as a transformers attention function, for end-to-end comparisons and benchmarks.

    Inside `calibrating(...)` it applies the user-level config the engine was given, in the layers
    it derives itself from that config and the model's depth; a sliding layer's window comes from its
    `sliding_window` (`reference_mask`).
    """
    batch, _, rows, _ = query.shape
    allowed = reference_mask(module, attention_mask, is_causal, batch, rows, key.shape[2], sliding_window)
    allowed = allowed.to(query.device)
    spec = active_spec()
    config = spec.config if spec is not None else None
    # cast: torch types a module's unknown attribute as Tensor | Module; an attention module's `config` is its model's
    model_config = cast(PretrainedConfig, module.config)
    if config is not None and module.layer_idx not in reference_layers(config, model_config.num_hidden_layers):
        config = None
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    output = reference_attention(query, key, value, allowed, scale, config, oracle_dtype, position_bias)
    return output.to(query.dtype), None


def register_reference(name: str = REFERENCE_ATTENTION_NAME, dtype: torch.dtype = torch.float64) -> str:
    """Make the oracle an `attn_implementation` (float64 for tests; float32 to time the original approach)."""
    AttentionInterface.register(name, partial(reference_attention_function, oracle_dtype=dtype))
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
