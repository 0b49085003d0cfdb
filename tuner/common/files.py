"""Files posfair writes: where they go by default, and how they are written (whole or not at all, with the
user's umask or the mode of the file replaced, never over an input, a device or a read-only file).

`tempfile.mkstemp` creates its file 0600 whatever the umask, and renaming keeps that mode, so a plain
atomic write would leave exports that nobody else can read; the mode is set from the umask before the rename.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tuner.common.messages import FULL_DISK_ERRNOS, UserError

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


def check_writable(path: Path, flag: str, *, inputs: Sequence[Path] = (), force: bool = False) -> None:
    """Before any work: `path` can be created or replaced (see `check_replaceable`): its folder exists and is
    writable, it is not a folder, and it is none of the run's `inputs` (the same file by inode, whatever the name)."""
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a folder; give a file name in it, e.g. {path / 'out'}{path.suffix}")
    if not folder.is_dir():
        raise ValueError(f"{flag} {path}: folder {folder} does not exist; create it or choose another {flag}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: folder {folder} is not writable; choose another {flag}")
    for source in inputs:
        if path.exists() and source.exists() and os.path.samefile(path, source):
            raise ValueError(f"{flag} {path} is the input {source} itself; writing it would destroy the input: choose another {flag}")
    check_replaceable(path, flag, force=force)


def check_replaceable(path: Path, flag: str = "output", *, force: bool = False) -> None:
    """An existing `path` may be replaced only if it is a regular file the user may write (or `force`):
    a device such as /dev/null, a pipe or a socket is never replaced by a file, and a read-only file is
    kept unless the user says otherwise."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        kind = (
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
        raise ValueError(f"{flag} {path} is {kind}, not a file posfair may replace; give the name of a regular file")
    if not force and not os.access(path, os.W_OK):
        raise ValueError(
            f"{flag} {path} exists and is read-only; "
            + ("pass --force to replace it, or choose another name" if flag == "--output" else "make it writable or choose another name")
        )


class DiskFullError(UserError, OSError):
    """A file could not be written for want of space: said in one line with the file and the fix. Still an
    OSError with the system's number and words, for callers that handle those."""

    def __init__(self, path: Path, error: OSError) -> None:
        OSError.__init__(self, error.errno, error.strerror)
        self.message = (
            f"cannot write {path}: {error.strerror or error}; nothing written (no partial file). Free space on its disk, "
            "or write it elsewhere"
        )

    def __str__(self) -> str:
        return self.message


def temporary_beside(path: Path, suffix: str = TEMPORARY_SUFFIX) -> Path:
    """A new empty file in `path`'s folder, hidden and named after it, for writing `path`'s next content."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent if str(path.parent) else ".")
    os.close(handle)
    return Path(temporary)


@contextmanager
def replacing(path: Path, suffix: str = TEMPORARY_SUFFIX, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary file beside `path` to write; it replaces `path` when the block completes and is removed
    if the block fails, so a reader sees the whole old file or the whole new one; a full disk is a
    `DiskFullError` naming `path`.

    The new file keeps the mode of the file it replaces, or has the umask's; only a regular file is ever
    replaced, and a read-only one only with `force` (`check_replaceable`)."""
    check_replaceable(path, force=force)
    temporary = temporary_beside(path, suffix)
    try:
        yield temporary
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except FileNotFoundError:
            mode = 0o666 & ~umask()
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError) and not isinstance(error, DiskFullError) and error.errno in FULL_DISK_ERRNOS:
            raise DiskFullError(path, error) from None
        raise


def write_atomically(path: Path, data: bytes | str, *, force: bool = False) -> Path:
    """Write `data` (text as UTF-8) to `path` through `replacing`."""
    with replacing(path, force=force) as temporary:
        temporary.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path
