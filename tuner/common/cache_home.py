"""Where posfair keeps, for every project of this user, what it assembles or fetches once: model folders unpacked
from PyPI packages (`tuner.engine.packaged.model_home`), benchmark files read out of a package, probes built from a
user's retrieval set (`data_home`).

One home, `$XDG_CACHE_HOME/posfair` (else `~/.cache/posfair`), where the XDG base-directory convention puts caches;
each kind has a folder in it and a variable of its own to move it (a cluster's shared disk, a test's tmp folder).
A study's cache of layer inputs is per project and lives elsewhere (`tuner.common.files.default_cache_dir`).
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "POSFAIR_DATA_DIR"


def cache_home() -> Path:
    """$XDG_CACHE_HOME/posfair, else ~/.cache/posfair."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "posfair"


def data_home() -> Path:
    """The benchmark files posfair fetches and the probes it builds: $POSFAIR_DATA_DIR, else `cache_home()`/data."""
    return Path(os.environ[DATA_DIR_ENV]).expanduser() if DATA_DIR_ENV in os.environ else cache_home() / "data"
