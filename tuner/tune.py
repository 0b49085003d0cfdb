"""The tuning run end to end: baseline, study, winner, held-out check, export, MLflow parent run.

This module wires the pieces; each piece (evaluation, study, objective, tracking, export) does its
own job and is usable alone.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import multiprocessing.process
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import optuna
from optuna.trial import TrialState
from tqdm.auto import tqdm

from objectives import RULES, Constraints, HmFloor, PairedBootstrap, PositionReport, Selection, paired_bootstrap
from tuner.calibration import CalibrationConfig
from tuner.cost import StudyCost, padded_tokens, probe
from tuner.data import DatasetUnavailableError, PositionalDataset, load_benchmark, require_position_groups
from tuner.data import check_available as check_benchmark
from tuner.data.wikipos import TRANSFER_SPLITS
from tuner.evaluation import Evaluation, Evaluator
from tuner.export import build_export, write_exported
from tuner.files import check_writable
from tuner.models import (
    REGISTRY, LoadedModel, ModelUnavailableError, check_consent, hub_revision, load_model, locate, resolve_spec,
)
from tuner.messages import shown
from tuner.objective import GeneralCheck, TrialObjective
from tuner.plots import optuna_figures, pareto_scatter
from tuner.prefix import prefix_layers_for
from tuner.scratch import clean_orphans, scratch_dir
from tuner.search_space import BASELINE_PARAMS, PAPER_DEFAULT_PARAMS, SearchSpace, is_reference_trial, trial_basket_shares
from tuner.study import (
    HEARTBEAT_SECONDS,
    TrialsEnd,
    complete_trials,
    default_storage,
    enqueue_once,
    make_storage,
    open_study,
    pareto_front,
    run_trials,
    winner,
)
from tuner.tracking import Tracker, check_tracking_uri
from tuner.visible import within_reach

log = logging.getLogger(__name__)

DEFAULT_TRIALS = 16  # plain `tune` (MiniLM on WikiPos-dev): at most 8.4 min on 2 CPU cores, measured (README)
EXPERIMENT = "posfair"
FLOOR_ATTR = "floor_value"


class NoFeasibleTrialError(RuntimeError):
    """No complete trial satisfied the constraints: nothing is exported."""


@dataclass(frozen=True)
class TuneSettings:
    """Every option of `tune run`; the CLI fills it from flags or an options file."""

    model: str = "minilm"
    pooling: str | None = None  # only for models outside the registry
    dataset: str | None = None  # None: the model's default (`default_dataset`)
    heldout: str | None = "auto"
    general: str | None = None
    max_general_drop: float | None = None
    trials: int = DEFAULT_TRIALS
    seed: int = 0
    hm_floor: str = "significant"
    max_ndcg_drop: float | None = 0.0  # aggregate nDCG@10 may fall this much below the uncalibrated (None: any)
    selection: str = "one-se"
    pareto: bool = False
    storage: str | None = None
    study_name: str | None = None
    tracking_uri: str | None = None
    output: Path | None = None
    batch_size: int | None = None  # None: chosen from the device's free memory (`encoder.choose_batching`)
    batch_tokens: int | None = None  # None: long-passage models get a token budget from the free memory
    profile_docs: int = 16
    bootstrap: int = 1000
    trust_remote_code: bool = False
    revision: str | None = None
    space: SearchSpace = field(default_factory=SearchSpace)
    cache_budget: int | None = None  # bytes of cached layer inputs (None: tuner.cache's default; 0: none)
    workers: int = 1
    worker: bool = False  # only run trials of a study another `tune` coordinates
    heartbeat: int = HEARTBEAT_SECONDS
    worker_id: str | None = None  # seeds this process's sampler: "0" coordinates, local workers 1, 2, ...; default host:pid
    dataset_defaulted: bool = field(default=False, init=False)  # whether `dataset` is the model's default

    def __post_init__(self) -> None:
        if self.dataset is None:
            object.__setattr__(self, "dataset", default_dataset(self.model))
            object.__setattr__(self, "dataset_defaulted", True)
        if self.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {self.workers}")
        if self.heartbeat < 1:
            raise ValueError(f"--heartbeat must be at least 1 second, got {self.heartbeat}")
        if self.trials < 1:
            raise ValueError(f"--trials must be at least 1, got {self.trials}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.batch_tokens is not None and self.batch_tokens < 1:
            raise ValueError(f"--batch-tokens must be at least 1, got {self.batch_tokens}")
        if self.max_general_drop is not None and self.general is None:
            raise ValueError("--max-general-drop needs --general (e.g. --general wikipos-general)")
        check_run_options(self)
        HmFloor.parse(self.hm_floor)  # fail before any work
        self.constraints(0.0)
        if self.selection not in RULES:
            raise ValueError(f"--selection must be one of {', '.join(RULES)}, got {self.selection!r}")
        if self.heldout in ("", "none"):
            object.__setattr__(self, "heldout", None)

    def constraints(self, baseline_hm: float) -> Constraints:
        """What a trial must respect, given the uncalibrated HM on the tuning split."""
        floor = HmFloor.parse(self.hm_floor)
        return Constraints(floor.resolve(baseline_hm), floor.conservative, self.max_ndcg_drop, self.max_general_drop)

    def study_name_for(self, model: LoadedModel) -> str:
        """Default: model--dataset--seedN, in characters safe for file names and MLflow filters."""
        if self.study_name:
            return self.study_name
        suffix = "-pareto" if self.pareto else ""
        plain = f"{Path(model.spec.alias).name}--{self.dataset}--seed{self.seed}{suffix}"
        return re.sub(r"[^A-Za-z0-9._-]+", "_", plain)


STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def check_run_options(settings: TuneSettings) -> None:
    """What `TuneSettings` holds beyond counts and formats: ranges, names and paths, checked before any work."""
    if settings.profile_docs < 1:
        raise ValueError(f"--profile-docs must be at least 1 (documents in each trial's attention profile), got {settings.profile_docs}")
    if settings.bootstrap < 1:
        raise ValueError(f"--bootstrap must be at least 1 resample (1000 is usual), got {settings.bootstrap}")
    if settings.max_general_drop is not None and not 0 <= settings.max_general_drop <= 1:
        raise ValueError(f"--max-general-drop must be between 0 and 1 (0.005 is half a point of nDCG@10), got {settings.max_general_drop}")
    if not 0 <= settings.seed < 2**32:
        raise ValueError(f"--seed must be between 0 and 4294967295, got {settings.seed}")
    if settings.study_name is not None and not STUDY_NAME.match(settings.study_name):
        raise ValueError(f"--study-name {shown(settings.study_name)}: use letters, digits, '.', '_' and '-' (up to 200, "
                         "not starting with '.' or '-'); the name becomes a file name under mlruns/exports")
    if settings.output is not None:
        check_writable(settings.output, "--output")
    if settings.tracking_uri is not None:
        check_tracking_uri(settings.tracking_uri)


def default_dataset(model: str) -> str:
    """FineWeb-PosQ for the registry's long-passage models (as the paper tunes them), else WikiPos-dev."""
    spec = REGISTRY.get(model)
    return "fineweb-posq" if spec is not None and spec.long_passages else "wikipos-dev"


