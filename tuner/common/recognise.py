"""What a file or folder is, told by what it holds rather than by where it lies: the stores of Optuna (an SQLite
database, a journal), of MLflow (a model, a run's or a logged model's artifacts, a file store), an entry of
posfair's cache, and a model's own folder (its weights, or its repository in the Hugging Face cache).

`tuner.common.files` writes into none of them whatever a command is told, with or without --force: another
project's `mlruns/` named by an absolute path, a hard link or a symbolic link is recognised as well as the
current folder's. `tuner.tuning.storage` reads a journal's lines by the same rule.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

SQLITE_HEADER = b"SQLite format 3\x00"
JOURNAL_ENTRY_START = b'{"op_code":'  # how Optuna writes every journal line: compact JSON, the operation first
MARKER_BYTES = 1 << 20  # a marker file (an MLflow meta.yaml, a cache entry's metadata) is kilobytes: read no further
CACHE_METADATA_KEYS = frozenset({"format", "key", "file", "checksum"})  # what `tuner.evaluation.store` writes
CACHE_FOLDER_PEEK = 20  # metadata files looked at to tell a folder of cache entries
RUN_ID = re.compile(r"[0-9a-f]{32}")  # the folder of an MLflow run, which holds its `artifacts/`
LOGGED_MODEL_ID = re.compile(r"m-[0-9a-f]{32}")  # the folder of an MLflow logged model (a registered version's files)
MLFLOW_META_KEYS = ("lifecycle_stage:", "artifact_location:", "artifact_uri:")  # an MLflow file store's meta.yaml
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
SQLITE_SIDECARS = ("-wal", "-shm", "-journal")  # files SQLite keeps beside a database while it writes


@dataclass(frozen=True)
class Kept:
    """A store or a model's folder, which posfair never writes into."""

    path: Path  # the store's own file or folder
    what: str  # as a refusal names it: "an Optuna journal (a study store)"
    noun: str = "a store"  # what posfair never writes over: "a database", "a store", "a model's files"


def kept_at(path: Path) -> Kept | None:
    """The store or model folder that `path` is or lies inside, by what the file and its folders hold (its
    name as written and its target through links; a hard link holds what the file holds); None otherwise."""
    for name in dict.fromkeys((Path(os.path.abspath(path)), Path(os.path.realpath(path)))):
        found = _kept_file(name) or next((kept for folder in name.parents if (kept := _kept_folder(folder))), None)
        if found is None and not name.exists():
            found = _cache_folder(name.parent)
        if found is not None:
            return found
    return None


def _kept_file(path: Path) -> Kept | None:
    if not path.is_file():
        return None
    if is_sqlite(path):
        return Kept(path, "an SQLite database (a study or MLflow store?)", "a database")
    database = next((path.with_name(path.name.removesuffix(s)) for s in SQLITE_SIDECARS if path.name.endswith(s)), None)
    if database is not None and is_sqlite(database):
        return Kept(path, f"a file SQLite keeps beside the database {database}", "a database")
    if is_journal(path):
        return Kept(path, "an Optuna journal (a study store)")
    if _is_cache_metadata(path) or (path.suffix in (".npy", ".bin") and _is_cache_metadata(path.with_suffix(".json"))):
        return Kept(path, "an entry of posfair's cache")
    return None


def _kept_folder(folder: Path) -> Kept | None:
    if (folder / "MLmodel").is_file():
        return Kept(folder, "an MLflow model")
    if folder.name == "artifacts" and RUN_ID.fullmatch(folder.parent.name):
        return Kept(folder, "an MLflow run's artifacts")
    if folder.name == "artifacts" and LOGGED_MODEL_ID.fullmatch(folder.parent.name):
        return Kept(folder, "an MLflow logged model's artifacts")
    meta = _small_text(folder / "meta.yaml")
    if meta is not None and any(line.startswith(MLFLOW_META_KEYS) for line in meta.splitlines()):
        return Kept(folder, "an MLflow file store")
    if (folder / "config.json").is_file() and any((folder / name).is_file() for name in WEIGHT_FILES):
        return Kept(folder, "a model's folder", "a model's files")
    if folder.name.startswith("models--") and ((folder / "snapshots").is_dir() or (folder / "blobs").is_dir()):
        return Kept(folder, "a model's repository in the Hugging Face cache", "a model's files")
    return None


def _cache_folder(folder: Path) -> Kept | None:
    """A folder of posfair's cache entries, for a file not yet there (an entry's files sit side by side)."""
    try:
        peek = list(islice(folder.glob("*.json"), CACHE_FOLDER_PEEK))
    except OSError:
        return None
    return Kept(folder, "a folder of posfair's cache") if any(_is_cache_metadata(p) for p in peek) else None


def _small_text(path: Path) -> str | None:
    try:
        if not path.is_file() or path.stat().st_size > MARKER_BYTES:
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _is_cache_metadata(path: Path) -> bool:
    text = _small_text(path) if path.suffix == ".json" else None
    try:
        data = json.loads(text) if text is not None else None
    except ValueError:
        return False
    return isinstance(data, dict) and CACHE_METADATA_KEYS <= data.keys()


def starts_with(path: Path, header: bytes) -> bool:
    try:
        with path.open("rb") as stream:
            return stream.read(len(header)) == header
    except OSError:  # unreadable: what reads it says why
        return False


def is_sqlite(path: Path) -> bool:
    """Whether `path` is an SQLite database (by its header, whatever its name)."""
    return starts_with(path, SQLITE_HEADER)


def journal_entry(line: bytes) -> bool:
    """Whether `line`, a whole line of a file, is an entry of Optuna's journal: a JSON object with an operation code."""
    try:
        entry = json.loads(line)
    except ValueError:  # not JSON, or not UTF-8
        return False
    return isinstance(entry, dict) and "op_code" in entry


def is_journal(path: Path) -> bool:
    """Whether `path` is an Optuna journal: its first line is an entry, or the start of one still being written."""
    try:
        with path.open("rb") as stream:
            first = stream.readline(MARKER_BYTES)
    except OSError:
        return False
    return journal_entry(first) if first.endswith(b"\n") else first.startswith(JOURNAL_ENTRY_START)
