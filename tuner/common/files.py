"""Files posfair writes: where they go by default, and the one rule every command writes by.

The rule (`check_output` before any work, `replacing` again at the write itself):

- a file is written whole or not at all, with the user's umask or the mode of the file it replaces;
- an existing file is replaced only if it is posfair's own artefact of the kind being written (`Artefact`: an
  exported config it can read, an `.npy` matrix it can read, ...) or the user passed --force;
- never, even with --force: an input of the command (`Protected`: a dataset's files, the model's folder and
  anything in it, the config read), a store of the run (the study's database or journal, MLflow's database and
  artifacts, the cache), any store or model folder wherever it lies, recognised by what it holds
  (`tuner.common.recognise`: an SQLite database, an Optuna journal, an MLflow model or artifact tree, an entry of
  posfair's cache, a model's weights), a device, a pipe or a socket;
- a symbolic link is written through: its target is replaced and the link kept;
- read-only is read by the mode bits, so it holds for root too (whom `os.access` never refuses).

`tempfile.mkstemp` creates its file 0600 whatever the umask, and renaming keeps that mode, so a plain
atomic write would leave exports that nobody else can read; the mode is set from the umask before the rename.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tuner.common.messages import FULL_DISK_ERRNOS, UserError
from tuner.common.recognise import kept_at

STORE = Path("mlruns")
"""Everything a run keeps by default, under the working folder: Optuna's and MLflow's stores, exports, caches."""
OPTUNA_DB = STORE / "optuna.db"
MLFLOW_DB = STORE / "mlflow.db"
ARTIFACTS = STORE / "artifacts"
EXPORTS = STORE / "exports"
CACHE = STORE / "cache"
CACHE_DIR_ENV = "POSFAIR_CACHE_DIR"
JOURNAL = "journal:"  # --storage journal:PATH, Optuna's journal file
TEMPORARY_SUFFIX = ".tmp"
EXPORT_SCHEMA: Final = "posfair/calibration-config"
"""The `schema` an exported config names (`tuner.engine.exported`): how posfair knows a YAML of its own."""
DIAGNOSIS_SCHEMA: Final = "posfair/diagnosis"
"""The `schema` of `tune diagnose --json` (`tuner.report.diagnose`): how posfair knows that JSON as its own."""
LARGEST_OWN_TEXT = 64 * 2**20  # bytes: posfair's YAML and JSON outputs are kilobytes; a larger file is read no further


class OutputRefusedError(UserError, ValueError):
    """A file posfair was asked to write, which the rule forbids it to create or replace; the message says why
    and what to do."""


def umask() -> int:
    """The process's umask (reading it means setting it, so it is set straight back)."""
    current = os.umask(0o022)
    os.umask(current)
    return current


def default_cache_dir() -> Path:
    """`$POSFAIR_CACHE_DIR`, else `mlruns/cache` under the working directory (next to the study store)."""
    return Path(os.environ.get(CACHE_DIR_ENV) or CACHE)


def sqlite_file(url: str) -> Path | None:
    """The file of a `sqlite:///` URL (Optuna's and MLflow's local stores); None for any other store."""
    return Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None


def storage_file(url: str) -> Path | None:
    """The file that holds a study where it is one on a file system: a SQLite database or a journal
    (`journal:PATH`); None for a database server."""
    for prefix in ("sqlite:///", JOURNAL):
        if url.startswith(prefix) and url.removeprefix(prefix).strip():
            return Path(url.removeprefix(prefix))
    return None


# ---------------------------------------------------------------------------- the kinds posfair writes


@dataclass(frozen=True)
class Artefact:
    """A kind of file posfair writes, and how it recognises one it wrote: the only file it replaces unasked."""

    name: str  # as the refusal names it: "a posfair exported config"
    recognise: Callable[[Path], bool]


def _small_text(path: Path) -> str | None:
    """A file's text, if it is UTF-8 and small enough to be one of posfair's text outputs."""
    try:
        if path.stat().st_size > LARGEST_OWN_TEXT:
            return None
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _is_exported_config(path: Path) -> bool:
    from tuner.common.safe_yaml import YamlError, loads

    text = _small_text(path)
    try:
        data = loads(text, str(path)) if text is not None else None
    except YamlError:
        return False
    return isinstance(data, dict) and data.get("schema") == EXPORT_SCHEMA


def _is_vectors(path: Path) -> bool:
    """An .npy file numpy can read without unpickling anything (what `tune encode` writes)."""
    import numpy as np

    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    try:
        with path.open("rb") as stream:
            reader = readers.get(np.lib.format.read_magic(stream))
            dtype = reader(stream)[2] if reader is not None else None
    except (OSError, ValueError, SyntaxError):
        return False
    return dtype is not None and not dtype.hasobject