def dataset_reason(settings: TuneSettings) -> str:
    """Why the study tunes on `settings.dataset`, for the settings table."""
    if not settings.dataset_defaulted:
        return "given with --dataset"
    if settings.dataset == "fineweb-posq":
        return (f"default for {settings.model}, a long-passage model: FineWeb-PosQ's web passages of 500-1,024 words, "
                "as the paper tunes; the authors' sampling (1,000 questions per position group, seed 42), tuned on "
                "half the passages, reported on the other half. Offline alternative: --dataset wikipos-dev")
    return "default: WikiPos-dev, embedded in posfair (passages of <= 512 tokens); reported on WikiPos-test"


class UnavailableError(RuntimeError):
    """What the run needs is neither here nor downloadable from here; the message lists every download."""


def check_available(settings: TuneSettings) -> None:
    """Before any work: the model and every benchmark the run reads must be here (or the hub reachable).

    One error names everything missing, each with its `hf download` command, so a user fetches all at once.
    """
    spec = resolve_spec(settings.model, settings.pooling)  # type: ignore[arg-type]
    check_consent(spec, settings.trust_remote_code)
    problems = []
    try:
        locate(spec, settings.revision)
    except ModelUnavailableError as error:
        problems.append(str(error))
    names = [settings.dataset, settings.heldout if settings.heldout != "auto" else None, settings.general]
    for name in dict.fromkeys(n for n in names if n):
        try:
            check_benchmark(name)
        except DatasetUnavailableError as error:
            problems.append(str(error))
            if name == settings.dataset and settings.dataset_defaulted:
                problems.append(f"{name} is {settings.model}'s default dataset; to tune offline on the embedded "
                                "WikiPos instead, add --dataset wikipos-dev")
    if problems:
        raise UnavailableError("\n".join(problems))


