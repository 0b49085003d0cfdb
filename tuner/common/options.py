"""Option defaults and the checks of option values that need no model, store or study.

Standard library only: `tune -h` and every bad-input error are answered from here and `tuner.tuning.settings`
without loading torch, transformers, MLflow or Optuna (tests/test_cli_speed.py checks it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

DEFAULT_TRIALS = 16  # the cap beside the default budget (`DEFAULT_BUDGET`), which ends plain `tune` first (README)
# Passages in each trial's attention profile: a diagnostic, not used by selection; its all-layer observed
# pass cost a third of a trial at 16 passages (py-spy, default run), so 8.
DEFAULT_PROFILE_DOCS = 8
DEFAULT_MAX_DRIFT = 2.0  # a trial may move the document vectors at most twice as far as the paper default does (README "What wins")
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


DEFAULT_CACHE_BYTES = 8 * 2**30
"""`--cache-budget`'s default: bytes of cached layer inputs at most (also capped by free disk space)."""


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


@dataclass(frozen=True)
class Budget:
    """`--budget`: the layer-tokens (padded tokens × layers run) a study may spend, counted as a fresh machine
    spends them (its baselines and queries included, whatever the disk cache holds) and held-out scoring apart:
    a number, or a share of what the paper's grid (`tune --grid paper`) costs on the same model and data, so
    that one spec means the same on any model (`grid/3`: a third of the grid)."""

    layer_tokens: int | None = None
    grid_share: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> Budget | None:
        """'none' → None; 'grid/3', 'grid' → a share of the grid; '5M', '2.5e6', '800k' → layer-tokens."""
        if text is None or text.strip().lower() in ("", "none"):
            return None
        spec = text.strip().lower()
        hint = "write e.g. grid/3 (a third of the paper grid's layer-tokens), 5M (layer-tokens) or none"
        if spec.startswith("grid"):
            divisor = spec[len("grid") :].strip()
            match = re.fullmatch(r"/\s*([0-9.]+(?:e[+-]?[0-9]+)?)", divisor)
            if divisor and match is None:
                raise ValueError(f"--budget {text!r}: {hint}")
            divided = float(match.group(1)) if match else 1.0
            if not (math.isfinite(divided) and divided > 0):
                raise ValueError(f"--budget {text!r}: divide the grid by a positive number; {hint}")
            return cls(grid_share=1 / divided)
        match = re.fullmatch(r"([0-9.]+(?:e[+-]?[0-9]+)?)\s*([kmg]?)", spec)
        try:
            value = float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)] if match else math.nan
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 1):
            raise ValueError(f"--budget {text!r}: {hint}")
        return cls(layer_tokens=int(value))

    def resolve(self, grid_layer_tokens: float) -> int:
        """The study's layer-tokens, given what the paper's grid study costs here."""
        return self.layer_tokens if self.layer_tokens is not None else int(self.grid_share * grid_layer_tokens)  # type: ignore[operator]

    def __str__(self) -> str:
        if self.layer_tokens is not None:
            return f"{self.layer_tokens:,} layer-tokens"
        share = 1 / self.grid_share  # type: ignore[operator]
        return "the paper grid's layer-tokens" if share == 1 else f"1/{share:g} of the paper grid's layer-tokens"


DEFAULT_BUDGET = Budget(grid_share=1 / 3)
"""Plain `tune` spends at most a third of what the paper's grid costs: on MiniLM / WikiPos-dev (seeds 0–4) its
winners matched the grid winner held out as often as 16 unbudgeted trials did (two of five), at half their cost
(README, *The default tuning run*)."""