def _small_json_object(path: Path) -> dict[str, Any] | None:
    """A small text file's JSON object, or None when it holds no JSON object (the JSON outputs' recognisers)."""
    text = _small_text(path)
    try:
        data = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _is_evaluation_json(path: Path) -> bool:
    data = _small_json_object(path)
    return data is not None and {"model", "dataset", "group_order", "rows"} <= data.keys()


def _is_diagnosis_json(path: Path) -> bool:
    data = _small_json_object(path)
    return data is not None and data.get("schema") == DIAGNOSIS_SCHEMA


def _is_evaluation_markdown(path: Path) -> bool:
    text = _small_text(path)
    lines = text.splitlines()[:3] if text is not None else []
    return len(lines) == 3 and lines[0].startswith("**") and lines[2].startswith("| Indexing method |")


EXPORTED_CONFIG = Artefact("a posfair exported config", _is_exported_config)
VECTORS = Artefact("an .npy matrix", _is_vectors)
EVALUATION_JSON = Artefact("a `tune evaluate --json` file", _is_evaluation_json)
EVALUATION_MARKDOWN = Artefact("a `tune evaluate --markdown` file", _is_evaluation_markdown)
DIAGNOSIS_JSON = Artefact("a `tune diagnose --json` file", _is_diagnosis_json)


# ---------------------------------------------------------------------------- what an output may never be


@dataclass(frozen=True)
class Protected:
    """A file or folder a command reads, or keeps a store in: an output may be neither it nor anything inside it."""

    path: Path
    what: str  # how the user knows it, e.g. "--dataset jsonl:data/victim" or "the study store (--storage)"
    store: bool = False


def stores(storage: str | None, tracking_uri: str | None, cache: Path | None = None) -> list[Protected]:
    """What a study keeps on this machine: the study's database or journal, MLflow's database and its artifacts
    beside it (or a folder store), and the cache of layer inputs. None for `storage` or `tracking_uri`: the default."""
    found = [Protected(cache or default_cache_dir(), "the cache of layer inputs", store=True)]
    study = storage_file(storage) if storage is not None else OPTUNA_DB
    if study is not None:
        found.append(Protected(study, "the study store (--storage)", store=True))
    uri = tracking_uri or f"sqlite:///{MLFLOW_DB}"
    mlflow = sqlite_file(uri)
    if mlflow is not None:
        found += [
            Protected(mlflow, "the MLflow store (--tracking-uri)", store=True),
            Protected(mlflow.parent / ARTIFACTS.name, "MLflow's artifacts", store=True),
        ]
    elif "://" not in uri or uri.startswith("file://"):
        found.append(Protected(Path(uri.removeprefix("file://")), "the MLflow store (--tracking-uri)", store=True))
    return found


def _names(path: Path) -> set[Path]:
    """A path as written (absolute, links kept) and as the file system resolves it (links followed)."""
    return {Path(os.path.abspath(path)), Path(os.path.realpath(path))}


def _within(path: Path, protected: Protected) -> bool:
    """Whether `path` is the protected path or lies inside it, by name or (for a hard link) by inode."""
    if any(p == q or q in p.parents for p in _names(path) for q in _names(protected.path)):
        return True
    try:
        return os.path.samefile(path, protected.path)
    except OSError:
        return False


def read_only(path: Path) -> bool:
    """Whether `path` may not be written: this user lacks the permission, or no one has it (root is never
    refused by `os.access`, so a file no one may write counts as read-only for root too)."""
    return not os.access(path, os.W_OK) or not os.stat(path).st_mode & 0o222


def check_output(
    path: Path, flag: str, kind: Artefact, *, protected: Sequence[Protected] = (), force: bool = False
) -> None:
    """Before any work: may this command write `path` (the module's rule)? Raises `OutputRefusedError` naming why."""
    if path.is_dir():
        raise OutputRefusedError(f"{flag} {path} is a folder; give a file name in it, e.g. {path / 'out'}{path.suffix}")
    _check_folder(path, flag)
    for reason in protected:
        if _within(path, reason):
            where = "is" if any(p == q for p in _names(path) for q in _names(reason.path)) else "is inside"
            role = "a store of this run" if reason.store else "an input of this command"
            raise OutputRefusedError(
                f"{flag} {path} {where} {reason.path} ({reason.what}), {role}; posfair never writes over "
                f"{'a store' if reason.store else 'its inputs'}, even with --force: choose another {flag}"
            )
    check_not_kept(path, flag)
    check_replaceable(path, flag, kind, force=force)