@dataclass(frozen=True)
class HeldOut:
    """A config on one held-out set, and its change against no calibration there (None for the baseline)."""

    report: PositionReport
    delta: PairedBootstrap | None


@dataclass(frozen=True)
class Row:
    """One line of the summary: a config's tuning-split report and its comparison on each held-out set."""

    label: str
    trial: int | None
    config: CalibrationConfig | None
    tuning: PositionReport
    heldout: dict[str, HeldOut] = field(default_factory=dict)


@dataclass(frozen=True)
class TuneOutcome:
    study: str
    winner_trial: int
    config: CalibrationConfig
    export_path: Path
    rows: list[Row]
    pareto: list[int]
    floor: float
    tracking_uri: str
    selection: Selection


WIKIPOS_HELDOUT = ("wikipos-test", *(f"wikipos-{split}" for split in TRANSFER_SPLITS))
"""What `--heldout auto` checks a WikiPos-dev winner on: the test split and the transfer sets."""


def split_datasets(settings: TuneSettings) -> tuple[PositionalDataset, list[PositionalDataset]]:
    """The tuning set and the held-out sets selection never sees."""
    name = settings.dataset
    if name.startswith("fineweb-posq"):
        tuning = load_benchmark(name, part="tune")
        heldout = [load_benchmark(name, part="heldout")] if settings.heldout == "auto" else []
    else:
        tuning = load_benchmark(name)
        heldout = [load_benchmark(h) for h in WIKIPOS_HELDOUT] if settings.heldout == "auto" and name == "wikipos-dev" else []
    if settings.heldout not in (None, "auto"):
        heldout = [load_benchmark(h.strip()) for h in settings.heldout.split(",") if h.strip()]
    return tuning, heldout


def estimate_cost(
    evaluator: Evaluator, heldout: list[PositionalDataset], general: PositionalDataset | None, profile_docs: int,
) -> StudyCost:
    """What this run will encode, priced by a probe on this device (see `tuner.cost`)."""
    model, batches = evaluator.model, evaluator.batches()
    tuning = evaluator.dataset
    queries = [*tuning.queries.values(), *(q for held in heldout for q in held.queries.values())]
    once = padded_tokens(model, queries)
    for held in heldout:  # baseline, paper default and winner on each held-out corpus of its own
        if held.corpus != tuning.corpus:
            once += 3 * padded_tokens(model, list(held.corpus.values()))
    per_trial = batches.tokens() * min(profile_docs, batches.count) // max(batches.count, 1)
    if general is not None:
        general_tokens = padded_tokens(model, list(general.corpus.values()))
        once += general_tokens + padded_tokens(model, list(general.queries.values()))
        per_trial += general_tokens
    return StudyCost(probe(model, batches), batches.count, batches.tokens(), batches.truncated, model.max_length,
                     per_trial, once)


def _fitting_space(space: SearchSpace, evaluator: Evaluator) -> SearchSpace:
    """Drop basket sizes that no passage of the tuning data fills (trials that could only repeat the baseline)."""
    longest = evaluator.longest_content()
    fitting = space.fitting(longest)
    if fitting != space:
        dropped = sorted(set(space.basket_sizes) - set(fitting.basket_sizes))
        log.info("basket sizes %s dropped from the search: the longest passage has %d content tokens", dropped, longest)
    return fitting


