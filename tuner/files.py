"""Files the user keeps (exports, encoded vectors): written whole or not at all, with the user's umask.

`tempfile.mkstemp` creates its file 0600 whatever the umask, and renaming keeps that mode, so a plain
atomic write would leave exports that nobody else can read; the mode is set from the umask before the rename.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


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


def write_atomically(path: Path, write: Callable[[Path], None], suffix: str = "") -> Path:
    """`write(temporary)` into the target folder, then rename over `path`: nothing partial on any failure."""
    folder = path.parent if str(path.parent) else Path(".")
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=folder)
    os.close(handle)
    try:
        write(Path(temporary))
        os.chmod(temporary, 0o666 & ~umask())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