def check_not_kept(path: Path, flag: str = "output") -> None:
    """`path` is no store or model folder, nor inside one, wherever it lies (`tuner.common.recognise`)."""
    kept = kept_at(path)
    if kept is None:
        return
    itself = any(p == Path(os.path.abspath(kept.path)) for p in _names(path))
    where = f"is {kept.what}" if itself else f"is inside {kept.path} ({kept.what})"
    verb = "over" if itself else "into"
    raise OutputRefusedError(
        f"{flag} {path} {where}; posfair never writes {verb} {kept.noun}, even with --force: choose another {flag}"
    )


def _check_folder(path: Path, flag: str) -> None:
    """The folder the file goes into (a link's: its target's) exists and may be written, mode bits included."""
    target = Path(os.path.realpath(path))
    linked = target != Path(os.path.abspath(path))
    folder = target.parent if linked else path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise OutputRefusedError(
            f"{flag} {path}: folder {folder}{' (of the link target)' if linked else ''} does not exist; "
            f"create it or choose another {flag}"
        )
    if read_only(folder) or not os.access(folder, os.X_OK):
        raise OutputRefusedError(f"{flag} {path}: folder {folder} is not writable; choose another {flag}")


def check_replaceable(path: Path, flag: str = "output", kind: Artefact | None = None, *, force: bool = False) -> None:
    """An existing `path` (a link: its target) may be replaced only if it is a regular file, is writable (or
    `force`), and is posfair's own artefact of `kind` (or `force`); what it may never be is `check_not_kept`'s."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        what = (
            "a character device"
            if stat.S_ISCHR(mode)
            else "a block device"
            if stat.S_ISBLK(mode)
            else "a named pipe"
            if stat.S_ISFIFO(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "not a regular file"
        )
        raise OutputRefusedError(
            f"{flag} {path} is {what}, not a file posfair may replace; give the name of a regular file"
        )
    fix = (
        "pass --force to replace it, or choose another name"
        if flag.startswith("--")
        else "make it writable or choose another name"
    )
    if not force and read_only(path):
        raise OutputRefusedError(f"{flag} {path} exists and is read-only; {fix}")
    if not force and kind is not None and not kind.recognise(path):
        raise OutputRefusedError(f"{flag} {path} exists and is not {kind.name} posfair wrote; {fix}")


# ---------------------------------------------------------------------------- writing


class DiskFullError(UserError, OSError):
    """A file could not be written for want of space: said in one line with the file and the fix. Still an
    OSError with the system's number and words, for callers that handle those."""

    def __init__(self, path: Path, error: OSError) -> None:
        OSError.__init__(self, error.errno, error.strerror)
        self.message = (
            f"cannot write {path}: {error.strerror or error}; nothing written (no partial file). "
            "Free space on its disk, or write it elsewhere"
        )

    def __str__(self) -> str:
        return self.message


def temporary_beside(path: Path, suffix: str = TEMPORARY_SUFFIX) -> Path:
    """A new empty file in `path`'s folder, hidden and named after it, for writing `path`'s next content."""
    handle, temporary = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=suffix, dir=path.parent if str(path.parent) else "."
    )
    os.close(handle)
    return Path(temporary)


@contextmanager
def replacing(
    path: Path,
    suffix: str = TEMPORARY_SUFFIX,
    *,
    kind: Artefact | None = None,
    force: bool = False,
    flag: str = "output",
    in_store: bool = False,
) -> Iterator[Path]:
    """Yield a temporary file beside `path` to write; it replaces `path` when the block completes and is removed
    if the block fails, so a reader sees the whole old file or the whole new one; a full disk is a
    `DiskFullError` naming `path`.

    Through a symbolic link the link's target is replaced and the link kept. The new file keeps the mode of the
    file it replaces, or has the umask's; what may be replaced is `check_replaceable`'s and `check_not_kept`'s
    (checked again here: the file may have appeared since the command's first check). `in_store`: a store writes
    a file of its own (the cache its metadata), which is no output of a command."""
    if Path(path).is_dir():
        raise OutputRefusedError(f"{flag} {path} is a folder; give a file name in it")
    _check_folder(path, flag)
    if not in_store:
        check_not_kept(path, flag)
    target = Path(os.path.realpath(path))
    check_replaceable(target, flag, kind, force=force)
    temporary = temporary_beside(target, suffix)
    try:
        yield temporary
        try:
            mode = stat.S_IMODE(os.stat(target).st_mode)
        except FileNotFoundError:
            mode = 0o666 & ~umask()
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError) and not isinstance(error, DiskFullError) and error.errno in FULL_DISK_ERRNOS:
            raise DiskFullError(path, error) from None
        raise


def write_atomically(
    path: Path,
    data: bytes | str,
    *,
    kind: Artefact | None = None,
    force: bool = False,
    flag: str = "output",
    in_store: bool = False,
) -> Path:
    """Write `data` (text as UTF-8) to `path` through `replacing`."""
    with replacing(path, kind=kind, force=force, flag=flag, in_store=in_store) as temporary:
        temporary.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path
