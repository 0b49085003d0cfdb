"""Option defaults and the checks of option values that need no model, store or study.

Standard library only: `tune -h` and every bad-input error are answered from here and `tuner.tuning.settings`
without loading torch, transformers, MLflow or Optuna (tests/test_cli_speed.py checks it).
"""

from __future__ import annotations

import math

DEFAULT_TRIALS = 16  # plain `tune` (MiniLM on WikiPos-dev): 6–9 min on 2 idle CPU cores, measured (README)
# Passages in each trial's attention profile: a diagnostic, not used by selection; its all-layer observed
# pass cost a third of a trial at 16 passages (py-spy, default run), so 8.
DEFAULT_PROFILE_DOCS = 8
HEARTBEAT_SECONDS = 20  # a trial whose worker is silent for 3 heartbeats is failed and re-queued
GRID_NAMES = ("paper",)  # `tune --grid`: the configs of `tuner.tuning.search_space.GRIDS`
SCREEN_QUERIES = 48  # queries per position group (and stratum) in the pooled screen (`tuner.evaluation.pools`)
TRACKING_SCHEMES = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")


def check_tracking_uri(uri: str) -> None:
    """A tracking URI MLflow can use: a folder, or one of `TRACKING_SCHEMES` (with a driver, e.g. postgresql+psycopg)."""
    scheme, colon, _ = uri.partition("://")
    if colon and scheme.split("+")[0].lower() not in TRACKING_SCHEMES:
        raise ValueError(
            f"--tracking-uri {uri[:80]!r}: MLflow cannot use a {scheme[:20]!r} store; use e.g. http://127.0.0.1:5000, "
            "sqlite:///mlruns/mlflow.db, postgresql://user:pass@host/db or a folder"
        )


def parse_limit(text: str, flag: str, upper: float, example: str) -> float | None:
    """A constraint's limit: a number in [0, upper], or 'none' → None (the constraint is lifted)."""
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{flag} {text!r}: write a number such as {example}, or none to lift the constraint") from None
    if not (math.isfinite(value) and 0 <= value <= upper):
        raise ValueError(f"{flag} must be a number from 0 to {upper:g} (e.g. {example}), got {text!r}")
    return value


def parse_bytes(text: str | None) -> int | None:
    """'4GB', '512MiB', '0' → bytes; None stays None (the default budget)."""
    if text is None:
        return None
    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
    number = text.strip().lower().rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text.strip().lower()[len(number) :]
    try:
        value = float(number) * units[unit]
    except (ValueError, KeyError):
        raise ValueError(f"--cache-budget {text!r}: write a size like 4GB, 512MiB or 0") from None
    if value < 0:
        raise ValueError(f"--cache-budget must not be negative, got {text!r}")
    return int(value)
