"""The tuning run end to end: baseline, study, winner, held-out check, export, MLflow parent run.

This module wires the pieces; each piece (evaluation, study, objective, tracking, export) does its
own job and is usable alone.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import multiprocessing.process
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import optuna
from optuna.trial import TrialState

from objectives import RULES, Constraints, HmFloor, PairedBootstrap, PositionReport, Selection, paired_bootstrap
from tuner.calibration import CalibrationConfig
from tuner.cost import StudyCost, padded_tokens, probe
from tuner.data import DatasetUnavailableError, PositionalDataset, load_benchmark
from tuner.data import check_available as check_benchmark
from tuner.data.wikipos import TRANSFER_SPLITS
from tuner.evaluation import Evaluation, Evaluator
from tuner.export import build_export, write_exported
from tuner.models import (
    REGISTRY, LoadedModel, ModelUnavailableError, check_consent, hub_revision, load_model, locate, resolve_spec,
)
from tuner.objective import GeneralCheck, TrialObjective
from tuner.plots import optuna_figures, param_importances, pareto_scatter
from tuner.prefix import prefix_layers_for
from tuner.progress import Phase, StudyProgress
from tuner.registry import Registered, publish, reserve_version
from tuner.search_space import BASELINE_PARAMS, PAPER_DEFAULT_PARAMS, SearchSpace, is_reference_trial, trial_basket_shares
from tuner.study import (
    HEARTBEAT_SECONDS,
    check_storage_url,
    complete_trials,
    default_storage,
    describe_study,
    enqueue_once,
    make_storage,
    open_study,
    pareto_front,
    run_trials,
    winner,
)
from tuner.tracking import Tracker, describe_config, display_metrics, summary_metrics

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
        return self.study_name_from_alias(model.spec.alias)

    def study_name_from_alias(self, alias: str) -> str:
        """Default: model--dataset--seedN, in characters safe for file names and MLflow filters."""
        if self.study_name:
            return self.study_name
        suffix = "-pareto" if self.pareto else ""
        plain = f"{Path(alias).name}--{self.dataset}--seed{self.seed}{suffix}"
        return re.sub(r"[^A-Za-z0-9._-]+", "_", plain)


def settings_in_force(settings: TuneSettings) -> dict[str, object]:
    """The settings as the run will use them: defaults resolved to their values (nothing is created here)."""
    from tuner.tracking import describe_store, default_tracking_uri

    values = {k: v for k, v in vars(settings).items() if k != "dataset_defaulted"}
    try:
        name = settings.study_name_from_alias(resolve_spec(settings.model, settings.pooling).alias)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - an unknown model is reported by the run itself, with its fix
        name = None
    values["study_name"] = name or "model--dataset--seedN"
    values["storage"] = settings.storage or default_storage()
    values["tracking_uri"] = describe_store(settings.tracking_uri or default_tracking_uri())
    values["output"] = settings.output or Path("mlruns") / "exports" / f"{values['study_name']}.yaml"
    values["batch_size"] = settings.batch_size or "chosen from the device's free memory"
    return values


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
    registered: str | None = None  # models:/NAME@champion, when the winner was registered


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


def tune(settings: TuneSettings) -> TuneOutcome | None:
    """Run (or resume) a study and export its winner; a `worker` only runs trials and returns None."""
    check_available(settings)  # a missing model or dataset fails here, before anything is loaded or written
    tracker = Tracker(settings.tracking_uri, EXPERIMENT)  # an unreachable server fails here; a store is made later
    storage = settings.storage or default_storage()
    check_storage_url(storage)  # a malformed URL fails here too; the database is created with the study
    model = load_model(settings.model, revision=settings.revision, trust_remote_code=settings.trust_remote_code,
                       pooling=settings.pooling)  # type: ignore[arg-type]
    tuning, heldout = split_datasets(settings)
    evaluator = Evaluator(
        model, tuning, settings.batch_size, show_progress=sys.stderr.isatty() and not settings.worker, batch_tokens=settings.batch_tokens,
        cache_budget=settings.cache_budget, prefix_layers=prefix_layers_for(settings.space, model.num_layers),
    )
    space = _fitting_space(settings.space, evaluator)
    general = load_benchmark(settings.general) if settings.general else None
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
    study = open_study(name, storage, seed=settings.seed, pareto=settings.pareto, identity=identity, heartbeat=settings.heartbeat)
    workers = _start_workers(settings, settings.workers - 1)  # they load while the baseline is measured
    if settings.worker:
        floor = _floor_set_by_coordinator(name, storage, settings.heartbeat)
    else:
        for key, value in _reload_attrs(settings, tracker).items():  # what `tune export` needs to load it all again
            study.set_user_attr(key, value)
        with Phase(f"baseline: encoding {len(tuning.corpus)} documents and {len(tuning.queries)} queries of {tuning.name}"):
            baseline = evaluator.run(None)
        floor = HmFloor.parse(settings.hm_floor).resolve(baseline.report.hm)
        study.set_user_attr(FLOOR_ATTR, floor)
        describe_study(study, settings.pareto, floor, settings.hm_floor)
        for reference in (BASELINE_PARAMS, PAPER_DEFAULT_PARAMS):
            if space.admits(reference):
                enqueue_once(study, *space.reference_trial(reference))
    tracker.start_study(
        name,
        params={**identity, "floor_value": floor, "trials": settings.trials, "storage": storage},
        tags={"posfair.model": model.spec.alias, "posfair.dataset": tuning.name},
        description=f"Study {name}: {settings.trials} trials tuning {model.spec.alias} on {tuning.name}; "
                    f"lowest PSI subject to HM >= {100 * floor:.2f} (--hm-floor {settings.hm_floor}).",
    )
    staging = Path(tempfile.mkdtemp(prefix="posfair-"))
    try:
        objective = TrialObjective(
            evaluator, space, replace(settings.constraints(0.0), hm_floor=floor), tracker, name, staging,
            pareto=settings.pareto, general=_general_check(model, settings, general), profile_docs=settings.profile_docs,
        )
        evaluator.show_progress = False  # the trial bar (on a terminal) and the per-trial lines take over
        with StudyProgress(settings.trials, len(complete_trials(study)), bar=not settings.worker) as progress:
            run_trials(study, objective, settings.trials, [partial(_log_trial, progress=progress)])
        for worker in workers:
            worker.join()
        if settings.worker:
            return None
        return _conclude(settings, study, tracker, evaluator, heldout, floor, staging, storage)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
        tracker.flush()
        shutil.rmtree(staging, ignore_errors=True)


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
        tracker.finish_study({**summary_metrics("tuning/uncalibrated", baseline.report.as_dict(), None),
                              **display_metrics({"hm_floor": floor})}, figures, {"posfair.outcome": "no feasible trial"}, "FAILED")
        raise NoFeasibleTrialError(_nothing_feasible(study, settings, floor))
    best, selection = picked
    log.info("winner: %s", selection.describe())
    tracker.close_stale_trials(study.study_name, [t.number for t in study.trials if t.state == TrialState.FAIL])
    if best.params.get("strength") == 0:
        log.warning("no calibration is fairer than the uncalibrated model by more than the tuning split's noise: "
                    "the export keeps the model uncalibrated (strength 0); `--selection lowest` takes the lowest PSI")
    rows = _summary_rows(study, best, evaluator, heldout, settings)
    export_path, registered = _export_and_register(settings, model, study, best, rows, storage, evaluator.dataset, selection,
                                                   tracker, floor)
    summary = staging / "summary.json"
    summary.write_text(json.dumps([_row_dict(r) for r in rows], indent=1), encoding="utf-8")
    _mark_winner(tracker, study, best, model, selection, registered)
    tracker.finish_study(
        {**_row_metrics(rows), **display_metrics({"hm_floor": floor}), "winner_trial": best.number,
         **{f"psi_importance/{k}": v for k, v in _importances(study).items()}},
        [*figures, summary, export_path],
        {"posfair.outcome": "exported", "posfair.export": str(export_path),
         "posfair.selection_rule": selection.rule, "posfair.selection": selection.describe()},
    )
    return TuneOutcome(study.study_name, best.number, _config_of(best, model), export_path, rows,
                       [t.number for t in pareto_front(study)], floor, tracker.uri, selection,
                       f"{registered.uri} (version {registered.version})" if registered else None)


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
    workers = [context.Process(target=_work, args=(replace(settings, workers=1, worker=True),), daemon=False) for _ in range(count)]
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
    if tuning.fingerprint() != attrs["dataset_fingerprint"]:
        raise ValueError(f"dataset {settings.dataset!r} changed since study {study_name!r} ran (fingerprint differs)")
    rows = _summary_rows(study, best, Evaluator(model, tuning, settings.batch_size, batch_tokens=settings.batch_tokens),
                         heldout, settings)
    tracker.start_study(study_name, params=dict(attrs),
                        tags={"posfair.model": model.spec.alias, "posfair.dataset": tuning.name})
    floor = float(attrs.get(FLOOR_ATTR, float("nan")))
    path, registered = _export_and_register(settings, model, study, best, rows, storage, tuning, chosen, tracker, floor)
    _mark_winner(tracker, study, best, model, chosen, registered)
    tracker.finish_study(
        {**_row_metrics(rows), "winner_trial": best.number},
        [path], {"posfair.outcome": "re-exported", "posfair.export": str(path),
                 "posfair.selection_rule": chosen.rule, "posfair.selection": chosen.describe()},
    )
    return path


def _log_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial, progress: StudyProgress) -> None:
    """One readable line per finished trial, with the study's progress (k/N, best so far, elapsed, ETA)."""
    if trial.state == TrialState.COMPLETE:
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
        log.info("trial %d/%d complete · %s", min(len(complete_trials(study)), progress.total), progress.total, progress.status(study))
    elif not trial.user_attrs.get("surplus"):
        log.warning("trial %d %s: %s", trial.number, trial.state.name, trial.user_attrs.get("failure_reason", "interrupted"))
        log.info("trials %d/%d complete · %s", min(len(complete_trials(study)), progress.total), progress.total, progress.status(study))


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
    for number, dataset in enumerate(heldout, 1):
        with Phase(f"held-out {number}/{len(heldout)}: scoring {len(configs)} configs on {dataset.name} "
                   f"({len(dataset.corpus)} documents, {len(dataset.queries)} queries)"):
            scorer = _held_out_scorer(evaluator, dataset, starts, settings)
            baseline = scorer(None)
            for label, _, config in configs:
                result = scorer(config) if config is not None else baseline
                delta = paired_bootstrap(baseline.per_query, result.per_query, settings.bootstrap, settings.seed) if config else None
                held[label][dataset.name] = HeldOut(result.report, delta)
                log.info("held-out %s: %s scored (%s)", dataset.name, label,
                         delta.summary() if delta else f"nDCG@10 {100 * result.report.ndcg10:.2f}")
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
            rows: list[Row], storage: str, tuning: PositionalDataset, selection: Selection, **provenance: object) -> Path:
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
        heldout=list(winner_row.heldout), hm_floor_rule=settings.hm_floor,
        intervals={name: {k: list(v) for k, v in held.delta.intervals().items()}
                   for name, held in winner_row.heldout.items() if held.delta is not None},
        **provenance,
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



