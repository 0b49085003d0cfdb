"""What `tune run` is asked to do: every option, checked before any work starts, and its defaults."""

from __future__ import annotations

import hashlib
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from objectives import RULES, Constraints, HmFloor
from tuner.common.files import EXPORTED_CONFIG, EXPORTS, Protected, check_output, stores
from tuner.common.messages import shown
from tuner.common.options import (
    DEFAULT_BUDGET,
    DEFAULT_CACHE_BYTES,
    DEFAULT_MAX_DRIFT,
    DEFAULT_MAX_NDCG_DROP,
    DEFAULT_PROFILE_DOCS,
    DEFAULT_TRIALS,
    GRID_NAMES,
    HEARTBEAT_SECONDS,
    SAMPLERS,
    SCREEN_QUERIES,
    WIKIPOS_TUNING_SET,
    ArrayTask,
    Budget,
    check_tracking_uri,
)
from tuner.common.stores import MLFLOW, OPTUNA, require_apart, require_own_database
from tuner.data import check_name, dataset_files
from tuner.engine.specs import HUB_ALIASES, REGISTRY, ModelSpec, check_model_name, model_files, resolve_spec

if TYPE_CHECKING:
    from tuner.engine.models import LoadedModel
    from tuner.tuning.search_space import SearchSpace

# Light on purpose: the CLI builds TuneSettings to check the options, so the model registry (torch), the search
# space (Optuna, torch) and the study (Optuna) are imported only once the checks have passed.
EXPERIMENT = "posfair"