class StoppedEarlyError(RuntimeError):
    """The study ended short of its trials (Ctrl-C, too many failures): nothing is exported as if complete."""

    def __init__(self, message: str, interrupted: bool) -> None:
        super().__init__(message)
        self.interrupted = interrupted


def tune(settings: TuneSettings) -> TuneOutcome | None:
    """Run (or resume) a study and export its winner; a `worker` only runs trials and returns None."""
    check_available(settings)  # a missing model or dataset fails here, before anything is loaded or written
    tuning, heldout = split_datasets(settings)  # so does a broken dataset (read before the model loads)
    general = load_benchmark(settings.general) if settings.general else None
    require_position_groups(tuning, "--dataset")
    for held in heldout:
        require_position_groups(held, "--heldout")
    tracker = Tracker(settings.tracking_uri, EXPERIMENT)  # an unreachable server fails here, before any work
    storage = settings.storage or default_storage()
    make_storage(storage, settings.heartbeat)  # a malformed URL fails here too
    clean_orphans()  # temporary folders of killed runs
    model = load_model(settings.model, revision=settings.revision, trust_remote_code=settings.trust_remote_code,
                       pooling=settings.pooling)  # type: ignore[arg-type]
    tuning, heldout = within_reach(tuning, model), [within_reach(held, model) for held in heldout]
    evaluator = Evaluator(
        model, tuning, settings.batch_size, show_progress=sys.stderr.isatty() and not settings.worker, batch_tokens=settings.batch_tokens,
        cache_budget=settings.cache_budget, prefix_layers=prefix_layers_for(settings.space, model.num_layers),
    )
    space = _fitting_space(settings.space, evaluator)
    if not settings.worker:
        for line in estimate_cost(evaluator, heldout, general, settings.profile_docs).describe(settings.trials, DEFAULT_TRIALS):
            log.info(line)
    name = settings.study_name_for(model)
    identity = {
        "model_name": settings.model,
        "pooling": model.spec.pooling,
        "dataset_name": settings.dataset,
        "model": model.spec.source,
        "revision": model.revision,
        "dataset": tuning.name,
        "dataset_fingerprint": tuning.fingerprint(),
        "hm_floor": settings.hm_floor,
        "max_ndcg_drop": settings.max_ndcg_drop,
        "space": space.as_dict(),
        "pareto": settings.pareto,
        "seed": settings.seed,
    }
    worker_id = settings.worker_id or ("0" if not settings.worker else f"{socket.gethostname()}:{os.getpid()}")
    study = open_study(name, storage, seed=settings.seed, pareto=settings.pareto, identity=identity, heartbeat=settings.heartbeat,
                       worker=worker_id)
    workers = _start_workers(settings, settings.workers - 1)  # they load while the baseline is measured
    if settings.worker:
        floor = _floor_set_by_coordinator(name, storage, settings.heartbeat)
    else:
        for key, value in _reload_attrs(settings, tracker).items():  # what `tune export` needs to load it all again
            study.set_user_attr(key, value)
        log.info("baseline: encoding %d documents and %d queries of %s", len(tuning.corpus), len(tuning.queries), tuning.name)
        baseline = evaluator.run(None)
        floor = HmFloor.parse(settings.hm_floor).resolve(baseline.report.hm)
        study.set_user_attr(FLOOR_ATTR, floor)
        for reference in (BASELINE_PARAMS, PAPER_DEFAULT_PARAMS):
            if space.admits(reference):
                enqueue_once(study, *space.reference_trial(reference))
    tracker.start_study(
        name,
        params={**identity, "floor_value": floor, "trials": settings.trials, "storage": storage},
        tags={"posfair.model": model.spec.alias, "posfair.dataset": tuning.name},
    )
    staging = scratch_dir()
    try:
        objective = TrialObjective(
            evaluator, space, replace(settings.constraints(0.0), hm_floor=floor), tracker, name, staging,
            pareto=settings.pareto, general=_general_check(model, settings, general), profile_docs=settings.profile_docs,
        )
        with tqdm(total=settings.trials, initial=len(complete_trials(study)), desc="trials", unit="trial",
                  disable=not sys.stderr.isatty()) as progress:
            ended = run_trials(study, objective, settings.trials, [partial(_log_trial, progress=progress)])
        for worker in workers:
            worker.join()
        if ended.short:
            _stop_short(ended, settings, tracker, name)
        if settings.worker:
            return None
        return _conclude(settings, study, tracker, evaluator, heldout, floor, staging, storage)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
        tracker.flush()
        shutil.rmtree(staging, ignore_errors=True)


