"""Why a log to MLflow failed: an outage or a full disk (kept and retried) or a refusal (dropped)."""

from __future__ import annotations

from typing import Literal

from tuner.common.messages import causes, database_locked, disk_full

Failure = Literal["outage", "disk full", "refused"]

_SCHEMA_SIGNS = (
    "no such column",
    "no such table",
    "has no column named",
    "does not exist",
    "doesn't exist",
    "unknown column",
)
_PERMANENT_SIGNS = (*_SCHEMA_SIGNS, "readonly database", "read-only")


def classify_failure(error: BaseException) -> Failure:
    """Whether a failed log is an outage (kept and retried), a full disk (kept too: space may be freed) or a
    refusal (dropped: it would fail the same way at every retry), read along the chain of causes, since MLflow
    wraps what requests and SQLAlchemy raised.

    An outage: a refused or lost connection, a connection cut mid-answer (the request may have been carried
    out: the trial actions look before they create), a timeout, a 5xx answer, a locked database. MLflow's SQL
    store turns every SQLAlchemy OperationalError into "temporarily unavailable" (503), a schema it does not
    know (`no such column`) or a read-only file included, so the error's words decide before its type does.
    """
    import http.client

    import requests
    import sqlalchemy.exc
    import urllib3
    from mlflow.exceptions import MlflowException

    chain = causes(error)
    if disk_full(error):
        return "disk full"
    if database_locked(error):
        return "outage"
    if any(sign in str(e).lower() for e in chain for sign in _PERMANENT_SIGNS):
        return "refused"
    outages = (
        ConnectionError,
        TimeoutError,
        requests.ConnectionError,
        requests.Timeout,
        requests.exceptions.RetryError,
        requests.exceptions.ChunkedEncodingError,
        urllib3.exceptions.ProtocolError,
        http.client.IncompleteRead,
        sqlalchemy.exc.OperationalError,
        sqlalchemy.exc.InterfaceError,
    )
    for seen in chain:
        if isinstance(seen, outages):
            return "outage"
        if isinstance(seen, MlflowException) and seen.get_http_status_code() >= 500:
            return "outage"
        if isinstance(seen, requests.HTTPError) and seen.response is not None and seen.response.status_code >= 500:
            return "outage"
    return "refused"


def full_file(error: BaseException) -> str | None:
    """The file a full disk refused, when the error names it (an artifact's copy does)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.filename:
            return str(seen.filename)
        seen = seen.__cause__ or seen.__context__
    return None