@dataclass(frozen=True)
class TuneSettings:
    """Every option of `tune run`; the CLI fills it from flags or an options file."""

    model: str = "minilm"
    pooling: str | None = None  # only for models outside the registry
    padding_side: str | None = None  # None: the registry's, else left for last-token pooling, right otherwise
    dataset: str | None = None  # None: the model's default (`default_dataset`)
    heldout: str | None = "auto"
    general: str | None = None
    max_general_drop: float | None = None
    trials: int = DEFAULT_TRIALS
    seed: int = 0
    hm_floor: str = "significant"
    max_ndcg_drop: float | None = (
        DEFAULT_MAX_NDCG_DROP  # aggregate nDCG@10 may fall this much below the uncalibrated (None: any)
    )
    max_crops_psi: float | None = (
        None  # PSI on the tuning set's crops, as a multiple of the uncalibrated (None: off, the default)
    )
    max_reversal: float | None = (
        0.0  # tilt against the uncalibrated direction on any tuning structure (None: unconstrained)
    )
    max_drift: float | None = (
        DEFAULT_MAX_DRIFT  # drift as a multiple of the paper default's on any structure (None: unconstrained)
    )
    structures: bool = (
        True  # score every trial on the tuning passages' other structures too (`tuner.data.load_structures`)
    )
    prune: bool = True  # stop a trial between rungs once it cannot win (`objectives.robustness.prune_reason`)
    bisect: bool = True  # after an over-correcting trial, try its config weaker (`tuner.tuning.bisection`)
    paper_siblings: bool = (
        True  # queue the paper default at its cheaper depths before the sampler draws (`PAPER_SIBLINGS`)
    )
    screen_queries: int = (
        SCREEN_QUERIES  # per position group in the pooled screen that pruning scores first (`tuner.evaluation.pools`)
    )
    grid: str | None = None  # "paper": run exactly the paper's 24 configs (GridSampler), at full fidelity
    sampler: str = SAMPLERS[0]  # how a single-objective search draws its trials (`tuner.tuning.sampler.make_sampler`)
    budget: Budget | None = DEFAULT_BUDGET  # layer-tokens the study may spend (`Budget`); None: only --trials limits it
    selection: str = "one-se"
    pareto: bool = False
    storage: str | None = None
    study_name: str | None = None
    tracking_uri: str | None = None
    output: Path | None = None
    force: bool = False  # --output may replace a file posfair did not write, or a read-only one (`tuner.common.files`)
    inputs: tuple[Path, ...] = ()  # files the command line read (--space, --options): never written over
    batch_size: int | None = None  # None: chosen from the device's free memory (`encoder.choose_batching`)
    batch_tokens: int | None = None  # None: long-passage models get a token budget from the free memory
    profile_docs: int = DEFAULT_PROFILE_DOCS
    bootstrap: int = 1000
    trust_remote_code: bool = False
    revision: str | None = None
    space: SearchSpace = None  # type: ignore[assignment]  # None: the default SearchSpace(), made after the checks
    cache_budget: int | None = None  # bytes of cached layer inputs (None: `DEFAULT_CACHE_BYTES`; 0: none)
    workers: int = 1
    worker: bool = False  # only run trials of a study another `tune` coordinates
    array_task: ArrayTask | None = None  # a job array's task (`--job-array`): its index decides `worker`
    heartbeat: int = HEARTBEAT_SECONDS
    worker_id: str | None = None  # seeds this process's sampler (`process_identity`)
    dataset_defaulted: bool = field(default=False, init=False)  # whether `dataset` is the model's default

    @property
    def screens(self) -> bool:
        """Whether trials are scored on a pooled screen first: only a single-objective search that prunes."""
        return self.prune and not self.pareto and self.grid is None

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {self.workers}")
        if self.heartbeat < 1:
            raise ValueError(f"--heartbeat must be at least 1 second, got {self.heartbeat}")
        if self.array_task is not None:
            task = self.array_task
            object.__setattr__(self, "worker", not task.coordinates)
            object.__setattr__(
                self, "worker_id", self.worker_id or ("0" if task.coordinates else f"array-{task.index}")
            )
        if self.trials < 1:
            raise ValueError(f"--trials must be at least 1, got {self.trials}")
        if self.screen_queries < 1:
            raise ValueError(f"screen_queries must be at least 1 query per position group, got {self.screen_queries}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.batch_tokens is not None and self.batch_tokens < 1:
            raise ValueError(f"--batch-tokens must be at least 1, got {self.batch_tokens}")
        if self.grid is not None and self.grid not in GRID_NAMES:
            raise ValueError(f"--grid must be one of {', '.join(GRID_NAMES)}, got {self.grid!r}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"--sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        if self.sampler != SAMPLERS[0] and (self.grid is not None or self.pareto):
            raise ValueError(
                f"--sampler {self.sampler} draws a single-objective search; --grid runs fixed configs and --pareto "
                "draws with NSGA-II: drop one of them"
            )
        if self.max_crops_psi is not None and not self.structures:
            raise ValueError("--max-crops-psi reads the crops structure: drop --no-structures")
        if self.max_general_drop is not None and self.general is None:
            raise ValueError("--max-general-drop needs --general (e.g. --general wikipos-general)")
        if self.heldout in ("", "none"):
            object.__setattr__(self, "heldout", None)
        if self.dataset is None:
            object.__setattr__(self, "dataset", default_dataset(self.model))
            object.__setattr__(self, "dataset_defaulted", True)
        check_run_options(self)
        HmFloor.parse(self.hm_floor)  # fail before any work
        self.constraints(0.0)
        if self.selection not in RULES:
            raise ValueError(f"--selection must be one of {', '.join(RULES)}, got {self.selection!r}")
        if self.space is None:
            from tuner.tuning.search_space import SearchSpace

            object.__setattr__(self, "space", SearchSpace())
        if self.grid is not None:
            from tuner.tuning.search_space import GRIDS, grid_size

            self.space.check_grid(GRIDS[self.grid])
            # the baseline, then every config of the grid (the enqueued paper default is one of them: its grid
            # draw repeats it and does not count), each scored on every structure: the yardstick's full cost
            object.__setattr__(self, "trials", 1 + grid_size(GRIDS[self.grid]))
            object.__setattr__(self, "prune", False)
            object.__setattr__(self, "bisect", False)  # the grid's configs and no other
            object.__setattr__(self, "paper_siblings", False)
            object.__setattr__(self, "budget", None)  # the grid's cost is the grid's: every config runs

    def constraints(self, baseline_hm: float) -> Constraints:
        """What a trial must respect, given the uncalibrated HM on the tuning split."""
        floor = HmFloor.parse(self.hm_floor)
        return Constraints(
            floor.resolve(baseline_hm),
            floor.conservative,
            self.max_ndcg_drop,
            self.max_general_drop,
            self.max_crops_psi,
            self.max_reversal,
            self.max_drift,
        )

    def study_name_for(self, model: LoadedModel) -> str:
        return self.study_name_from_alias(model.spec.alias)

    def study_name_from_alias(self, alias: str) -> str:
        """Default: model--dataset--seedN, in characters safe for file names and MLflow filters; a name longer
        than `--study-name` allows (a long dataset path) keeps its start and ends in a digest of the whole, so it
        still fits a file name (mlruns/exports/NAME.yaml) and stays one name per study."""
        if self.study_name:
            return self.study_name
        suffix = ("-pareto" if self.pareto else "") + (f"-grid-{self.grid}" if self.grid else "")
        plain = f"{Path(alias).name}--{self.dataset}--seed{self.seed}{suffix}"
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", plain)
        if len(safe) <= MAX_STUDY_NAME:
            return safe
        digest = hashlib.sha256(plain.encode("utf-8")).hexdigest()[:12]
        return f"{safe[: MAX_STUDY_NAME - len(digest) - 2]}--{digest}"


def settings_in_force(settings: TuneSettings) -> dict[str, object]:
    """The settings as the run will use them: defaults resolved to their values (nothing is created here)."""
    from tuner.tracking.store import default_tracking_uri, describe_store
    from tuner.tuning.storage import default_storage

    values = {k: v for k, v in vars(settings).items() if k not in ("dataset_defaulted", "array_task", "inputs")}
    values["job_array"] = str(settings.array_task) if settings.array_task is not None else "no"
    # the pooling and padding side as TuneSettings checked them
    spec = resolve_spec(settings.model, settings.pooling, settings.padding_side)  # type: ignore[arg-type]
    values["study_name"] = settings.study_name_from_alias(spec.alias)
    values["storage"] = settings.storage or default_storage()
    values["tracking_uri"] = describe_store(settings.tracking_uri or default_tracking_uri())
    values["output"] = settings.output or EXPORTS / f"{values['study_name']}.yaml"
    values["batch_size"] = settings.batch_size or "chosen from the device's free memory"
    values["devices"] = describe_devices(worker_devices(settings.workers))
    values["space"] = describe_space(settings.space)
    if settings.budget is not None:
        values["budget"] = str(settings.budget)
    for name, meaning in UNSET.items():
        if values.get(name) is None:
            values[name] = meaning
    return values


# What an option left unset (None) means, for the settings table: a bare "None" says nothing.
UNSET = {
    "pooling": "the model's own (registry)",
    "padding_side": "the model's own (registry), else left for last-token pooling, right otherwise",
    "heldout": "none: no held-out report",
    "general": "none: no general-retrieval check",
    "max_general_drop": "none: not constrained",
    "max_ndcg_drop": "none: not constrained",
    "max_crops_psi": "none: crops not constrained",
    "max_reversal": "none: a reversed bias allowed",
    "max_drift": "none: the document vectors may move any distance",
    "grid": "none: TPE search",
    "budget": "none: --trials alone ends the study",
    "batch_tokens": "long-passage models: chosen from the device's free memory; others: by batch size",
    "revision": "the local snapshot (or the hub's latest)",
    "cache_budget": f"{DEFAULT_CACHE_BYTES // 2**30} GiB at most (less where the disk has less free)",
}


def describe_space(space: SearchSpace) -> str:
    """The search space in words, e.g. 'λ 0–1 in steps of 0.05; layers last, 25%, 50%; baskets 64, 128; ...'."""
    variants = ", ".join(space.variants) + (
        f" (w {space.weight_low:g}–{space.weight_high:g})" if "cls_hard" in space.variants else ""
    )
    return (
        f"λ 0–1 in steps of {space.strength_step:g}; layers {', '.join(space.depths)}; "
        f"baskets {', '.join(map(str, space.basket_sizes))}; {variants}; basket shares {', '.join(space.basket_shares)}"
    )


def job_array_task(job_array: bool, worker: bool) -> ArrayTask | None:
    """`--job-array`: this process's task, from its environment (None without the flag)."""
    if not job_array:
        return None
    if worker:
        raise ValueError("--job-array gives every task its role itself (the first coordinates); drop --worker")
    return ArrayTask.from_environment(os.environ)


def process_identity(settings: TuneSettings) -> str:
    """Who this process is among the study's processes, which seeds its sampler (`tuner.tuning.study.sampler_seed`):
    "0" coordinates, a job array's task i is "array-i", another worker is host:pid unless given; the local workers a
    process starts are numbered after it (`local_worker_identity`)."""
    return settings.worker_id or ("0" if not settings.worker else f"{socket.gethostname()}:{os.getpid()}")


def local_worker_identity(parent: str, number: int) -> str:
    """The identity of local worker `number` (1, 2, ...) of the process `parent`: 1, 2, ... for the coordinator's,
    "parent/number" for a worker's own, so that no two processes of a study seed their samplers alike."""
    return str(number) if parent == "0" else f"{parent}/{number}"


def worker_devices(workers: int) -> list[str | None]:
    """The GPU of each of `workers` local processes (0: this one, then the workers it starts), round-robin over
    the visible GPUs, as the CUDA_VISIBLE_DEVICES entry that process will see alone: the user's own
    CUDA_VISIBLE_DEVICES is respected (its entries are handed out, in order), as Ray Tune gives each trial its
    GPUs. None for every process where no GPU is visible."""
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        return [None] * workers
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = [entry.strip() for entry in given.split(",")][:count] if given else [str(i) for i in range(count)]
    return [visible[i % count] for i in range(workers)]


def describe_devices(devices: list[str | None]) -> str:
    """The settings table's line: which process computes where."""
    if all(device is None for device in devices):
        return "cpu (no CUDA device visible)"
    if len(devices) == 1:
        return f"GPU {devices[0]}"
    return ", ".join(f"{'coordinator' if i == 0 else f'worker {i}'}: GPU {device}" for i, device in enumerate(devices))


MAX_STUDY_NAME = 200  # with ".yaml", well inside the 255 bytes of a file name
STUDY_NAME = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_STUDY_NAME - 1}}}$")


