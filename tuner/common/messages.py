"""How user input appears in error messages (shortened, so a 50 MB value never floods the terminal), and the mark
of an error that is the user's to fix rather than a bug."""

from __future__ import annotations

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
