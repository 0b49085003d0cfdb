"""Texts → L2-normalised vectors, documents calibrated, queries never.

The interface follows sentence-transformers: `encode_document` / `encode` for what gets indexed,
`encode_query` for what searches it, with its keywords (batch_size, show_progress_bar, prompt,
normalize_embeddings, convert_to_numpy / convert_to_tensor) and one string or a list of them.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Never, Protocol, TypedDict, TypeVar, Unpack, cast, overload

import numpy as np
import torch
from tqdm.auto import tqdm

from tuner.calibration import AttentionObserver, CalibrationConfig, ConfigError, ResolvedCalibration, calibrating
from tuner.calibration.mean_pooling import SharedSums
from tuner.engine.batching import Batches, BatchScope, can_change, choose_batching, to_device, too_short
from tuner.engine.models import LoadedModel, load_model

if TYPE_CHECKING:
    from tuner.engine.exported import ExportedConfig

# What `encode` returns: an array (the default, typed so by `Encode`), one tensor (convert_to_tensor) or a list of
# 1-D tensors.
Embeddings = np.ndarray | torch.Tensor | list[torch.Tensor]
Observer = TypeVar("Observer", contravariant=True)


class EncodeOptions(TypedDict, total=False):
    """The keywords `encode_query` and `encode_document` share, named as sentence-transformers' encode methods name
    them."""

    batch_size: int | None
    """Texts per forward pass (default: chosen from the device's free memory)."""
    show_progress_bar: bool | None
    """Show a progress bar (default: on a terminal, when there is more than one batch)."""
    convert_to_numpy: bool
    """Return a float32 NumPy array (default: True)."""
    convert_to_tensor: bool
    """Return a torch tensor instead (default: False); with neither conversion, a list of 1-D tensors."""
    normalize_embeddings: bool
    """L2-normalise the vectors (default: True, as they are compared by dot product); False returns the embeddings
    as the model's own modules leave them (pooled, then its Dense and Normalize modules, if any)."""
    batch_tokens: int | None
    """At most this many padded tokens per forward pass, for long passages (default: none; for a long-passage
    model, chosen from the device's free memory)."""


class Encode(Protocol[Observer]):
    """`encode_query` and `encode_document` as their callers see them: an array unless a tensor or a list of
    tensors is asked for. `Observer` is what `observer` takes: `Never` for queries, which take none."""

    @overload
    def __call__(
        self,
        sentences: str | Sequence[str],
        prompt: str | None = ...,
        *,
        batch_size: int | None = ...,
        show_progress_bar: bool | None = ...,
        convert_to_numpy: Literal[True] = ...,
        convert_to_tensor: Literal[False] = ...,
        normalize_embeddings: bool = ...,
        batch_tokens: int | None = ...,
        observer: Observer = ...,
    ) -> np.ndarray: ...

    @overload
    def __call__(
        self,
        sentences: str | Sequence[str],
        prompt: str | None = ...,
        *,
        observer: Observer = ...,
        **options: Unpack[EncodeOptions],
    ) -> Embeddings: ...


def _typed_for_queries(method: Callable[..., Embeddings]) -> Encode[Never]:
    """`method` unchanged; its callers see it as `Encode` without an observer."""
    return cast("Encode[Never]", method)


def _typed_for_documents(method: Callable[..., Embeddings]) -> Encode[AttentionObserver | None]:
    """`method` unchanged; its callers see it as `Encode`."""
    return cast("Encode[AttentionObserver | None]", method)


class ShortDocumentsWarning(UserWarning):
    """Some documents are shorter than one basket, so calibration leaves them as the plain model encodes them."""


class CalibratedEncoder:
    """Encode documents with a calibration config applied, and queries without it.

    Queries are never calibrated, so an index of calibrated documents is searched with the model's own query
    vectors. After each encode call, `truncated` counts the texts cut at the model's maximum length,
    `layer_tokens` what the call ran (padded tokens × layers) and `too_short` the documents left as the plain
    model encodes them because their content fills no basket.

    Args:
        model: The loaded model (`tuner.engine.models.load_model`); `from_yaml` loads the one a config names.
        config: The calibration documents get; None encodes them as the plain model does.

    Raises:
        ConfigError: `config` calibrates another pooling than the model's, or its baskets are longer than the
            model reads (no passage could fill one, so nothing would be calibrated).

    Example:
        ```python
        encoder = CalibratedEncoder.from_yaml("mlruns/exports/minilm--wikipos-dev_titles--seed0.yaml")
        passages = encoder.encode_document(["The first passage to index.", "The second one."])
        question = encoder.encode_query("Which passage answers this?")
        scores = passages @ question  # unit vectors: cosine similarities
        ```
    """

    def __init__(self, model: LoadedModel, config: CalibrationConfig | None = None) -> None:
        if config is not None and config.pooling != model.spec.pooling:
            raise ConfigError(
                f"pooling: the config calibrates {config.pooling!r} pooling but {model.spec.alias} pools with "
                f"{model.spec.pooling!r}; set pooling: {model.spec.pooling}"
            )
        if config is not None and config.basket_size > model.max_length:
            raise ConfigError(
                f"basket_size: {config.basket_size} is more than the {model.max_length} tokens {model.spec.alias} "
                "reads, so no passage could fill a basket and nothing would be calibrated; "
                f"use at most {model.max_length}"
            )
        self.model = model
        self.config = config
        self.spec = config.resolve(model.num_layers) if config is not None else None
        self.truncated = 0  # documents cut at the model's maximum length in the last encode call
        self.layer_tokens = 0  # padded tokens × layers the last encode call ran (`Batches.layer_tokens`)
        self.too_short = (
            0  # documents of the last calibrated encode call whose content fills no basket: left uncalibrated
        )
        self._warned_short = False  # `encode_document` says so once per encoder

    @classmethod
    def from_yaml(
        cls, path: str | Path, *, allow_model_mismatch: bool = False, **load_options: object
    ) -> CalibratedEncoder:
        """Load an exported config and the model it was made for.

        The config is validated against its schema (`load_exported`), checked against the model's files before the
        model loads (`check_model_files`: pooling, padding, weights) and against the loaded model after.

        Args:
            path: The exported YAML file (written by `tune` or `tune export`).
            allow_model_mismatch: Use a config that does not fit the model's files, warning once per difference,
                instead of refusing it.
            **load_options: Passed to `tuner.engine.models.load_model`, e.g. `device="cuda:1"`,
                `dtype=torch.float32` or `trust_remote_code=True`.

        Returns:
            An encoder of the config's model with the config's calibration.

        Raises:
            ExportError: The file cannot be read, is no valid config, or does not fit the model it names.
            ModelUnavailableError: The model is neither on this machine nor reachable from it.
        """
        from tuner.engine.exported import check_model_files, load_exported

        exported = load_exported(path)
        check_model_files(exported, path, allow_mismatch=allow_model_mismatch)
        return cls.from_exported(exported, **load_options)

    @classmethod
    def from_exported(cls, exported: ExportedConfig, **load_options: object) -> CalibratedEncoder:
        """The model an exported config (already checked: `from_yaml`) was made for, with its calibration."""
        model = load_model(
            exported.model.name,
            revision=exported.model.load_revision(),
            pooling=exported.model.pooling,
            padding_side=exported.model.padding_side,
            **load_options,  # type: ignore[arg-type]
        )
        exported.check_model(model)
        return cls(model, exported.calibration)

    @_typed_for_queries
    def encode_query(
        self,
        sentences: str | Sequence[str],
        prompt: str | None = None,
        **options: Unpack[EncodeOptions],
    ) -> Embeddings:
        """Encode queries, never calibrated.

        Args:
            sentences: One text (→ one vector) or a list of texts (→ one row each, in order).
            prompt: Prepended to every query (default: the model's query prompt: its sentence-transformers `query`
                prompt, or the registry's, e.g. Qwen3-Embedding's instruction).
            **options: `EncodeOptions`: sentence-transformers' keywords, as `encode_document` takes them.

        Returns:
            One vector for one text, else one row per text, as `encode_document` returns them.

        Raises:
            TypeError: `sentences` is neither a string nor a list of strings.
            ValueError: `batch_size` or `batch_tokens` is below 1.
        """
        prompt = self.model.query_prompt if prompt is None else prompt
        return self._encode(sentences, prompt, calibrate=False, **options)

    @_typed_for_documents
    def encode_document(
        self,
        sentences: str | Sequence[str],
        prompt: str | None = None,
        *,
        observer: AttentionObserver | None = None,
        **options: Unpack[EncodeOptions],
    ) -> Embeddings:
        """Encode documents, calibrated with this encoder's config (plain if it has none).

        A document whose content fills no basket is left uncalibrated (its vector is the plain model's); the first
        call that meets one warns (`ShortDocumentsWarning`), once per encoder, and `too_short` counts them per call.

        Args:
            sentences: One text (→ one vector) or a list of texts (→ one row each, in order).
            prompt: Prepended to every text (default: the model's document prompt, as sentence-transformers'
                `encode_document` picks it; none for most models).
            observer: Sees each calibrated layer's attention of the pooled row before and after calibration
                (`tuner.calibration.AttentionObserver`), e.g. for an attention profile.
            **options: `EncodeOptions`: sentence-transformers' keywords (`batch_size`, `show_progress_bar`,
                `convert_to_numpy`, `convert_to_tensor`, `normalize_embeddings`) and `batch_tokens`.

        Returns:
            One float32 vector for one text, else one row per text in order: a NumPy array, a torch tensor with
            `convert_to_tensor`, a list of 1-D tensors with neither conversion.

        Raises:
            TypeError: `sentences` is neither a string nor a list of strings.
            ValueError: `batch_size` or `batch_tokens` is below 1.
        """
        prompt = self.model.document_prompt if prompt is None else prompt
        vectors = self._encode(sentences, prompt, calibrate=True, observer=observer, **options)
        if self.too_short and self.config is not None and self.config.strength > 0 and not self._warned_short:
            self._warned_short = True
            count = 1 if isinstance(sentences, str) else len(sentences)
            warnings.warn(
                f"{self.too_short} of {count} documents are shorter than one basket ({self.config.basket_size} "
                "tokens of content), left uncalibrated (said once per encoder; `too_short` counts them per call)",
                ShortDocumentsWarning,
                stacklevel=2,
            )
        return vectors

    encode = encode_document
    """`encode_document` under sentence-transformers' plain name: what `encode` is given is a document."""

    def _encode(
        self,
        sentences: str | Sequence[str],
        prompt: str,
        *,
        calibrate: bool,
        observer: AttentionObserver | None = None,
        **options: Unpack[EncodeOptions],
    ) -> Embeddings:
        """The one encode path, with `EncodeOptions`' defaults."""
        single = isinstance(sentences, str)
        given = [sentences] if single else list(sentences)
        if not all(isinstance(t, str) for t in given):
            raise TypeError("encode takes a string or a list of strings")
        texts = [prompt + t for t in given]  # type: ignore[operator]
        batching = choose_batching(self.model, options.get("batch_size"), options.get("batch_tokens"))
        batches = Batches.build(self.model, texts, *batching)
        self.truncated = batches.truncated
        ran: list[int] = []
        self.too_short = too_short(batches, self.spec) if calibrate and self.spec is not None else 0
        vectors = forward(
            self.model,
            batches,
            self.spec if calibrate else None,
            observer=observer,
            show_progress=options.get("show_progress_bar"),
            normalize=options.get("normalize_embeddings", True),
            ran=ran,
        )
        self.layer_tokens = batches.layer_tokens(ran, self.model.num_layers)
        result = vectors[0] if single else vectors
        if options.get("convert_to_tensor", False):
            return torch.from_numpy(result)
        if not options.get("convert_to_numpy", True):
            return list(torch.from_numpy(vectors)) if not single else torch.from_numpy(result)
        return result


def forward(
    model: LoadedModel,
    batches: Batches,
    spec: ResolvedCalibration | None = None,
    *,
    observer: AttentionObserver | None = None,
    first_layer: Callable[[int], SharedSums] | None = None,
    baseline: np.ndarray | None = None,
    around: BatchScope | None = None,
    show_progress: bool | None = None,
    normalize: bool = True,
    ran: list[int] | None = None,
) -> np.ndarray:
    """The one forward loop: float32 embeddings of every text of `batches`, in text order: pooled, through the
    model's modules after pooling (its Dense and Normalize, `LoadedModel.head`), L2-normalised.

    Plain encoding, calibrated encoding and trial resumption all run here, so their vectors agree bit for bit.

    spec         the calibration (None: plain forward); `observer` sees its attention
    first_layer  batch index → where the engine finds and leaves that batch's first-layer sums (mean pooling)
    baseline     the uncalibrated vectors, in text order: a batch that `spec` cannot change (no passage in it
                 fills a basket) is copied from them instead of encoded
    around       batch index → a context held open around that batch's forward (`tuner.engine.prefix`: resume from
                 cached layer inputs, or record them)
    normalize    False: the embeddings as the model's modules leave them (`normalize_embeddings=False`)
    ran          receives the index of every batch encoded (not copied): what the pass cost, with `Batches.layer_tokens`
    """
    vectors = np.empty((batches.count, model.dimension), dtype=np.float32)
    show = show_progress if show_progress is not None else sys.stderr.isatty() and len(batches) > 1
    with torch.inference_mode():
        for i in tqdm(range(len(batches)), desc="encode", disable=not show, unit="batch"):
            rows = batches.rows[i]
            if baseline is not None and not can_change(spec, batches.inputs[i]["attention_mask"]):
                vectors[rows] = baseline[rows]
                continue
            if ran is not None:
                ran.append(i)
            batch = {k: to_device(v, model.device) for k, v in batches.inputs[i].items()}
            with ExitStack() as scope:
                if spec is not None:
                    scope.enter_context(
                        calibrating(spec, observer, first_layer(i) if first_layer is not None else None)
                    )
                if around is not None:
                    scope.enter_context(around(i))
                hidden = model.model(**batch).last_hidden_state
            embedded = _pool(hidden, batch["attention_mask"], model.spec.pooling)
            if model.head is not None:
                embedded = model.head(embedded)
            if normalize and not model.pipeline.normalized:  # once: bit for bit as the model's own Normalize
                embedded = torch.nn.functional.normalize(embedded, dim=-1)
            vectors[rows] = embedded.cpu().numpy()
    return vectors


def _pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """In float32: cls: first real token; last: final real token (left or right padding); mean: over real tokens."""
    mask = mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device)
    if pooling == "mean":
        weights = mask[..., None].to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp_min(1)
    else:
        pick = (
            torch.where(mask, positions, -1).amax(-1)
            if pooling == "last"
            else torch.where(mask, positions, mask.shape[1]).amin(-1)
        )
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), pick]
    return pooled.float()