def check_run_options(settings: TuneSettings) -> None:
    """What `TuneSettings` holds beyond counts and formats: ranges, names and paths, checked before any work."""
    if settings.profile_docs < 1:
        raise ValueError(
            "--profile-docs must be at least 1 (documents in each trial's attention profile), "
            f"got {settings.profile_docs}"
        )
    if settings.bootstrap < 1:
        raise ValueError(f"--bootstrap must be at least 1 resample (1000 is usual), got {settings.bootstrap}")
    if settings.max_general_drop is not None and not 0 <= settings.max_general_drop <= 1:
        raise ValueError(
            "--max-general-drop must be between 0 and 1 (0.005 is half a point of nDCG@10), "
            f"got {settings.max_general_drop}"
        )
    if not 0 <= settings.seed < 2**32:
        raise ValueError(f"--seed must be between 0 and 4294967295, got {settings.seed}")
    if settings.study_name is not None and not STUDY_NAME.match(settings.study_name):
        raise ValueError(
            f"--study-name {shown(settings.study_name)}: use letters, digits, '.', '_' and '-' (up to 200, "
            "not starting with '.' or '-'); the name becomes a file name under mlruns/exports"
        )
    if settings.tracking_uri is not None:
        check_tracking_uri(settings.tracking_uri)
        require_own_database(settings.tracking_uri, MLFLOW)
    if settings.storage is not None:
        require_own_database(settings.storage, OPTUNA)
    require_apart(settings.storage or OPTUNA.default, settings.tracking_uri or MLFLOW.default)
    spec = check_model_name(
        settings.model,
        settings.pooling,  # type: ignore[arg-type]
        settings.padding_side,  # type: ignore[arg-type]
        settings.revision,
    )
    for flag, name in benchmark_names(settings):
        check_name(name, flag)
    if settings.output is not None:
        check_output(
            settings.output, "--output", EXPORTED_CONFIG, protected=run_inputs(settings, spec), force=settings.force
        )


