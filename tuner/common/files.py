"""Files posfair writes: where they go by default, and how they are written (whole or not at all, with the
user's umask).

`tempfile.mkstemp` creates its file 0600 whatever the umask, and renaming keeps that mode, so a plain
atomic write would leave exports that nobody else can read; the mode is set from the umask before the rename.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STORE = Path("mlruns")
"""Everything a run keeps by default, under the working folder: Optuna's and MLflow's stores, exports, caches."""
OPTUNA_DB = STORE / "optuna.db"
MLFLOW_DB = STORE / "mlflow.db"
ARTIFACTS = STORE / "artifacts"
EXPORTS = STORE / "exports"
CACHE = STORE / "cache"
TEMPORARY_SUFFIX = ".tmp"


def umask() -> int:
    """The process's umask (reading it means setting it, so it is set straight back)."""
    current = os.umask(0o022)
    os.umask(current)
    return current


def check_writable(path: Path, flag: str) -> None:
    """Before any work: `path` can be created (its folder exists and is writable) and is not a folder."""
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a folder; give a file name in it, e.g. {path / 'out'}{path.suffix}")
    if not folder.is_dir():
        raise ValueError(f"{flag} {path}: folder {folder} does not exist; create it or choose another {flag}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: folder {folder} is not writable; choose another {flag}")


def temporary_beside(path: Path, suffix: str = TEMPORARY_SUFFIX) -> Path:
    """A new empty file in `path`'s folder, hidden and named after it, for writing `path`'s next content."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent if str(path.parent) else ".")
    os.close(handle)
    return Path(temporary)


@contextmanager
def replacing(path: Path, suffix: str = TEMPORARY_SUFFIX) -> Iterator[Path]:
    """Yield a temporary file beside `path` to write; it replaces `path` (with the umask's mode) when the block
    completes and is removed if the block fails, so a reader sees the whole old file or the whole new one."""
    temporary = temporary_beside(path, suffix)
    try:
        yield temporary
        os.chmod(temporary, 0o666 & ~umask())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_atomically(path: Path, data: bytes | str) -> Path:
    """Write `data` (text as UTF-8) to `path` through `replacing`."""
    with replacing(path) as temporary:
        temporary.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path
