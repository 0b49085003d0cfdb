"""Files posfair writes: where they go by default, and how they are written (whole, or not at all)."""

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


def temporary_beside(path: Path) -> Path:
    """A new empty file in `path`'s folder, hidden and named after it, for writing `path`'s next content."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX, dir=path.parent)
    os.close(handle)
    return Path(temporary)


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """Yield a temporary file beside `path` to write; it replaces `path` when the block completes and is removed
    if the block fails, so a reader sees the whole old file or the whole new one, never a torn one."""
    temporary = temporary_beside(path)
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_atomically(path: Path, data: bytes | str) -> Path:
    """Write `data` (text as UTF-8) to `path` through `replacing`."""
    with replacing(path) as temporary:
        temporary.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path