def benchmark_names(settings: TuneSettings) -> list[tuple[str, str]]:
    """(flag, name) of every benchmark the run reads: --dataset, each --heldout set, --general."""
    heldout = (
        [] if settings.heldout in (None, "auto") else [h.strip() for h in settings.heldout.split(",") if h.strip()]
    )
    names = [("--dataset", settings.dataset), *(("--heldout", h) for h in heldout), ("--general", settings.general)]
    return [(flag, name) for flag, name in names if name]


def run_inputs(settings: TuneSettings, spec: ModelSpec) -> list[Protected]:
    """What a run reads and keeps, which its --output may never replace (`tuner.common.files.check_output`)."""
    read = [Protected(model_files(spec), f"--model {settings.model}")]
    read += [
        Protected(path, f"{flag} {name}") for flag, name in benchmark_names(settings) for path in dataset_files(name)
    ]
    read += [Protected(path, "an options or --space file") for path in settings.inputs]
    return read + stores(settings.storage, settings.tracking_uri)


def default_dataset(model: str) -> str:
    """FineWeb-PosQ for the registry's long-passage models (as the paper tunes them), else WikiPos-dev with its
    titles as queries too (`WIKIPOS_TUNING_SET`)."""
    spec = REGISTRY.get(HUB_ALIASES.get(model, model))
    return "fineweb-posq" if spec is not None and spec.long_passages else WIKIPOS_TUNING_SET


def dataset_reason(settings: TuneSettings) -> str:
    """Why the study tunes on `settings.dataset`, for the settings table."""
    if not settings.dataset_defaulted:
        return "given with --dataset"
    if settings.dataset == "fineweb-posq":
        return (
            f"default for {settings.model}, a long-passage model: FineWeb-PosQ's web passages of 500-1,024 words, "
            "as the paper tunes; the authors' sampling (1,000 questions per position group, seed 42), tuned on "
            f"half the passages, reported on the other half. Offline alternative: --dataset {WIKIPOS_TUNING_SET}"
        )
    return (
        "default: WikiPos-dev, embedded in posfair (passages of <= 512 tokens), each passage asked for by its "
        "summaries' descriptions and their article titles; reported on WikiPos-test"
    )