def _stop_short(ended: TrialsEnd, settings: TuneSettings, tracker: Tracker, name: str) -> None:
    """Say that the study ended short, mark the MLflow parent run, and end with an error: no export."""
    why = "interrupted" if ended.stopped == "interrupted" else f"{ended.failures} trials of this run failed"
    requeued = f"; trial {ended.requeued} was aborted and is queued to run again" if ended.requeued is not None else ""
    message = (f"stopped early ({why}): {ended.complete} of {ended.target} trials complete{requeued}; nothing exported. "
               f"Run the same command again to resume, or `tune export --study-name {name}` to export the winner so far")
    if not settings.worker:
        tracker.finish_study({"complete_trials": ended.complete}, [],
                             {"posfair.outcome": f"stopped early ({why}): {ended.complete} of {ended.target} trials"},
                             "KILLED" if ended.stopped == "interrupted" else "FAILED")
    raise StoppedEarlyError(message, interrupted=ended.stopped == "interrupted")


def _conclude(
    settings: TuneSettings, study: optuna.Study, tracker: Tracker, evaluator: Evaluator,
    heldout: list[PositionalDataset], floor: float, staging: Path, storage: str,
) -> TuneOutcome:
    """Pick the winner, score it on the held-out sets, export it, and close the parent run."""
    model = evaluator.model
    picked = winner(study, settings.selection)
    baseline = evaluator.run(None)
    reference = _trial_with(study, BASELINE_PARAMS)
    best = picked[0] if picked else None
    figures = [pareto_scatter(study, floor, reference, best, staging / "pareto.png"), *optuna_figures(study, staging)]
    if picked is None:
        tracker.finish_study({"baseline_hm": baseline.report.hm, "hm_floor": floor}, figures, {"posfair.outcome": "no feasible trial"}, "FAILED")
        raise NoFeasibleTrialError(_nothing_feasible(study, settings, floor))
    best, selection = picked
    log.info("winner: %s", selection.describe())
    if best.params.get("strength") == 0:
        log.warning("no calibration is fairer than the uncalibrated model by more than the tuning split's noise: "
                    "the export keeps the model uncalibrated (strength 0); `--selection lowest` takes the lowest PSI")
    rows = _summary_rows(study, best, evaluator, heldout, settings)
    export_path = _export(settings, model, study, best, rows, storage, evaluator.dataset, selection)
    summary = staging / "summary.json"
    summary.write_text(json.dumps([_row_dict(r) for r in rows], indent=1), encoding="utf-8")
    tracker.finish_study(
        {**{f"winner_{k}": v for k, v in rows[-1].tuning.as_dict().items() if v is not None},
         **{f"baseline_{k}": v for k, v in baseline.report.as_dict().items() if v is not None},
         "hm_floor": floor, "winner_trial": best.number},
        [*figures, summary, export_path],
        {"posfair.outcome": "exported", "posfair.export": str(export_path),
         "posfair.selection_rule": selection.rule, "posfair.selection": selection.describe()},
    )
    return TuneOutcome(study.study_name, best.number, _config_of(best, model), export_path, rows,
                       [t.number for t in pareto_front(study)], floor, tracker.uri, selection)


def _nothing_feasible(study: optuna.Study, settings: TuneSettings, floor: float) -> str:
    """Why no trial won: the best each constraint saw, and what to relax."""
    complete = complete_trials(study)
    worst = {name: min((t.constraints.get(name, 0.0) for t in complete), default=float("nan"))
             for name in ("hm_floor", "ndcg_drop", "general_drop")}
    parts = [f"no trial met the constraints; nothing exported. HM floor {100 * floor:.2f} ({settings.hm_floor})"
             f", missed by at least {100 * worst['hm_floor']:.2f} points" if worst["hm_floor"] > 0 else ""]
    if worst["ndcg_drop"] > 0:
        parts.append(f"every trial lost aggregate nDCG@10 (the smallest loss beyond the allowance: {100 * worst['ndcg_drop']:.2f} points)")
    if worst["general_drop"] > 0:
        parts.append(f"every trial dropped general nDCG@10 beyond --max-general-drop (by at least {100 * worst['general_drop']:.2f} points)")
    return "; ".join(p for p in parts if p) + (
        ". Relax --hm-floor (e.g. baseline or -1%) or --max-ndcg-drop (e.g. 0.005), widen the search space, "
        "or run more --trials."
    )


