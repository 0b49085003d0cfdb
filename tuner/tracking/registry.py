"""The winner as an MLflow model: a pyfunc that wraps `CalibratedEncoder`, registered and aliased.

`mlflow.pyfunc.load_model("models:/posfair-minilm@champion").predict(texts)` returns calibrated,
L2-normalised document vectors (float32, one row per text; no text, no row); `params={"kind": "query"}`
returns query vectors (never calibrated, with the model's query prompt). `mlflow models serve -m
models:/posfair-minilm@champion` serves the same over REST (POST /invocations
`{"inputs": [...], "params": {"kind": "query"}}`). The model artifact holds the exported YAML; the
encoder weights are loaded as the YAML says (the registry alias, hub revision or folder), exactly as
`CalibratedEncoder.from_yaml` does, so the serving machine needs the base model as `tune encode` does.

Texts come as a string, a list (or array, Series) of strings, a DataFrame or a dict (`{"text": [...]}`, what
REST's `inputs` object, `dataframe_split` and `dataframe_records` become): a frame or dict is read by its
`text` column, or its only one, and refused otherwise. The signature declares the `kind` parameter and the
output but no input schema: MLflow checks a declared input schema before the model sees its input, and
neither form of one fits: an unnamed column is filled from a frame's first column whatever its name (`other`
before `text` would be embedded), and a named `text` column refuses a plain list.
"""

from __future__ import annotations

import logging
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import numpy as np

from tuner.tracking.runs import Tracker

log = logging.getLogger(__name__)

CHAMPION = "champion"
KINDS = ("document", "query")
TRUST_REMOTE_CODE = "trust_remote_code"  # the model_config key: the model runs its own code, as its study allowed
USAGE = (
    "predict(texts): a list of strings, or a frame or dict with a `text` column; params.kind 'document' (the default: "
    "calibrated) or 'query' (never calibrated); returns L2-normalised float32 vectors, one row per text."
)
"""What the pyfunc takes and returns, for the registered version's description: its signature declares no input
schema (see above), so the page says it here and shows it in the input example (texts with params.kind)."""


def registered_name(model_alias: str) -> str:
    """`posfair-<alias>` in characters the registry and URIs accept: minilm → posfair-minilm."""
    return "posfair-" + re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model_alias).name).strip("-").lower()


class CalibratedEncoderModel:
    """The pyfunc model: texts → document vectors (or, with params kind=query, query vectors).

    A plain pyfunc flavour (`loader_module`): the model folder holds only the YAML and MLflow's files,
    nothing pickled, so loading runs no stored code, but for the model's own code where its study allowed that
    (`trust_remote_code` in the MLmodel's model_config, which a caller's `model_config` overrides)."""

    def __init__(self, yaml_path: str, trust_remote_code: bool = False) -> None:
        from tuner.engine.encoder import CalibratedEncoder

        if trust_remote_code:
            log.info(
                "%s: the model runs its own code from its repository, as its study allowed (--trust-remote-code)",
                yaml_path,
            )
        self.encoder = CalibratedEncoder.from_yaml(yaml_path, trust_remote_code=trust_remote_code)

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> np.ndarray:
        kind = (params or {}).get("kind", "document")
        if kind not in KINDS:
            raise ValueError(f"params.kind must be 'document' or 'query', got {kind!r}")
        texts = _texts(model_input)
        method = self.encoder.encode_query if kind == "query" else self.encoder.encode_document
        return method(texts, show_progress_bar=False)


def _load_pyfunc(data_path: str, model_config: dict[str, Any] | None = None) -> CalibratedEncoderModel:
    """MLflow's entry point for `loader_module="tuner.tracking.registry"`: `data_path` is the YAML inside the model,
    `model_config` what `save_pyfunc` recorded (over what the caller of `mlflow.pyfunc.load_model` gave)."""
    return CalibratedEncoderModel(data_path, trust_remote_code=bool((model_config or {}).get(TRUST_REMOTE_CODE)))


