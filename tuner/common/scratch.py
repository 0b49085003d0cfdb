"""Temporary folders that name their owner, so the next start can remove those of killed processes.

A SIGKILLed `tune` runs no cleanup; its folder in the system temp directory is named
`posfair-<pid>-...`, and `clean_orphans` removes every such folder of this user whose process is gone.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

_OWNED = re.compile(r"^posfair-(?:[a-z-]+-)?(\d+)-")


def scratch_dir(kind: str = "") -> Path:
    """A new private temporary folder `posfair-[kind-]<pid>-XXXX`."""
    return Path(tempfile.mkdtemp(prefix=f"posfair-{kind + '-' if kind else ''}{os.getpid()}-"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def clean_orphans(root: Path | None = None) -> int:
    """Remove this user's `posfair-<pid>-*` folders whose process no longer runs; returns how many."""
    root = Path(root or tempfile.gettempdir())
    removed = 0
    try:
        entries = list(root.iterdir())
    except OSError:
        return 0
    for entry in entries:
        match = _OWNED.match(entry.name)
        if not match or int(match.group(1)) == os.getpid():
            continue
        try:
            if not entry.is_dir() or entry.is_symlink() or entry.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if not _alive(int(match.group(1))):
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    if removed:
        log.info("removed %d temporary folder(s) left by killed posfair processes in %s", removed, root)
    return removed