def _floor_set_by_coordinator(name: str, storage: str, heartbeat: int, timeout: float = 3600.0) -> float:
    """A worker waits until the coordinating `tune` has measured the baseline and stored the floor."""
    deadline = time.monotonic() + timeout
    while FLOOR_ATTR not in (attrs := optuna.load_study(study_name=name, storage=make_storage(storage, heartbeat)).user_attrs):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no coordinator set the HM floor of study {name!r}; start `tune` without --worker first")
        time.sleep(2)
    return float(attrs[FLOOR_ATTR])


def _start_workers(settings: TuneSettings, count: int) -> list[multiprocessing.process.BaseProcess]:
    """Extra local worker processes on the same study (each loads its own model)."""
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_work, args=(replace(settings, workers=1, worker=True, worker_id=str(i + 1)),), daemon=False)
               for i in range(count)]
    for worker in workers:
        worker.start()
    return workers


def _work(settings: TuneSettings) -> None:
    quiet_libraries()
    logging.basicConfig(level=logging.INFO, format="[worker %(process)d] %(message)s", force=True)
    tune(settings)


def quiet_libraries() -> None:
    """Keep the log to posfair's own lines: no load reports, progress bars or library chatter."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for noisy in ("mlflow", "alembic", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _reload_attrs(settings: TuneSettings, tracker: Tracker) -> dict[str, object]:
    """Study attributes beyond its identity: how to load the model again, where its runs are logged."""
    return {"trust_remote_code": settings.trust_remote_code, "tracking_uri": tracker.uri, "heldout": settings.heldout}


def reexport(
    study_name: str, storage: str | None, output: Path | None, tracking_uri: str | None, trust_remote_code: bool = False,
    selection: str = "one-se",
) -> Path:
    """Export a stored study's current winner again, re-scoring it (and the baseline) on every split.

    The model is loaded exactly as the study loaded it: the recorded revision (a hub commit), and remote
    code if the study was run with `--trust-remote-code`. The export is logged to the study's MLflow
    parent run, in `tracking_uri` (default: the store the study logged to).
    """
    storage = storage or default_storage()
    try:
        study = optuna.load_study(study_name=study_name, storage=make_storage(storage, HEARTBEAT_SECONDS))
    except KeyError:
        raise ValueError(f"no study {study_name!r} in {storage}; see the study names in `tune ui` or the tune output") from None
    attrs = study.user_attrs
    lacking = [key for key in ("model_name", "pooling", "dataset_name", "seed", "hm_floor", "pareto", "revision",
                               "dataset_fingerprint") if key not in attrs]
    if lacking:
        raise ValueError(f"study {study_name!r} in {storage} was not made by `tune` (it lacks {', '.join(lacking)}); "
                         "only studies that `tune` ran can be exported")
    if output is not None:
        check_writable(output, "--output")
    tracker = Tracker(tracking_uri or attrs.get("tracking_uri"), EXPERIMENT)  # an unreachable server fails here
    settings = TuneSettings(
        model=attrs["model_name"], pooling=attrs["pooling"], dataset=attrs["dataset_name"], seed=attrs["seed"], hm_floor=attrs["hm_floor"],
        max_ndcg_drop=attrs.get("max_ndcg_drop"), selection=selection,
        pareto=attrs["pareto"], storage=storage, study_name=study_name, output=output, tracking_uri=tracker.uri,
        heldout=attrs.get("heldout", "auto"), trust_remote_code=trust_remote_code or bool(attrs.get("trust_remote_code")),
        revision=hub_revision(attrs["revision"]),
    )
    picked = winner(study, selection)
    if picked is None:
        raise NoFeasibleTrialError(f"study {study_name!r} has no feasible complete trial; nothing to export")
    best, chosen = picked
    model = load_model(settings.model, revision=settings.revision, trust_remote_code=settings.trust_remote_code,
                       pooling=settings.pooling)  # type: ignore[arg-type]
    if model.revision != attrs["revision"]:
        raise ValueError(f"study {study_name!r} tuned {attrs['model']} at revision {attrs['revision']}, "
                         f"but {model.revision} loaded; restore that revision locally to re-export")
    tuning, heldout = split_datasets(settings)
    tuning, heldout = within_reach(tuning, model), [within_reach(held, model) for held in heldout]  # as `tune` scored them
    if tuning.fingerprint() != attrs["dataset_fingerprint"]:
        raise ValueError(f"dataset {settings.dataset!r} changed since study {study_name!r} ran (fingerprint differs)")
    rows = _summary_rows(study, best, Evaluator(model, tuning, settings.batch_size, batch_tokens=settings.batch_tokens),
                         heldout, settings)
    path = _export(settings, model, study, best, rows, storage, tuning, chosen)
    tracker.start_study(study_name, params=dict(attrs),
                        tags={"posfair.model": model.spec.alias, "posfair.dataset": tuning.name})
    tracker.finish_study(
        {**{f"winner_{k}": v for k, v in rows[-1].tuning.as_dict().items() if v is not None}, "winner_trial": best.number},
        [path], {"posfair.outcome": "re-exported", "posfair.export": str(path),
                 "posfair.selection_rule": chosen.rule, "posfair.selection": chosen.describe()},
    )
    return path


def _log_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial, progress: tqdm) -> None:
    """One readable line per finished trial."""
    if trial.state == TrialState.COMPLETE:
        progress.update(1)
        broken = [name for name, value in trial.constraints.items() if not value <= 0]
        attrs = trial.user_attrs
        truncated = int(attrs.get("metrics", {}).get("truncated_documents", 0))
        log.info(
            "trial %d: PSI %.3f ± %.3f  HM %.2f  ΔnDCG@10 %+.2f  drift %.4f  %s  (%s)  %.0f s%s", trial.number,
            attrs["psi"], attrs.get("psi_se", 0.0), 100 * attrs["hm"], 100 * attrs["metrics"].get("ndcg10_delta", 0.0),
            attrs.get("drift", 0.0), "feasible" if not broken else "misses " + ", ".join(broken),
            ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                      for k, v in {**trial.params, "basket_shares": trial_basket_shares(trial)}.items()),
            trial.duration.total_seconds() if trial.duration else 0.0,
            f"  {truncated} passages truncated" if truncated else "",
        )
    elif not trial.user_attrs.get("surplus"):
        log.warning("trial %d %s: %s", trial.number, trial.state.name, trial.user_attrs.get("failure_reason", "interrupted"))


def _general_check(model: LoadedModel, settings: TuneSettings, general: PositionalDataset | None) -> GeneralCheck | None:
    if general is None:
        return None
    evaluator = Evaluator(model, general, settings.batch_size, batch_tokens=settings.batch_tokens,
                          cache_budget=0)  # short documents
    return GeneralCheck(evaluator, evaluator.run(None).report)


def _config_of(trial: optuna.trial.FrozenTrial, model: LoadedModel) -> CalibrationConfig:
    params = trial.params
    extra = {"weight": round(params["weight"], 6)} if "weight" in params else {}
    return CalibrationConfig(
        variant=params["variant"], strength=round(params["strength"], 6), layers=trial.user_attrs["layers"],
        basket_size=params["basket_size"], pooling=model.spec.pooling, padding_side=model.spec.padding_side,
        basket_shares=trial_basket_shares(trial), **extra,
    )


def _trial_with(study: optuna.Study, reference: dict[str, object]) -> optuna.trial.FrozenTrial | None:
    return next((t for t in study.trials if is_reference_trial(t, reference) and "hm" in t.user_attrs), None)


def _summary_rows(
    study: optuna.Study, best: optuna.trial.FrozenTrial, evaluator: Evaluator,
    heldout: list[PositionalDataset], settings: TuneSettings,
) -> list[Row]:
    """No calibration, the paper's default, and the winner; held-out figures with bootstrap intervals."""
    model = evaluator.model
    entries: list[tuple[str, optuna.trial.FrozenTrial | None]] = [("No calibration", None)]
    default = _trial_with(study, PAPER_DEFAULT_PARAMS)
    if default is not None and default.number != best.number:
        entries.append(("Paper default", default))
    entries.append((f"Winner (trial {best.number})", best))
    configs = [(label, trial, _config_of(trial, model) if trial is not None else None) for label, trial in entries]
    starts = [min(c.resolve_layers(model.num_layers)) for _, _, c in configs if c is not None]
    held: dict[str, dict[str, HeldOut]] = {label: {} for label, _, _ in configs}
    for dataset in heldout:
        log.info("held-out: scoring %d configs on %s (%d documents, %d queries)",
                 len(configs), dataset.name, len(dataset.corpus), len(dataset.queries))
        scorer = _held_out_scorer(evaluator, dataset, starts, settings)
        baseline = scorer(None)
        for label, _, config in configs:
            result = scorer(config) if config is not None else baseline
            delta = paired_bootstrap(baseline.per_query, result.per_query, settings.bootstrap, settings.seed) if config else None
            held[label][dataset.name] = HeldOut(result.report, delta)
    return [
        Row(label, trial.number if trial else None, config, evaluator.run(config).report, held[label])
        for label, trial, config in configs
    ]


