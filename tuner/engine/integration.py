"""sentence-transformers users: load a `SentenceTransformer` that indexes with an exported config.

    from tuner.engine.integration import load_sentence_transformer
    model = load_sentence_transformer("best.yaml")   # was: SentenceTransformer("all-MiniLM-L6-v2")
    doc_vectors = model.encode(documents)            # calibrated (so is encode_document)
    query_vectors = model.encode_query(queries)      # never calibrated

The model is loaded with the "posfair" attention function; calibration is switched on around every
encode call except those for queries. A sentence-transformers folder brings its own modules and prompts, as
`SentenceTransformer(folder)` loads them (the exported config checked them first); a plain transformers folder gets
posfair's: the config's pooling, then L2 normalisation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Normalize, Transformer
from sentence_transformers.sentence_transformer.modules import Pooling
from transformers import PreTrainedModel

from tuner.calibration import ATTENTION_NAME, ResolvedCalibration, calibrating
from tuner.engine.exported import ExportError, check_model_files, load_exported
from tuner.engine.pipeline import ST_POOLING
from tuner.engine.specs import locate, resolve_spec

ST_MODES = {pooling: mode for mode, pooling in ST_POOLING.items()}
"""posfair's poolings as sentence-transformers' Pooling names them."""


class CalibratedSentenceTransformer(SentenceTransformer):
    """A SentenceTransformer whose document encodings are calibrated; query encodings are not."""

    posfair_spec: ResolvedCalibration

    def encode(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("task") == "query":
            return super().encode(*args, **kwargs)
        with calibrating(self.posfair_spec):
            return super().encode(*args, **kwargs)


def load_sentence_transformer(
    config: str | Path, *, allow_model_mismatch: bool = False, **options: Any
) -> CalibratedSentenceTransformer:
    """Load the model an exported config was made for, as a calibrated SentenceTransformer.

    Its `encode` and `encode_document` calibrate; `encode_query` (and `encode(..., task="query")`) does not. The
    config is checked against the model's files before the model loads (`check_model_files`: pooling, padding,
    weights). A plain transformers folder is pooled as the config says and L2-normalised, as posfair's
    encoder does.

    Args:
        config: The exported YAML file (written by `tune` or `tune export`).
        allow_model_mismatch: Use a config that does not fit the model's files, warning once per difference,
            instead of refusing it.
        **options: Passed to `SentenceTransformer`, e.g. `device="cuda:1"`; posfair's attention implementation is
            added to any `model_kwargs` given.

    Returns:
        The model as a `SentenceTransformer` whose document encodings are calibrated.

    Raises:
        ExportError: The file cannot be read, is no valid config, or does not fit the model (its files, or its
            depth once loaded).
        ModelUnavailableError: The model is neither on this machine nor reachable from it.
    """
    exported = load_exported(config)
    check_model_files(exported, config, allow_mismatch=allow_model_mismatch)
    spec = resolve_spec(exported.model.name, exported.model.pooling, exported.model.padding_side)
    model_kwargs = {**options.pop("model_kwargs", {}), "attn_implementation": ATTENTION_NAME}
    revision = exported.model.load_revision()
    location = locate(spec, revision)
    if spec.query_prompt:  # the registry's, as posfair's encoder uses it
        options["prompts"] = {"query": spec.query_prompt, **options.get("prompts", {})}
    if Path(location).is_dir() and not (Path(location) / "modules.json").is_file():
        padding = {"padding_side": spec.padding_side}
        transformer = Transformer(location, model_kwargs=model_kwargs, processor_kwargs=padding)
        pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode=ST_MODES[spec.pooling])
        model = CalibratedSentenceTransformer(modules=[transformer, pooling, Normalize()], **options)
    else:
        model = CalibratedSentenceTransformer(location, revision=revision, model_kwargs=model_kwargs, **options)
    encoder = model[0].auto_model
    if not isinstance(encoder, PreTrainedModel):
        raise ExportError(f"{spec.alias}: the SentenceTransformer's first module holds no transformers model")
    layers = encoder.config.num_hidden_layers
    if layers != exported.model.num_layers:
        raise ExportError(f"model.num_layers: config says {exported.model.num_layers}, model has {layers}")
    model.max_seq_length = exported.model.max_length  # calibration matters most for long passages
    model.posfair_spec = exported.calibration.resolve(layers)
    return model
