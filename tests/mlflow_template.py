"""A migrated, empty MLflow SQLite store, copied into each new SQLite store the suite's processes create.

MLflow builds a fresh SQLite store by running its ~60 schema migrations (alembic): 1.7 s on an idle core, and
the suite creates dozens (every `tune` in a fresh folder). `install` runs them once per process tree and
makes MLflow's table initialisation copy the result instead (SQLite's backup API), so a new store is the same
file the migrations would have written: same schema, same `alembic_version`, no rows. A database that already
holds tables (another library's, or a store being created by another process) goes through MLflow's own
migrations, as does every non-SQLite store. Installed by tests/conftest.py and by the fork server
(tests/forkserver.py); `POSFAIR_TEST_FRESH_INTERPRETERS=1` processes and real subprocesses migrate as users do.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

LOCKS_VARIABLE = "POSFAIR_TEST_STORE_LOCKS"  # a folder for the locks of stores being created, not the tests' TMPDIR
_installed: dict[str, Any] = {}


def install(folder: Path) -> None:
    """Build the template in `folder` (kept while the process and the children it forks run; their owner removes
    it) and route MLflow's table initialisation through it."""
    if _installed:
        return
    import sqlalchemy
    from mlflow.store.db import utils
    from mlflow.store.model_registry import sqlalchemy_store as registry_store

    original: Callable[[Any], None] = utils._initialize_tables
    template = folder / "mlflow-template.db"
    locks = Path(os.environ.get(LOCKS_VARIABLE) or folder)  # shared by the suite's processes (tests/conftest.py)
    engine = sqlalchemy.create_engine(f"sqlite:///{template}")
    original(engine)
    engine.dispose()

    def initialize(engine: Any) -> None:
        if engine.dialect.name != "sqlite" or not engine.url.database or engine.url.database == ":memory:":
            original(engine)
            return
        key = hashlib.md5(str(Path(engine.url.database).resolve()).encode(), usedforsecurity=False).hexdigest()
        with open(locks / f"store-{key}.lock", "w") as lock:  # the processes creating one store, one at a time
            fcntl.flock(lock, fcntl.LOCK_EX)
            raw = engine.raw_connection()
            try:
                target = raw.driver_connection
                empty = target.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
                if empty:
                    with sqlite3.connect(template) as source:
                        source.backup(target)
            finally:
                raw.close()
        if not empty:
            original(engine)

    utils._initialize_tables = initialize
    registry_store._initialize_tables = initialize  # imported by name there
    _installed["template"] = template