def _export_and_register(
    settings: TuneSettings, model: LoadedModel, study: optuna.Study, best: optuna.trial.FrozenTrial, rows: list[Row],
    storage: str, tuning: PositionalDataset, selection: Selection, tracker: Tracker, floor: float,
) -> tuple[Path, Registered | None]:
    """Write the YAML and register it as an MLflow model (`tuner.registry`), each naming the other: the
    registry version is reserved first, so the YAML it carries records it. A registry failure leaves a
    warning and the YAML (without a version), never a lost study."""
    with Phase("export: writing the winner's YAML and registering it in MLflow"):
        registered = None
        try:
            registered = reserve_version(
                tracker, model.spec.alias, tracker.parent_id or "", f"Study {study.study_name}, trial {best.number}: {selection.describe()}",
                {"posfair.study": study.study_name, "posfair.trial": str(best.number), "posfair.dataset": tuning.name},
            )
        except Exception as error:  # noqa: BLE001 - the registry is an extra; the export must not be lost to it
            log.warning("the winner is not registered in MLflow (%s: %s)", error.__class__.__name__, str(error).splitlines()[0] if str(error) else "")
        objective = ("minimise PSI, maximise HM (Pareto)" if settings.pareto else "minimise PSI") + (
            f" subject to HM >= floor and aggregate nDCG@10 drop <= {settings.max_ndcg_drop}" if settings.max_ndcg_drop is not None
            else " subject to HM >= floor")
        path = _export(settings, model, study, best, rows, storage, tuning, selection, objective=objective,
                       hm_floor=floor if floor == floor else None, mlflow_run_id=tracker.parent_id, tracking_uri=tracker.uri,
                       registered_model=registered.name if registered else None,
                       registered_version=registered.version if registered else None)
        if registered is not None:
            try:
                publish(tracker, registered, path, int(model.model.config.hidden_size))
            except Exception as error:  # noqa: BLE001 - as above
                log.warning("the winner's MLflow model was not written (%s: %s)", error.__class__.__name__, str(error).splitlines()[0] if str(error) else "")
    return path, registered


