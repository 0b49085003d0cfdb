"""`tune run`'s options, each written once in the help panel it belongs to, and the settings they become."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tuner.cli.options import (
    CONSTRAINTS,
    DATA,
    MAX_SEED,
    MODEL,
    OUTPUT,
    RESOURCES,
    SEARCH,
    SELECTION,
    STORES,
    WORKERS,
    BatchSize,
    BatchTokens,
    Force,
    Model,
    OptionsFile,
    PaddingSideOption,
    PoolingOption,
    Storage,
    TrackingUri,
    TrustRemoteCode,
)
from tuner.common.options import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_MAX_DRIFT,
    DEFAULT_MAX_NDCG_DROP,
    DEFAULT_PROFILE_DOCS,
    DEFAULT_TRIALS,
    HEARTBEAT_SECONDS,
    WIKIPOS_TUNING_SET,
    Budget,
    parse_bytes,
    parse_limit,
)

if TYPE_CHECKING:
    from tuner.tuning.search_space import SearchSpace
    from tuner.tuning.settings import TuneSettings


@dataclass(frozen=True)
class RunOptions:
    """Every flag of `tune run` as the command line gives it (the fields are the command's signature: `takes`);
    `settings()` reads the values that need reading and checks them all."""

    model: Model = "minilm"
    pooling: PoolingOption = None
    padding_side: PaddingSideOption = None
    revision: Annotated[str | None, typer.Option(help="Hub revision of the model.", rich_help_panel=MODEL)] = None
    trust_remote_code: TrustRemoteCode = False
    dataset: Annotated[
        str | None,
        typer.Option(
            help="Benchmark to tune on (see `tune evaluate --help`); default: fineweb-posq for bge-m3, "
            f"qwen3-embedding-* and gte-multilingual-base, {WIKIPOS_TUNING_SET} otherwise (WikiPos-dev, its article "
            "titles as queries too).",
            rich_help_panel=DATA,
        ),
    ] = None
    structures: Annotated[
        bool,
        typer.Option(
            help="Score trials on the tuning passages' other structures too (WikiPos: crops, openings, packed; "
            "other sets: their shorter and longer half).",
            rich_help_panel=DATA,
        ),
    ] = True
    heldout: Annotated[
        str | None,
        typer.Option(
            help="Held-out benchmark(s) for the final report, comma-separated; 'auto': WikiPos-test and the WikiPos "
            "transfer sets for WikiPos-dev, squad-test for squad-tune, FineWeb-PosQ's held-out part for "
            "FineWeb-PosQ, none for other sets; 'none' for none.",
            rich_help_panel=DATA,
        ),
    ] = "auto"
    general: Annotated[
        str | None,
        typer.Option(
            help="General-retrieval check, e.g. wikipos-general: its nDCG@10 change is logged every trial; a "
            "constraint only with --max-general-drop.",
            rich_help_panel=DATA,
        ),
    ] = None
    trials: Annotated[
        int,
        typer.Option(
            help="Trials to run, complete or pruned (failed and repeated ones do not count), unless --budget ends the "
            "study first.",
            rich_help_panel=SEARCH,
        ),
    ] = DEFAULT_TRIALS
    budget: Annotated[
        str,
        typer.Option(
            help="Layer-tokens (padded tokens × layers run) the study may spend, baselines included, held-out "
            "scoring apart: 'grid/3' (a third of what the paper's grid costs on this model and data), a number like "
            "5M, or 'none' (--trials alone); --grid paper runs all its configs whatever this says.",
            rich_help_panel=SEARCH,
        ),
    ] = "grid/3"
    sampler: Annotated[
        str,
        typer.Option(
            help="How the search draws trials: 'cost-tpe' (TPE that weighs each config by its cost under --budget), "
            "'tpe' (the same without the cost) or 'gp' (Optuna's GPSampler); all three respect the constraints.",
            rich_help_panel=SEARCH,
        ),
    ] = "cost-tpe"
    space: Annotated[
        Path | None,
        typer.Option(
            help="YAML search space (strength_step, depths, basket_sizes, variants, weight_low/high).",
            rich_help_panel=SEARCH,
        ),
    ] = None
    grid: Annotated[
        str | None,
        typer.Option(help="'paper': run exactly the paper's 24 configs (its grid), unpruned.", rich_help_panel=SEARCH),
    ] = None
    pareto: Annotated[
        bool,
        typer.Option(
            "--pareto", help="Two-objective search (PSI down, HM up); reports the front.", rich_help_panel=SEARCH
        ),
    ] = False
    prune: Annotated[
        bool, typer.Option(help="Stop a trial between structures once it cannot win.", rich_help_panel=SEARCH)
    ] = True
    bisect: Annotated[
        bool,
        typer.Option(
            help="After a trial too strong for its config (it reverses the bias, loses nDCG@10 or is over the drift "
            "limit), try the same config at a weaker λ.",
            rich_help_panel=SEARCH,
        ),
    ] = True
    paper_siblings: Annotated[
        bool,
        typer.Option(
            help="Run the paper's default at its cheaper depths (the last layer, the last 25%) right after it, before "
            "the sampler draws.",
            rich_help_panel=SEARCH,
        ),
    ] = True
    seed: Annotated[
        int,
        typer.Option(
            min=0, max=MAX_SEED, help="Seed of the sampler and the held-out bootstrap.", rich_help_panel=SEARCH
        ),
    ] = 0
    hm_floor: Annotated[
        str,
        typer.Option(
            help="'significant' (the lower end of HM's 95% interval reaches the uncalibrated HM: a gain beyond "
            "noise), 'baseline' (HM at least the uncalibrated HM), a value like 0.52, or relative like -1%.",
            rich_help_panel=CONSTRAINTS,
        ),
    ] = "significant"
    max_ndcg_drop: Annotated[
        str,
        typer.Option(
            help="How far aggregate nDCG@10 may fall below the uncalibrated model's (0–1 scale; 0.005 is half a point, "
            "0 no loss at all): on the tuning split, and significantly on each other tuning structure; 'none' "
            "lifts the constraint.",
            rich_help_panel=CONSTRAINTS,
        ),
    ] = f"{DEFAULT_MAX_NDCG_DROP:g}"
    max_crops_psi: Annotated[
        str,
        typer.Option(
            help="PSI on the tuning passages re-cut shorter (WikiPos sets) may be at most this multiple of the "
            "uncalibrated PSI there, e.g. 1 (no less fair than no calibration); 'none' (the default): not "
            "constrained (the crops are still scored as a structure).",
            rich_help_panel=CONSTRAINTS,
        ),
    ] = "none"
    max_reversal: Annotated[
        str,
        typer.Option(
            help="How far a trial may turn the bias round on a tuning structure (tilt against the uncalibrated "
            "direction, where that direction is beyond noise); 'none' lifts it.",
            rich_help_panel=CONSTRAINTS,
        ),
    ] = "0"
    max_drift: Annotated[
        str,
        typer.Option(
            help="How far a trial may move the document vectors from the uncalibrated ones, as a multiple of the "
            "paper default's drift on the same structure (e.g. 2: twice as far); 'none' lifts it.",
            rich_help_panel=CONSTRAINTS,
        ),
    ] = f"{DEFAULT_MAX_DRIFT:g}"
    max_general_drop: Annotated[
        float | None,
        typer.Option(
            help="Make --general a constraint: its nDCG@10 may fall at most this much below the uncalibrated model's "
            "(0–1 scale, e.g. 0.005).",
            rich_help_panel=CONSTRAINTS,
        ),
    ] = None
    selection: Annotated[
        str,
        typer.Option(
            help="How the winner is named among the feasible trials within one standard error of the lowest PSI: "
            "'one-se' (the mildest), 'one-se-fairest' (the lowest mean PSI over the structures), 'one-se-hm' (the "
            "highest HM); or 'lowest' (the lowest PSI).",
            rich_help_panel=SELECTION,
        ),
    ] = "one-se"
    bootstrap: Annotated[
        int, typer.Option(help="Bootstrap resamples for the held-out intervals.", rich_help_panel=SELECTION)
    ] = 1000
    profile_docs: Annotated[
        int, typer.Option(help="Documents in each trial's attention profile.", rich_help_panel=SELECTION)
    ] = DEFAULT_PROFILE_DOCS
    study_name: Annotated[str | None, typer.Option(help="Default: model--dataset--seedN.", rich_help_panel=STORES)] = (
        None
    )
    storage: Storage = None
    tracking_uri: TrackingUri = None
    output: Annotated[
        Path | None,
        typer.Option(
            help="Where to write the winner's YAML; default mlruns/exports/STUDY.yaml.", rich_help_panel=OUTPUT
        ),
    ] = None
    force: Force = False
    batch_size: BatchSize = None
    batch_tokens: BatchTokens = None
    cache_budget: Annotated[
        str | None,
        typer.Option(
            help="Disk for cached layer inputs (what trials resume from; read into memory while it fits), e.g. 4GB "
            f"or 0 (none); default: {DEFAULT_CACHE_BYTES // 2**30} GiB, less where the disk has less free.",
            rich_help_panel=RESOURCES,
        ),
    ] = None
    workers: Annotated[
        int,
        typer.Option(help="Local worker processes on this study (each loads the model).", rich_help_panel=WORKERS),
    ] = 1
    worker: Annotated[
        bool,
        typer.Option(
            "--worker",
            help="Only run trials of a study another `tune` coordinates (other machines).",
            rich_help_panel=WORKERS,
        ),
    ] = False
    job_array: Annotated[
        bool,
        typer.Option(
            "--job-array",
            help="Run as one task of a job array (sbatch --array, a Kubernetes Indexed Job), every task with the same "
            "command: the first task coordinates, the others run trials as --worker (index from SLURM_ARRAY_TASK_ID "
            "or JOB_COMPLETION_INDEX).",
            rich_help_panel=WORKERS,
        ),
    ] = False
    heartbeat: Annotated[
        int,
        typer.Option(
            help="Seconds between worker heartbeats; a trial silent for 3 of them (on a journal: and for 30 s plus "
            "one) is failed and re-run.",
            rich_help_panel=WORKERS,
        ),
    ] = HEARTBEAT_SECONDS
    options: OptionsFile = None

    def settings(self) -> TuneSettings:
        """The checked settings the study runs with: limits, the budget and sizes read, the job-array task found."""
        from tuner.tuning.settings import TuneSettings, job_array_task

        return TuneSettings(
            model=self.model,
            pooling=self.pooling,
            padding_side=self.padding_side,
            dataset=self.dataset,
            heldout=self.heldout,
            general=self.general,
            max_general_drop=self.max_general_drop,
            trials=self.trials,
            seed=self.seed,
            hm_floor=self.hm_floor,
            max_ndcg_drop=parse_limit(self.max_ndcg_drop, "--max-ndcg-drop", 1, "0.005, half a point of nDCG@10"),
            max_crops_psi=parse_limit(
                self.max_crops_psi, "--max-crops-psi", math.inf, "1, no less fair than uncalibrated"
            ),
            max_reversal=parse_limit(
                self.max_reversal, "--max-reversal", math.inf, "0, the end never favoured where the beginning was"
            ),
            max_drift=parse_limit(self.max_drift, "--max-drift", math.inf, "2, twice as far as the paper default"),
            structures=self.structures,
            prune=self.prune,
            bisect=self.bisect,
            paper_siblings=self.paper_siblings,
            grid=self.grid,
            sampler=self.sampler,
            budget=Budget.parse(self.budget),
            selection=self.selection,
            pareto=self.pareto,
            storage=self.storage,
            study_name=self.study_name,
            tracking_uri=self.tracking_uri,
            output=self.output,
            force=self.force,
            inputs=tuple(path for path in (self.space, self.options) if path is not None),
            batch_size=self.batch_size,
            batch_tokens=self.batch_tokens,
            profile_docs=self.profile_docs,
            bootstrap=self.bootstrap,
            trust_remote_code=self.trust_remote_code,
            revision=self.revision,
            workers=self.workers,
            worker=self.worker,
            array_task=job_array_task(self.job_array, self.worker),
            heartbeat=self.heartbeat,
            cache_budget=parse_bytes(self.cache_budget),
            space=_space_from(self.space),  # type: ignore[arg-type]  # None: TuneSettings makes the default after its checks
        )


def _space_from(path: Path | None) -> SearchSpace | None:
    """The search space of a YAML file; None (no file) lets TuneSettings make the default after its checks. A file
    that is missing or no YAML is said before the search space's heavy imports (Optuna, torch)."""
    if path is None:
        return None
    from tuner.common.safe_yaml import YamlError, load_file

    try:
        load_file(path)
    except YamlError as error:
        raise ValueError(f"--space {error}") from None
    from tuner.tuning.search_space import SearchSpace

    return SearchSpace.from_yaml(path)