def _held_out_scorer(
    evaluator: Evaluator, dataset: PositionalDataset, starts: list[int], settings: TuneSettings
) -> Callable[[CalibrationConfig | None], Evaluation]:
    """Scores on a held-out set. A held-out part of the tuning corpus (FineWeb-PosQ's) reuses the tuning
    vectors; another corpus gets its own evaluator, whose baseline pass records the inputs of the layers
    where the configs start calibrating, so each config resumes there."""
    if dataset.corpus == evaluator.dataset.corpus:
        scorer = Evaluator(evaluator.model, dataset, evaluator.batch_size, batch_tokens=settings.batch_tokens, cache_budget=0)

        def shared(config: CalibrationConfig | None) -> Evaluation:
            documents, truncated = evaluator.document_vectors(config)
            return scorer.score(documents, truncated=truncated)

        return shared
    own = Evaluator(evaluator.model, dataset, settings.batch_size, show_progress=sys.stderr.isatty(),
                    batch_tokens=settings.batch_tokens, prefix_layers=starts)
    return own.run


def _export(settings: TuneSettings, model: LoadedModel, study: optuna.Study, best: optuna.trial.FrozenTrial,
            rows: list[Row], storage: str, tuning: PositionalDataset, selection: Selection) -> Path:
    winner_row, baseline_row = rows[-1], rows[0]
    metrics: dict[str, dict[str, float | None]] = {
        "tuning": winner_row.tuning.as_dict(), "tuning_baseline": baseline_row.tuning.as_dict(),
    }
    for name, held in winner_row.heldout.items():
        metrics[f"heldout/{name}"] = held.report.as_dict()
        metrics[f"heldout_baseline/{name}"] = baseline_row.heldout[name].report.as_dict()
    exported = build_export(
        model, _config_of(best, model), {k: {m: (float(v) if v is not None else None) for m, v in d.items()} for k, d in metrics.items()},
        study=study.study_name, trial=best.number, storage=storage, dataset=tuning.name,
        dataset_fingerprint=tuning.fingerprint(), seed=settings.seed,
        selection_rule=selection.rule, selection=selection.describe(),
    )
    path = settings.output or Path("mlruns") / "exports" / f"{study.study_name}.yaml"
    if settings.output is None:
        path.parent.mkdir(parents=True, exist_ok=True)
    return write_exported(exported, path)


def _row_dict(row: Row) -> dict[str, object]:
    return {
        "label": row.label,
        "trial": row.trial,
        "config": row.config.model_dump() if row.config else None,
        "tuning": row.tuning.as_dict(),
        "heldout": {name: {"metrics": h.report.as_dict(), "delta": h.delta.summary() if h.delta else None}
                    for name, h in row.heldout.items()},
    }

