"""Option defaults and the checks of option values that need no model, store or study.

Standard library only: `tune -h` and every bad-input error are answered from here and `tuner.tuning.settings`
without loading torch, transformers, MLflow or Optuna (tests/test_cli_speed.py checks it).
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tuner.common.recognise import is_journal

# the cap beside the default budget (`DEFAULT_BUDGET`), which ends plain `tune` first (docs/search.md)
DEFAULT_TRIALS = 16
# Passages in each trial's attention profile: a diagnostic, not used by selection, whose observed pass runs through
# every layer and so weighs on every trial: a few passages are enough.
DEFAULT_PROFILE_DOCS = 8
# a trial may move the document vectors at most twice as far as the paper default does (docs/concepts.md)
DEFAULT_MAX_DRIFT = 2.0
# The tuning set of the models that are not tuned on FineWeb-PosQ: WikiPos-dev with the article titles as queries
# too, twice the position-labelled queries over the same passages, so a trial's PSI is sharp enough that the data,
# not the tie-break, chooses the winner (docs/search.md, "How sharply a study tells configs apart").
WIKIPOS_TUNING_SET = "wikipos-dev+titles"
# Aggregate nDCG@10 may fall half a point below the uncalibrated model's: a non-inferiority margin, because on a
# sharp tuning set "no loss beyond noise" also rejects losses too small to matter, and with them every config at the
# paper's strength (docs/search.md, "The studies' own noise, and the rules held out").
DEFAULT_MAX_NDCG_DROP = 0.005
HEARTBEAT_SECONDS = 20  # a trial whose worker is silent for 3 heartbeats is failed and re-queued
GRID_NAMES = ("paper",)  # `tune --grid`: the configs of `tuner.tuning.search_space.GRIDS`
SAMPLERS = ("cost-tpe", "tpe", "gp")  # `tune --sampler` (`tuner.tuning.sampler.make_sampler`); the first is the default
SCREEN_QUERIES = 48  # queries per position group (and stratum) in the pooled screen (`tuner.evaluation.pools`)
Pooling = Literal["cls", "last", "mean"]
"""`--pooling`: how a model outside the registry pools its vectors (`tuner.calibration.config.Pooling`'s values)."""
PaddingSide = Literal["left", "right"]
"""`--padding-side`: where its tokenizer pads (`tuner.calibration.config.PaddingSide`'s values)."""
Scoring = Literal["posfair", "posir"]
"""`tune evaluate --scoring`: posfair's tables (thirds within strata, HM, PSI), or PosIR's own figures."""
TRACKING_SCHEMES = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")


def check_tracking_uri(uri: str) -> None:
    """A tracking URI MLflow can use: a folder, or one of `TRACKING_SCHEMES` (with a driver, e.g. postgresql+psycopg);
    never an Optuna journal, however named (`journal:PATH`, `sqlite:///PATH`, the path)."""
    scheme, colon, _ = uri.partition("://")
    journal = Path(uri.removeprefix("journal:")) if uri.startswith("journal:") else None
    if journal is None and (not colon or scheme == "sqlite"):
        named = Path(uri.removeprefix("sqlite:///"))
        journal = named if named.is_file() and is_journal(named) else None
    if journal is not None:
        raise ValueError(
            f"--tracking-uri {uri[:80]!r}: {journal} is an Optuna journal (a study store), which MLflow cannot read; "
            f"browse the study with `optuna-dashboard {journal}` (pip install optuna-dashboard), and its runs in the "
            "MLflow store it logged to (tune ui's default: sqlite:///mlruns/mlflow.db)"
        )
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
    units = {
        "": 1,
        "b": 1,
        "kb": 10**3,
        "mb": 10**6,
        "gb": 10**9,
        "tb": 10**12,
        "kib": 2**10,
        "mib": 2**20,
        "gib": 2**30,
        "tib": 2**40,
    }
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
"""Plain `tune` spends at most a third of what the paper's grid costs (docs/search.md, *The budget*)."""


@dataclass(frozen=True)
class EvaluateRequest:
    """Every option of `tune evaluate`, parsed (`inline`: each --calibration as given and as field values)."""

    model: str = "minilm"
    pooling: Pooling | None = None
    padding_side: PaddingSide | None = None
    trust_remote_code: bool = False
    allow_model_mismatch: bool = False  # use a config whose pooling, padding or weights differ from the model's
    dataset: str = "wikipos-test"
    configs: tuple[Path, ...] = ()
    inline: tuple[tuple[str, dict[str, object]], ...] = ()
    paper_default: bool = True
    sea: bool = True
    general: str | None = "wikipos-general"
    shuffled: bool = True
    bootstrap: int = 1000
    seed: int = 0
    batch_size: int | None = None
    scoring: Scoring = "posfair"
    posir_instruction: bool | None = None  # None: with PosIR's scoring, as PosIR's evaluation does

    @property
    def instruction(self) -> bool:
        """Whether queries get PosIR's instruction: as asked, else exactly when PosIR's figures are made."""
        return self.scoring == "posir" if self.posir_instruction is None else self.posir_instruction

    def check(self) -> None:
        """Option combinations that cannot work, refused before anything loads."""
        if self.instruction and self.scoring != "posir":
            raise ValueError("--posir-instruction prefixes the queries of PosIR's own scoring: add --scoring posir")
        if self.scoring == "posir" and self.shuffled and not self.general:
            raise ValueError(
                "--scoring posir runs the shuffled-sentence check on the --general set only: "
                "give --general SET, or --no-shuffled"
            )


@dataclass(frozen=True)
class DiagnoseRequest:
    """Every option of `tune diagnose`: the model as `tune evaluate` loads it, the dataset, the bootstrap."""

    model: str = "minilm"
    pooling: Pooling | None = None
    padding_side: PaddingSide | None = None
    trust_remote_code: bool = False
    dataset: str = "wikipos-dev"
    bootstrap: int = 1000
    seed: int = 0
    batch_size: int | None = None
    batch_tokens: int | None = None


@dataclass(frozen=True)
class ArrayTask:
    """This process's task in a scheduler's job array (`tune run --job-array`): the first task coordinates the
    study, every other one runs its trials (as `--worker`)."""

    index: int  # counted from the array's first task, 0
    source: str  # where it was read, e.g. "SLURM_ARRAY_TASK_ID=4, first 1"

    @property
    def coordinates(self) -> bool:
        return self.index == 0

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> ArrayTask:
        """Kubernetes' JOB_COMPLETION_INDEX (an Indexed Job's pods are 0, 1, ...), else Slurm's SLURM_ARRAY_TASK_ID
        counted from SLURM_ARRAY_TASK_MIN (`sbatch --array=1-4` starts at 1)."""
        if "JOB_COMPLETION_INDEX" in environ:
            return cls(
                _array_index(environ, "JOB_COMPLETION_INDEX"), f"JOB_COMPLETION_INDEX={environ['JOB_COMPLETION_INDEX']}"
            )
        if "SLURM_ARRAY_TASK_ID" in environ:
            task = _array_index(environ, "SLURM_ARRAY_TASK_ID")
            first = _array_index(environ, "SLURM_ARRAY_TASK_MIN") if "SLURM_ARRAY_TASK_MIN" in environ else 0
            if task < first:
                raise ValueError(f"--job-array: SLURM_ARRAY_TASK_ID={task} is below SLURM_ARRAY_TASK_MIN={first}")
            return cls(task - first, f"SLURM_ARRAY_TASK_ID={task}, first {first}")
        raise ValueError(
            "--job-array: no job array index in the environment (SLURM_ARRAY_TASK_ID from sbatch --array, or "
            "JOB_COMPLETION_INDEX from a Kubernetes Indexed Job); start tune as a task of such a job, or drop "
            "--job-array and start one process without --worker and the others with it"
        )

    def __str__(self) -> str:
        role = "coordinates the study" if self.coordinates else "runs trials (as --worker)"
        return f"task {self.index} of the array ({self.source}): {role}"


def _array_index(environ: Mapping[str, str], variable: str) -> int:
    text = environ[variable].strip()
    if not text.isdigit():
        raise ValueError(f"--job-array: {variable}={text[:40]!r} is not a task index (a whole number from 0)")
    return int(text)


def env_seconds(variable: str, default: float, least: float = 0.0) -> float:
    """Seconds from the environment variable `variable` (at least `least`), else `default`: a setting a scheduler's
    script sets for every process. A value that is not a number is said in the log, and `default` used."""
    text = os.environ.get(variable, "")
    try:
        return max(least, float(text)) if text else default
    except ValueError:
        logging.getLogger(__name__).warning("%s=%r is not a number of seconds; using %g", variable, text, default)
        return default
