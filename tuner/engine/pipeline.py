"""A sentence-transformers folder's own pipeline, read from its files: what turns the transformer's last hidden
states into the model's embedding, and the prompts it puts before queries and documents.

- `modules.json` lists the modules in order. posfair applies Transformer (the folder itself), Pooling (cls, mean or
  lasttoken, one mode), then any Dense and Normalize modules, in that order; any other module, a second pooling mode,
  or a setting that changes what a module computes beyond these is refused naming it, never dropped.
- `config_sentence_transformers.json` holds the prompts. The query prompt is `prompts["query"]` and the document
  prompt the first of `document`, `passage`, `corpus`, over the two names sentence-transformers always defines
  (`query`, `document`, empty unless saved): `SentenceTransformer.encode_query` / `encode_document`'s rules.
- `sentence_bert_config.json` may ask for lower-cased input (`do_lower_case`), which the tokenizer then applies.

A folder without `modules.json` is a plain transformers model: no prompts, no modules after the pooling the
user names. Light on purpose (no torch): the command line and an exported config's check read a folder's
pipeline before any heavy import; `tuner.engine.head` builds the modules after pooling.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tuner.common.messages import UserError, shown

if TYPE_CHECKING:
    from tuner.calibration.config import Pooling

ST_POOLING: dict[str, Pooling] = {"cls": "cls", "mean": "mean", "lasttoken": "last"}
"""sentence-transformers' pooling modes that posfair computes, as posfair names them."""
LEGACY_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
"""A Pooling config's older form: one boolean per mode (sentence-transformers reads all of them off as `mean`)."""
DOCUMENT_PROMPT_NAMES = ("document", "passage", "corpus")
DENSE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
SENTENCE_EMBEDDING = "sentence_embedding"
PIPELINE_FILES = [
    "modules.json",
    "config_sentence_transformers.json",
    "sentence_bert_config.json",
    "*/config.json",
    *(f"*/{name}" for name in DENSE_WEIGHTS),
]
"""What `read_pipeline` reads, as `snapshot_download` patterns: for a model fetched from the hub."""
ModuleKind = Literal["Transformer", "Pooling", "Dense", "Normalize"]
KINDS: tuple[ModuleKind, ...] = ("Transformer", "Pooling", "Dense", "Normalize")


class UnsupportedPipelineError(UserError, ValueError):
    """A sentence-transformers folder asks for something posfair does not apply; the message names it."""


@dataclass(frozen=True)
class Dense:
    """One Dense module: `activation(x @ weight.T + bias)`, its weights in `path/weights`."""

    path: str
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a torch.nn module's dotted name, built without arguments as sentence-transformers does
    weights: str


@dataclass(frozen=True)
class Module:
    """One entry of modules.json that posfair applies: its kind, its folder, and for a Dense module its layer."""

    kind: ModuleKind
    path: str
    dense: Dense | None = None


@dataclass(frozen=True)
class Pipeline:
    """What a model folder's own files say of how it embeds (`read_pipeline`); `NONE` for a plain folder."""

    modules: tuple[Module, ...] = ()
    pooling: Pooling | None = None
    pooling_source: str = ""  # the file that names the pooling
    query_prompt: str = ""
    document_prompt: str = ""
    lower_case: bool = False
    folder: Path | None = field(default=None, compare=False)

    @property
    def head(self) -> tuple[Module, ...]:
        """The modules after pooling (Dense, Normalize), in order."""
        return tuple(m for m in self.modules if m.kind in ("Dense", "Normalize"))

    @property
    def normalized(self) -> bool:
        """Whether its last module is a Normalize: its embeddings come out L2-normalised."""
        return bool(self.head) and self.head[-1].kind == "Normalize"

    @property
    def dimension(self) -> int | None:
        """The embedding's width where a Dense module sets it; None: the transformer's hidden size."""
        dense = [m.dense for m in self.head if m.dense is not None]
        return dense[-1].out_features if dense else None

    def changes_vectors(self) -> bool:
        """Whether the pipeline gives other vectors than pooling and L2-normalising alone (posfair's plain path)."""
        return bool(self.query_prompt or self.document_prompt or self.lower_case or any(m.dense for m in self.head))

    def record(self) -> dict[str, object]:
        """The pipeline as an exported config records it: the prompts, and each module with its settings and, for a
        Dense module, the sha256 of its weight file (`weights_digest`)."""
        modules: list[dict[str, object]] = []
        for module in self.modules:
            entry: dict[str, object] = {"type": module.kind, "path": module.path}
            if module.kind == "Pooling":
                entry["mode"] = self.pooling
            if module.dense is not None:
                dense = module.dense
                entry |= {
                    "in_features": dense.in_features,
                    "out_features": dense.out_features,
                    "bias": dense.bias,
                    "activation": dense.activation,
                    "weights": {dense.weights: weights_digest(self.folder, dense)},
                }
            modules.append(entry)
        return {
            "query_prompt": self.query_prompt,
            "document_prompt": self.document_prompt,
            "lower_case": self.lower_case,
            "modules": modules,
        }