def _mark_winner(tracker: Tracker, study: optuna.Study, best: optuna.trial.FrozenTrial, model: LoadedModel,
                 selection: Selection, registered: Registered | None) -> None:
    """Name the winner's run (and keep its reference marker): what wins is visible in the run list."""
    markers = [m for m in (best.user_attrs.get("role"),) if m] + ["winner"]
    params = {**best.params, "layers": best.user_attrs.get("layers"), "basket_shares": trial_basket_shares(best)}
    where = f" Registered as {registered.uri} (version {registered.version})." if registered else ""
    tracker.mark_trial(
        study.study_name, best.number, markers, {"posfair.winner": "yes"},
        f"Winner (trial {best.number}): {describe_config(params, model.num_layers)}: PSI {best.user_attrs['psi']:.3f}, "
        f"HM {100 * best.user_attrs['hm']:.2f}. Chosen by the {selection.rule} rule: {selection.describe()}.{where}",
    )


def _row_metrics(rows: list[Row]) -> dict[str, float]:
    """The summary table as parent-run metrics: tuning figures per config, held-out figures with their intervals."""
    metrics: dict[str, float] = {}
    for index, row in enumerate(rows):
        label = "uncalibrated" if index == 0 else "winner" if index == len(rows) - 1 else "paper_default"
        metrics |= summary_metrics(f"tuning/{label}", row.tuning.as_dict(), None)
        for name, held in row.heldout.items():
            metrics |= summary_metrics(f"heldout/{name}/{label}", held.report.as_dict(), held.delta.intervals() if held.delta else None)
    return metrics


def _importances(study: optuna.Study) -> dict[str, float]:
    """Parameter importance for PSI over the parameters every trial drew; kept on the study for the dashboard."""
    importances = param_importances(study)
    if importances:
        study.set_user_attr("psi_importance (parameters every trial drew)", {k: round(v, 4) for k, v in importances.items()})
    return importances
