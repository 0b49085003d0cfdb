"""Model loading: a registered alias, a hub id or a local folder (`tuner.engine.specs`), ready to calibrate, with
its own sentence-transformers pipeline (`tuner.engine.pipeline`: prompts, and the Dense and Normalize modules after
pooling, `tuner.engine.head`).

Every model is loaded with `attn_implementation="posfair"`, so calibration reaches it through
transformers' attention interface; families whose attention bypasses the interface are routed to it by
an adapter (`tuner.engine.adapters`). A one-text probe at load time checks that every layer reached the
attention function, and refuses a model where one did not, naming its class.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from tuner.calibration import ATTENTION_NAME, calibrating
from tuner.calibration.config import CalibrationConfig, PaddingSide, Pooling
from tuner.engine.adapters import ROUTED, SUPPORTED, adapt
from tuner.engine.head import load_head
from tuner.engine.pipeline import NONE, PIPELINE_FILES, Pipeline
from tuner.engine.specs import ModelSpec, UnsupportedModelError, locate, own_pipeline, resolve_spec

log = logging.getLogger(__name__)

OFFSET_POSITIONS = frozenset({"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "mpnet"})
"""Model types whose position ids start at padding index + 1, so the table holds that many fewer tokens."""


@dataclass
class LoadedModel:
    """A model loaded for calibration, with its tokenizer and the facts from the registry."""

    spec: ModelSpec
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    revision: str
    location: str = ""  # where it loaded from (`locate`): a folder, or a hub id
    pipeline: Pipeline = NONE  # its own prompts and modules (the registry's query prompt over the folder's)
    head: torch.nn.Module | None = field(default=None, repr=False)  # the modules after pooling (`tuner.engine.head`)

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def dimension(self) -> int:
        """The width of its embeddings: the last Dense module's, else the hidden size."""
        return self.pipeline.dimension or int(self.model.config.hidden_size)

    @property
    def query_prompt(self) -> str:
        return self.pipeline.query_prompt

    @property
    def document_prompt(self) -> str:
        return self.pipeline.document_prompt

    def documents(self, texts: list[str]) -> list[str]:
        """Texts as the model reads them as documents: after its document prompt."""
        return [self.document_prompt + text for text in texts] if self.document_prompt else texts

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
    pipeline = model_pipeline(spec, location, revision)  # refuses what posfair cannot apply before the weights load
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
            f"{spec.source} runs custom code from its repository. "
            "Pass --trust-remote-code (trust_remote_code=True) if you trust that code."
        ) from error
    adapt(model)
    model.to(device).eval()
    if pipeline.lower_case:
        _lower_case(tokenizer)
    revision_loaded = _revision_of(spec, model, revision, location)
    head = load_head(pipeline, torch.device(device))
    loaded = LoadedModel(spec, model, tokenizer, revision_loaded, location, pipeline, head)
    _probe_attention(loaded)
    return loaded


def model_pipeline(spec: ModelSpec, location: str | Path, revision: str | None = None) -> Pipeline:
    """The pipeline of the model in `location` (`own_pipeline`); a model loaded from the hub (not from a folder) has
    its sentence-transformers files fetched first. Pooled otherwise than its Pooling module says, it is warned of."""
    folder = Path(location)
    if not folder.is_dir():
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(str(location), revision=revision, allow_patterns=PIPELINE_FILES))
    pipeline = own_pipeline(spec, folder)
    if pipeline.pooling is not None and pipeline.pooling != spec.pooling:
        log.warning(
            "%s pools with %r (%s) but is loaded with %r pooling: its vectors are not its own",
            spec.alias,
            pipeline.pooling,
            pipeline.pooling_source,
            spec.pooling,
        )
    return pipeline


def _lower_case(tokenizer: PreTrainedTokenizerBase) -> None:
    """Lower-case the tokenizer's input as sentence-transformers does for `do_lower_case`: a Lowercase normaliser in
    front of the tokenizer's own, unless it has one."""
    from tokenizers.normalizers import Lowercase
    from tokenizers.normalizers import Sequence as Normalizers

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        problem = "do_lower_case asks to lower-case the input, but its tokenizer has no normaliser to do it with"
        raise UnsupportedModelError(f"{tokenizer.name_or_path}: {problem}; use a fast tokenizer (tokenizer.json)")
    normalizer = backend.normalizer
    own = [normalizer] if normalizer is not None else []
    if isinstance(normalizer, Normalizers):
        own = [*normalizer]  # type: ignore[misc]
    if not any(isinstance(n, Lowercase) for n in own):
        backend.normalizer = Normalizers([Lowercase(), *own])


def default_dtype(device: str) -> torch.dtype:
    """bf16 on a GPU that supports it (half the memory and bandwidth; calibration itself runs in float32),
    float32 elsewhere: CPUs gain nothing from bf16 matmuls here and lose precision."""
    return torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32


def hub_revision(recorded: str) -> str | None:
    """The revision to ask the hub for to load again what `LoadedModel.revision` recorded: the commit or the
    requested revision; None for a package's weights (`package==version`, or `sha256:…` of parts joined) and a local
    folder (`local`)."""
    return None if "==" in recorded or recorded.startswith("sha256:") or recorded == "local" else recorded


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
            f"{loaded.spec.alias}: {type(model).__name__} (model type {model.config.model_type!r}) computes "
            f"attention itself in {loaded.num_layers - len(reached)} of its {loaded.num_layers} layers, "
            "so posfair cannot calibrate it. "
            f"posfair calibrates the model types {', '.join(sorted(SUPPORTED))}: "
            "most through transformers' AttentionInterface, "
            f"and through adapters of their own {', '.join(ROUTED)} (see the models page of the documentation)."
        )