def _texts(model_input: Any) -> list[str]:
    """The texts, one output row each: a string, a list, array (0-d too) or Series of strings, or the `text` column (or
    only column) of a DataFrame or dict, as MLflow passes them. Anything but a string (None, a number) is refused
    with its index: embedding its repr would return a vector for the word "None"."""
    if isinstance(model_input, dict) or hasattr(model_input, "columns"):
        columns = list(model_input.keys() if isinstance(model_input, dict) else model_input.columns)
        if "text" in columns:
            model_input = model_input["text"]
        elif len(columns) == 1:
            model_input = model_input[columns[0]]
        else:
            raise ValueError(f"input columns {columns}: give one column, or one named 'text'")
    if getattr(model_input, "ndim", None) == 0:  # a 0-d array (np.array("text")): its one element
        model_input = [model_input.item()]
    if isinstance(model_input, str):
        return [model_input]
    texts = list(model_input)
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            got = (
                "None"
                if text is None
                else f"{'an' if type(text).__name__[0] in 'aeiou' else 'a'} {type(text).__name__} ({text!r:.40})"
            )
            raise ValueError(f'input {index} is {got}, not a string; pass texts only ("" for an empty one)')
    return [str(text) for text in texts]


@dataclass(frozen=True)
class Registered:
    name: str
    version: int
    model_id: str

    @property
    def uri(self) -> str:
        return f"models:/{self.name}@{CHAMPION}"


def reserve_version(
    tracker: Tracker, model_alias: str, run_id: str, description: str, tags: dict[str, str]
) -> Registered:
    """Create the logged model and its registry version first, so the YAML it carries can name the version."""
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    client, name = tracker.client, registered_name(model_alias)
    logged = client.create_logged_model(
        tracker.experiment_id, name=name, source_run_id=run_id, tags=tags, model_type="embedding"
    )
    with _use_tracking_uri(tracker.store_uri):  # the registry looks the logged model up through the global tracking URI
        if not client.search_registered_models(f"name = '{name}'"):
            client.create_registered_model(
                name,
                description=f"posfair's calibrated {model_alias} encoder: documents calibrated, "
                "queries plain (params.kind).",
            )
        version = client.create_model_version(
            name,
            source=f"models:/{logged.model_id}",
            run_id=run_id,
            model_id=logged.model_id,
            tags=tags,
            description=description,
        )
    return Registered(name, int(version.version), logged.model_id)


def withdraw(tracker: Tracker, registered: Registered) -> None:
    """Remove a reserved version whose YAML could not be written (and its registered model, left without
    versions): the registry never holds a version without its export."""
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    client = tracker.client
    with _use_tracking_uri(tracker.store_uri):
        client.delete_model_version(registered.name, str(registered.version))
        if not client.search_model_versions(f"name = '{registered.name}'"):
            client.delete_registered_model(registered.name)
    client.delete_logged_model(registered.model_id)


def publish(
    tracker: Tracker, registered: Registered, yaml_path: Path, dimension: int, trust_remote_code: bool = False
) -> None:
    """Write the pyfunc model (YAML artifact, signature) into the reserved version and make it the champion."""
    with tempfile.TemporaryDirectory(prefix="posfair-model-") as folder:
        save_pyfunc(Path(folder) / "model", yaml_path, dimension, trust_remote_code)
        tracker.client.log_model_artifacts(registered.model_id, str(Path(folder) / "model"))
    tracker.client.finalize_logged_model(registered.model_id, "READY")
    tracker.client.set_registered_model_alias(registered.name, CHAMPION, str(registered.version))
    log.info(
        "registered %s version %d as %s (load: mlflow.pyfunc.load_model(%r))",
        registered.name,
        registered.version,
        CHAMPION,
        registered.uri,
    )


def save_pyfunc(folder: Path, yaml_path: Path, dimension: int, trust_remote_code: bool = False) -> None:
    """The pyfunc model in `folder`: the YAML, the signature, an input example (texts, with `params.kind`) and the
    requirements; for a model that runs its own code (`trust_remote_code`, as its study allowed), that permission
    as its model_config."""
    from mlflow.models import ModelSignature
    from mlflow.types import ParamSchema, ParamSpec, Schema, TensorSpec

    example = ["A passage to index.", "Another passage."]
    signature = ModelSignature(  # no input schema: see the module's docstring
        outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, dimension))]),
        params=ParamSchema([ParamSpec("kind", "string", "document")]),
    )
    mlflow.pyfunc.save_model(
        folder,
        loader_module=__name__,
        data_path=str(yaml_path),
        signature=signature,
        input_example=(example, {"kind": "document"}),
        pip_requirements=_requirements(),
        model_config={TRUST_REMOTE_CODE: True} if trust_remote_code else None,
    )


def _requirements() -> list[str]:
    from tuner import __version__

    return [f"posfair=={__version__}", f"mlflow=={mlflow.__version__}"]
