"""Tiny randomly initialised models and tokenizers, saved to a folder and loaded like real ones.

Three architectures cover the pooling schemes: BERT (cls or mean pooling, right padding), XLM-R
(cls, bge-m3's architecture) and Qwen3 (last-token pooling, grouped-query attention, left padding).
Two more cover how attention reaches calibration: MPNet (mean pooling, all-mpnet-base-v2's architecture),
whose attention computes its scores itself plus a relative position bias and is routed through an adapter,
and GTE (cls, gte-multilingual-base's native architecture: rotary positions, gated MLP).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    AutoModel,
    BertConfig,
    BertModel,
    GteConfig,
    GteModel,
    MPNetConfig,
    MPNetModel,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3Model,
    XLMRobertaConfig,
    XLMRobertaModel,
)

from tuner.engine.adapters import adapt

if TYPE_CHECKING:
    from tuner.calibration import CalibrationConfig
    from tuner.engine.exported import ExportedConfig
    from tuner.engine.models import LoadedModel

WORDS = [f"w{i}" for i in range(200)]
SPECIALS = {
    "bert": ("[PAD]", "[UNK]", "[CLS]", "[SEP]"),
    "xlmr": ("<pad>", "<unk>", "<s>", "</s>"),
    "qwen3": ("<pad>", "<unk>", "<bos>", "<|endoftext|>"),
}


TOKENIZER_OF = {"mpnet": "xlmr", "gte": "xlmr"}  # both number <s> 0, <pad> 1, </s> 2 like XLM-R


def build_tokenizer(kind: str, max_length: int) -> PreTrainedTokenizerFast:
    kind = TOKENIZER_OF.get(kind, kind)
    pad, unk, start, end = SPECIALS[kind]
    vocab = {token: i for i, token in enumerate([pad, unk, start, end, *WORDS])}
    if kind == "xlmr":  # XLM-R reserves id 1 for padding
        vocab = {token: i for i, token in enumerate([start, pad, end, unk, *WORDS])}
    core = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    if kind == "qwen3":  # last-token pooled: the text ends with the pooled end-of-text token, no start token
        core.post_processor = processors.TemplateProcessing(single=f"$A {end}", special_tokens=[(end, vocab[end])])
    else:
        core.post_processor = processors.TemplateProcessing(
            single=f"{start} $A {end}", special_tokens=[(start, vocab[start]), (end, vocab[end])]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=pad,
        unk_token=unk,
        cls_token=start,
        sep_token=end,
        eos_token=end,
        model_max_length=max_length,
        padding_side="left" if kind == "qwen3" else "right",
    )


def build_model(kind: str, layers: int = 3, max_length: int = 256, initializer_range: float = 0.02):
    """`initializer_range` above the default 0.02 spreads the vectors of different texts apart (at 0.02 a tiny
    XLM-R's [CLS] vectors agree to 1e-6, so its rankings would be decided by rounding)."""
    torch.manual_seed(0)
    vocab = len(WORDS) + 4
    common = {
        "vocab_size": vocab,
        "hidden_size": 32,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "initializer_range": initializer_range,
    }
    if kind == "bert":
        config = BertConfig(**common, max_position_embeddings=max_length, pad_token_id=0)
        return BertModel(config, add_pooling_layer=False)
    if kind == "xlmr":
        config = XLMRobertaConfig(**common, max_position_embeddings=max_length + 2, pad_token_id=1)
        return XLMRobertaModel(config, add_pooling_layer=False)
    if kind == "mpnet":  # positions numbered from the padding index + 1, like XLM-R
        # MPNet computes 32 relative buckets whatever the config says
        config = MPNetConfig(**common, max_position_embeddings=max_length + 2, pad_token_id=1)
        return MPNetModel(config, add_pooling_layer=False)
    if kind == "gte":
        config = GteConfig(**common, max_position_embeddings=max_length, pad_token_id=1)
        return GteModel(config, add_pooling_layer=False)
    config = Qwen3Config(
        **common,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=max_length,
        pad_token_id=0,
        eos_token_id=3,
        bos_token_id=2,
    )
    return Qwen3Model(config)


def save_tiny(kind: str, folder: Path, layers: int = 3, max_length: int = 256, initializer_range: float = 0.02) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    build_model(kind, layers, max_length, initializer_range).save_pretrained(folder)
    build_tokenizer(kind, max_length).save_pretrained(folder)
    return folder


CUSTOM_MODELING = '''"""Custom code of a tiny test model: an XLM-R under a model type transformers does not know."""
from transformers import XLMRobertaConfig, XLMRobertaModel


class TinyCustomConfig(XLMRobertaConfig):
    model_type = "tiny-custom"


class TinyCustomModel(XLMRobertaModel):
    config_class = TinyCustomConfig
'''


def save_custom_code(folder: Path, **options: object) -> Path:
    """A tiny XLM-R whose repository brings its own code (auto_map) under an unknown model type, so transformers
    loads it only with trust_remote_code."""
    save_tiny("xlmr", folder, **options)  # type: ignore[arg-type]
    (folder / "modeling_tiny_custom.py").write_text(CUSTOM_MODELING, encoding="utf-8")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["model_type"] = "tiny-custom"
    config["auto_map"] = {
        "AutoConfig": "modeling_tiny_custom.TinyCustomConfig",
        "AutoModel": "modeling_tiny_custom.TinyCustomModel",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return folder


def random_texts(count: int, low: int, high: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))) for _ in range(count)]


def tiny_tune_options(
    model: Path, data: Path, *, trials: int = 2, heldout: str = "", hm_floor: str = "-90%", bootstrap: int = 20
) -> list[str]:
    """The options of the tests' small `tune` runs: the tiny model (CLS pooling) on a JSONL folder, `heldout` as
    given ("" for none), a floor any tiny model clears, 2 profile passages, a short bootstrap, unpruned and
    unbudgeted: these runs test how processes account for complete trials (pruned ones: tests/test_pruning.py;
    a budget's end: tests/test_budget.py)."""
    return [
        "--model",
        str(model),
        "--pooling",
        "cls",
        "--dataset",
        f"jsonl:{data}",
        "--heldout",
        heldout,
        "--trials",
        str(trials),
        f"--hm-floor={hm_floor}",
        "--profile-docs",
        "2",
        "--bootstrap",
        str(bootstrap),
        "--no-prune",
        "--budget",
        "none",
    ]


PLAIN = "plain"
"""For `load_as`: the model as transformers runs it by default (SDPA where the family supports it, else its own
attention, e.g. MPNet's), with no adapter: what an uncalibrated pass must reproduce."""


def load_as(folder: Path | str, implementation: str, **options: object) -> PreTrainedModel:
    """The model in `folder` under another attention implementation (the oracle's), its attention routed through
    the interface as `load_model` routes it, or `PLAIN`; in eval mode."""
    if implementation == PLAIN:
        return AutoModel.from_pretrained(folder, **options).eval()
    model = AutoModel.from_pretrained(folder, attn_implementation=implementation, **options)
    adapt(model)
    return model.eval()


def export_of(
    loaded: LoadedModel, config: CalibrationConfig | None = None, metrics: dict | None = None
) -> ExportedConfig:
    """A config exported for `loaded` as a study exports one, with placeholder provenance (study "s", trial 0): the
    paper default at basket 8 unless `config` is given."""
    from tuner.engine.exported import build_export

    return build_export(
        loaded,
        config or loaded.default_config(basket_size=8),
        {"tuning": {"hm": 0.5}} if metrics is None else metrics,
        study="s",
        trial=0,
        storage="sqlite://",
        dataset="d",
        dataset_fingerprint="f",
        seed=0,
    )
