"""The study database (Optuna's) and the tracking store (MLflow's) are two databases: each is recognised by its
tables before either tool writes to it, so neither is ever opened as the other. Both tools would otherwise add
their tables to the other's file (both keep their schema version in a table named `alembic_version`, so the
second then fails with a misleading message about versions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tuner.common.files import MLFLOW_DB, OPTUNA_DB, sqlite_file
from tuner.common.recognise import is_journal, is_sqlite

T = TypeVar("T")

DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "oracle")
"""URL schemes of databases (as SQLAlchemy names them, before any `+driver`); a tracking URI may be a server too."""


@dataclass(frozen=True)
class Tool:
    """One tool's database: the tables that mark it, and the option and default that name it."""

    name: str
    kind: str
    tables: tuple[str, ...]
    flag: str
    default: str


OPTUNA = Tool("Optuna", "study database", ("studies", "trials"), "--storage", f"sqlite:///{OPTUNA_DB}")
MLFLOW = Tool("MLflow", "tracking store", ("experiments", "runs"), "--tracking-uri", f"sqlite:///{MLFLOW_DB}")


def is_database(url: str) -> bool:
    scheme, colon, _ = url.partition("://")
    return bool(colon) and scheme.split("+")[0].lower() in DATABASE_SCHEMES


def tables_of(url: str) -> set[str]:
    """The tables of the database at `url`, read without writing anything (`_read`); empty for a SQLite file
    that does not exist yet, or a database that cannot be read now (opening it for real reports why)."""
    import sqlalchemy

    return _read(url, lambda connection: set(sqlalchemy.inspect(connection).get_table_names())) or set()


def schema_version(url: str) -> str | None:
    """The schema revision a tool's migrations (Alembic, for both tools) recorded in the database at `url`; None
    when there is none (or no database yet)."""
    import sqlalchemy

    def version(connection: sqlalchemy.Connection) -> str | None:
        if "alembic_version" not in sqlalchemy.inspect(connection).get_table_names():
            return None
        return connection.execute(sqlalchemy.text("SELECT version_num FROM alembic_version")).scalar()

    return _read(url, version)


def _read(url: str, read: Callable[[Any], T]) -> T | None:
    """`read(connection)` on the database at `url` without writing anything: a SQLite file is opened read-only
    and never created. None when there is no such file, or the database cannot be read now."""
    import sqlalchemy

    path = sqlite_file(url)
    options: dict[str, Any] = {}
    if path is not None:
        if not path.is_file():
            return None
        url = f"sqlite:///file:{path.resolve()}?mode=ro&uri=true"
        # a file another process keeps locked is not read: opening it says so
        options = {"connect_args": {"timeout": 0.2}}
    try:
        engine = sqlalchemy.create_engine(url, **options)
        try:
            with engine.connect() as connection:
                return read(connection)
        finally:
            engine.dispose()
    except Exception:  # noqa: BLE001 - unreachable or not a database: the tool that opens it says so
        return None


def require_own_database(url: str, tool: Tool) -> None:
    """Refuse `url` as `tool`'s database when it holds the other tool's tables, or names a file that is no SQLite
    database (an Optuna journal is said to be one, with the URL that opens it)."""
    if not is_database(url):
        return
    path = sqlite_file(url)
    if path is not None and path.is_file() and path.stat().st_size and not is_sqlite(path):
        journal = is_journal(path)
        fix = (
            f"give it as --storage journal:{path}"
            if journal
            else f"give {tool.name}'s database ({tool.default} by default)"
        )
        raise ValueError(
            f"{tool.flag} {url}: {path} is {'an Optuna journal' if journal else 'a file'}, "
            f"not an SQLite database; {fix}"
        )
    other = MLFLOW if tool is OPTUNA else OPTUNA
    found = [table for table in other.tables if table in tables_of(url)]
    if found:
        raise ValueError(  # "an": both names start with a vowel sound
            f"{tool.flag} {url} is an {other.name} {other.kind} (it holds {other.name}'s tables: "
            f"{', '.join(found)}), not an {tool.name} {tool.kind}; {tool.name} needs a database of its own: "
            f"give {tool.flag} another one (the default is {tool.default}), and this one as {other.flag} "
            "if that is what it is"
        )


def require_apart(storage: str, tracking_uri: str) -> None:
    """Refuse one database as both the study database and the tracking store."""
    same = storage == tracking_uri
    files = sqlite_file(storage), sqlite_file(tracking_uri)
    if files[0] is not None and files[1] is not None:
        same = files[0].resolve() == files[1].resolve()
    if same:
        raise ValueError(
            f"--storage and --tracking-uri name one database ({storage}); Optuna and MLflow each need a database of "
            f"their own, e.g. {OPTUNA.default} and {MLFLOW.default} (the defaults)"
        )
