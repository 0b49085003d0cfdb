"""The suite's MLflow store template (tests/mlflow_template.py) makes the store MLflow's migrations make."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlalchemy
from mlflow.store.db import utils
from mlflow.tracking import MlflowClient


def schema(path: Path) -> tuple[dict[str, list[str]], list[tuple[str]]]:
    """Every table's and index's definition, a sorted list of its lines (MLflow's own batch migrations write a
    table's constraints in varying order), and the schema revision."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall()
        tables = {name: sorted(line.strip().rstrip(",") for line in sql.splitlines()) for name, sql in rows}
        return tables, db.execute("SELECT version_num FROM alembic_version").fetchall()


def test_a_store_copied_from_the_template_is_the_store_the_migrations_make(tmp_path: Path) -> None:
    assert utils._initialize_tables.__module__ == "tests.mlflow_template"  # installed by tests/conftest.py
    migrated = tmp_path / "migrated.db"
    engine = sqlalchemy.create_engine(f"sqlite:///{migrated}")  # what MLflow's own _initialize_tables runs:
    utils.InitialBase.metadata.create_all(engine)
    utils._upgrade_db(engine)
    engine.dispose()
    client = MlflowClient(f"sqlite:///{tmp_path / 'copied.db'}")
    experiment = client.create_experiment("e")
    client.create_run(experiment)
    assert schema(tmp_path / "copied.db") == schema(migrated)
