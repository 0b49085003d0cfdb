"""How user input appears in error messages (shortened, so a 50 MB value never floods the terminal), the mark
of an error that is the user's to fix rather than a bug, and how the faults of the machine (a full disk, a
database another process keeps locked) are told from the rest, whatever library wrapped them."""

from __future__ import annotations

import errno
import reprlib

LIMIT = 80

_repr = reprlib.Repr()
_repr.maxstring = LIMIT
_repr.maxother = LIMIT
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 6
_repr.maxlevel = 3


def shown(value: object) -> str:
    """`repr(value)`, cut to about LIMIT characters (long strings keep their ends: `'abc...xyz'`)."""
    return _repr.repr(value)


def first_line(error: BaseException | None) -> str:
    """An error's message to its first line ('' for an empty one, or none): what a one-line report of a
    library's error shows, where the rest is a traceback or a dump of SQL."""
    text = "" if error is None else str(error)
    return text.splitlines()[0] if text.strip() else ""


class UserError(Exception):
    """A failure whose message tells the user what to change (a model to download, a store to start, a worker
    without a coordinator). The CLI prints it as one line `label: message` and exits with `exit_code`; any other
    exception is a bug and keeps its traceback. posfair's errors mix it in beside the built-in class they were."""

    label = "error"
    exit_code = 2


FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""A full disk, a full quota, or a file past the size the system allows: the write fails alike."""
_FULL_SIGNS = ("database or disk is full", "no space left on device", "disk quota exceeded", "could not extend file")
_LOCK_SIGNS = ("database is locked", "database table is locked")


def causes(error: BaseException) -> list[BaseException]:
    """`error` and what it was raised from or while handling, outermost first (libraries wrap what failed)."""
    chain: list[BaseException] = []
    seen: BaseException | None = error
    while seen is not None and all(seen is not known for known in chain):
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def disk_full(error: BaseException) -> bool:
    """Whether a write failed because the disk (or quota) is full: an OSError's number, or a database's words."""
    chain = causes(error)
    return any(isinstance(e, OSError) and e.errno in FULL_DISK_ERRNOS for e in chain) or any(
        sign in str(e).lower() for e in chain for sign in _FULL_SIGNS
    )


def database_locked(error: BaseException) -> bool:
    """Whether a SQLite statement gave up waiting for another connection's lock."""
    return any(sign in str(e).lower() for e in causes(error) for sign in _LOCK_SIGNS)


def root_cause(error: BaseException) -> str:
    """The innermost error's first line: what the system said, without a library's wrapping."""
    return first_line(causes(error)[-1]) or first_line(error)
