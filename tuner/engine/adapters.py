"""Model families whose self-attention bypasses transformers' attention interface, routed to it.

Most families in transformers 5.x (BERT, RoBERTa/XLM-R, ModernBERT, GTE, T5, Qwen2/3, Llama, …) call
`ALL_ATTENTION_FUNCTIONS[config._attn_implementation]` from their attention modules, which is where
calibration sits. A few compute q·kᵀ, the softmax and the product with V inline (MPNet, DeBERTa-v2,
Longformer, Funnel, XLM), so an attention function never sees them. An adapter gives each such module
*instance* of a loaded model (never the class: other models in the process are untouched) a forward that
computes the same projections and hands query, key, value, the padding mask and any additive score term
to the attention function in force, in the interface's calling convention; the module's own weights and
output projection are kept. Some families do call the interface but leave their attention modules without
the layer index calibration picks its layers by (GTE, DistilBERT, NomicBERT, Jina v3); their adapter only
numbers them. `INTERFACE` lists the families that need nothing; tests/test_families.py holds every family of
both lists exact against the oracle on a tiny model of it, so these lists are what posfair supports.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.distilbert.modeling_distilbert import DistilBertSelfAttention
from transformers.models.gte.modeling_gte import GteAttention
from transformers.models.jina_embeddings_v3.modeling_jina_embeddings_v3 import JinaEmbeddingsV3Attention
from transformers.models.mpnet.modeling_mpnet import MPNetSelfAttention
from transformers.models.nomic_bert.modeling_nomic_bert import NomicBertAttention


@dataclass(frozen=True)
class Adapter:
    """How one family's self-attention modules reach the attention interface."""

    attention: type[torch.nn.Module]  # the family's attention module class
    forward: Callable[..., tuple[torch.Tensor, ...]] | None = None  # its replacement, bound to each instance; None
    # when the module calls the interface itself and lacks only its layer index


def _boolean_mask(mask: torch.Tensor | None, rows: int) -> torch.Tensor | None:
    """The interface's boolean (B, 1, Q, K) mask. A model builds its mask with the mask maker registered for its
    attention implementation, which for posfair's is already that; an additive one (0 where a key is visible,
    the dtype's minimum where not), as eager attention gets, is turned into it, as a view."""
    if mask is None or mask.dtype == torch.bool:
        return mask
    allowed = mask > torch.finfo(mask.dtype).min / 2
    return allowed.expand(allowed.shape[0], 1, rows, allowed.shape[-1])


def _mpnet_self_attention(
    self: MPNetSelfAttention,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_bias: torch.Tensor | None = None,
    output_attentions: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, ...]:
    """MPNet's self-attention: scores q·kᵀ/√d plus the relative `position_bias` its encoder computes once for
    all layers, plus the mask; the bias goes to the attention function as the additive term T5 hands over."""
    shape = (*hidden_states.shape[:-1], -1, self.attention_head_size)
    query, key, value = (
        projection(hidden_states).view(shape).transpose(1, 2) for projection in (self.q, self.k, self.v)
    )
    # cast: torch types a module's unknown attribute as Tensor | Module; `adapt` set it to the model's config
    attention = ALL_ATTENTION_FUNCTIONS[cast(PretrainedConfig, self.config)._attn_implementation]
    output, weights = attention(
        self,
        query,
        key,
        value,
        _boolean_mask(attention_mask, query.shape[2]),
        dropout=self.dropout.p if self.training else 0.0,
        scaling=self.attention_head_size**-0.5,
        position_bias=position_bias,
    )
    output = self.o(output.reshape(*hidden_states.shape[:-1], -1))
    return (output, weights) if output_attentions else (output,)


INTERFACE = (
    "bert",
    "roberta",
    "xlm-roberta",
    "electra",
    "modernbert",
    "eurobert",
    "qwen3",
    "llama",
    "mistral",
    "gemma3_text",
)
"""By `config.model_type`: families whose attention modules call the interface with their layer index."""

ADAPTERS: dict[str, Adapter] = {
    "mpnet": Adapter(MPNetSelfAttention, _mpnet_self_attention),
    "gte": Adapter(GteAttention),
    "distilbert": Adapter(DistilBertSelfAttention),
    "nomic_bert": Adapter(NomicBertAttention),
    "jina_embeddings_v3": Adapter(JinaEmbeddingsV3Attention),
}
"""By `config.model_type`: the families posfair routes to the attention interface, or numbers the layers of."""

ROUTED = tuple(sorted(name for name, adapter in ADAPTERS.items() if adapter.forward is not None))
"""The families whose attention reaches calibration only through their adapter."""

SUPPORTED = frozenset(INTERFACE) | frozenset(ADAPTERS)
"""Every model type posfair calibrates (and tests against the oracle)."""


def adapt(model: PreTrainedModel) -> int:
    """Route `model`'s attention through the interface if its family has an adapter; the number of modules adapted.

    Each adapted module gets its layer index (calibration picks its layers by it); a routed one also gets what
    the interface's own modules carry: the model's config and `is_causal` (these families are bidirectional
    encoders).
    """
    adapter = ADAPTERS.get(model.config.model_type)
    if adapter is None:
        return 0
    # Any: plain attributes on a module, which torch's typing of Module.__setattr__ does not describe
    modules: list[Any] = [module for module in model.modules() if isinstance(module, adapter.attention)]
    for layer, module in enumerate(modules):
        module.layer_idx = layer
        if adapter.forward is not None:
            module.config = model.config
            module.is_causal = False
            module.forward = types.MethodType(adapter.forward, module)
    return len(modules)