NONE = Pipeline()


def weights_digest(folder: Path | None, dense: Dense) -> str:
    """The sha256 of a Dense module's weight file, read in blocks ('' when it is gone)."""
    path = (folder or Path()) / dense.path / dense.weights
    try:
        with path.open("rb") as stream:
            return hashlib.file_digest(stream, "sha256").hexdigest()
    except OSError:
        return ""


def read_pipeline(folder: Path | None) -> Pipeline:
    """The pipeline a model folder's sentence-transformers files describe; `NONE` without modules.json (or folder)."""
    if folder is None or not (folder / "modules.json").is_file():
        return NONE
    entries = _read_json(folder / "modules.json", folder)
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise _refused(folder, f"{folder / 'modules.json'} is not a list of modules")
    modules = [_module(folder, entry) for entry in entries]
    kinds = [m.kind for m in modules]
    if kinds[:2] != ["Transformer", "Pooling"] or any(k not in ("Dense", "Normalize") for k in kinds[2:]):
        raise _refused(
            folder,
            f"its modules run {' → '.join(kinds) or 'nothing'}; posfair applies Transformer → Pooling, then "
            + "Dense and Normalize modules",
        )
    if modules[0].path not in ("", "."):
        raise _refused(folder, f"its Transformer lives in {modules[0].path!r}; posfair loads it from the folder itself")
    pooling_file = folder / modules[1].path / "config.json"
    return Pipeline(
        modules=tuple(modules),
        pooling=_pooling(folder, pooling_file),
        pooling_source=str(pooling_file),
        lower_case=_lower_case(folder),
        folder=folder,
        **_prompts(folder),
    )


def _module(folder: Path, entry: dict) -> Module:
    """One modules.json entry, refused unless it is one of sentence-transformers' own modules that posfair applies."""
    name, path = str(entry.get("type", "")), str(entry.get("path", ""))
    kind = name.rsplit(".", 1)[-1]
    if not name.startswith("sentence_transformers.") or kind not in KINDS:
        raise _refused(
            folder,
            f"its module {shown(name)} ({path or 'the folder'}) is not one posfair applies (Transformer, Pooling, "
            "Dense, Normalize), and its vectors would differ from the model's own",
        )
    if kind == "Dense":
        return Module("Dense", path, _dense(folder, path))
    if kind == "Normalize":
        config = _read_json(folder / path / "config.json", folder) if (folder / path / "config.json").is_file() else {}
        _only_sentence_embedding(folder, path, config)
    return Module(kind, path)


def _pooling(folder: Path, path: Path) -> Pooling:
    """The one pooling mode a Pooling config turns on, as sentence-transformers reads it: `pooling_mode` (a name or
    a list), else the older `pooling_mode_*` booleans, else mean; refused unless one mode posfair computes, over all
    tokens."""
    config = _read_json(path, folder)
    if not isinstance(config, dict):
        raise _refused(folder, f"{path} is not a Pooling config")
    given = config.get("pooling_mode")
    if given is not None:
        modes = [given] if isinstance(given, str) else list(given) if isinstance(given, list) else [shown(given)]
    else:
        modes = [mode for key, mode in LEGACY_MODES.items() if config.get(key)] or ["mean"]
    if len(modes) != 1:
        raise _refused(
            folder,
            f"{path} turns on {len(modes)} pooling modes ({', '.join(map(str, modes))}), whose vectors are joined; "
            "posfair pools by one mode (cls, mean or lasttoken)",
        )
    if modes[0] not in ST_POOLING:
        raise _refused(folder, f"{path} pools by {shown(modes[0])}; posfair pools by cls, mean or lasttoken")
    if config.get("include_prompt", True) is not True:
        left_out = "leaves the prompt out of the pooling (include_prompt: false); posfair pools every token"
        raise _refused(folder, f"{path} {left_out}")
    return ST_POOLING[modes[0]]


