"""How user input appears in error messages: shortened, so a 50 MB value never floods the terminal."""

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