def _dense(folder: Path, path: str) -> Dense:
    config = _read_json(folder / path / "config.json", folder)
    if not isinstance(config, dict):
        raise _refused(folder, f"{folder / path / 'config.json'} is not a Dense config")
    _only_sentence_embedding(folder, path, config)
    if config.get("use_residual"):
        raise _refused(folder, f"its Dense module {path} adds a residual connection, which posfair does not apply")
    activation = config.get("activation_function", "torch.nn.modules.activation.Tanh")  # sentence-transformers' default
    if not isinstance(activation, str) or not activation.startswith("torch.nn."):
        foreign = f"activates by {shown(activation)}; posfair applies torch.nn modules only"
        raise _refused(folder, f"its Dense module {path} {foreign}")
    weights = next((name for name in DENSE_WEIGHTS if (folder / path / name).is_file()), None)
    if weights is None:
        raise _refused(folder, f"its Dense module {path} has no weights ({' or '.join(DENSE_WEIGHTS)})")
    try:
        return Dense(
            path,
            int(config["in_features"]),
            int(config["out_features"]),
            bool(config.get("bias", True)),
            activation,
            weights,
        )
    except (KeyError, TypeError, ValueError):
        unread = "does not give in_features and out_features as numbers"
        raise _refused(folder, f"{folder / path / 'config.json'} {unread}") from None


def _only_sentence_embedding(folder: Path, path: str, config: object) -> None:
    """A module that reads or writes anything but the sentence embedding (token embeddings, say) is refused."""
    if not isinstance(config, dict):
        return
    names = {config.get(key) for key in ("module_input_name", "module_output_name")}
    names -= {None, SENTENCE_EMBEDDING}
    if names:
        raise _refused(folder, f"its module {path} works on {', '.join(map(shown, names))}, not the sentence embedding")


def _prompts(folder: Path) -> dict[str, str]:
    """The query and document prompts, as `SentenceTransformer.encode_query` / `encode_document` choose them."""
    path = folder / "config_sentence_transformers.json"
    config = _read_json(path, folder) if path.is_file() else {}
    saved = config.get("prompts") if isinstance(config, dict) else None
    prompts: dict[str, str] = {"query": "", "document": ""}  # sentence-transformers' defaults, kept unless saved
    if isinstance(saved, dict):
        prompts |= {str(name): "" if text is None else text for name, text in saved.items()}
    if not all(isinstance(text, str) for text in prompts.values()):
        raise _refused(folder, f"{path}: its prompts are not all strings")
    document = next(name for name in DOCUMENT_PROMPT_NAMES if name in prompts)
    return {"query_prompt": prompts["query"], "document_prompt": prompts[document]}


def _lower_case(folder: Path) -> bool:
    """sentence_bert_config.json's `do_lower_case`; a transformer task other than feature extraction is refused."""
    path = folder / "sentence_bert_config.json"
    config = _read_json(path, folder) if path.is_file() else {}
    if not isinstance(config, dict):
        raise _refused(folder, f"{path} is not a Transformer config")
    task = config.get("transformer_task", "feature-extraction")
    if task != "feature-extraction":
        raise _refused(folder, f"{path} runs its transformer for {shown(task)}; posfair embeds by feature extraction")
    return bool(config.get("do_lower_case", False))


def _read_json(path: Path, folder: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _refused(folder, f"{path} is missing") from None
    except (OSError, ValueError) as error:
        raise _refused(folder, f"{path} cannot be read as JSON ({error})") from None


def _refused(folder: Path, problem: str) -> UnsupportedPipelineError:
    return UnsupportedPipelineError(
        f"{folder} is a sentence-transformers folder that posfair cannot encode as the model does: {problem}. "
        "Use a model whose modules.json lists Transformer, Pooling (one of cls, mean, lasttoken), Dense and Normalize "
        "only"
    )
