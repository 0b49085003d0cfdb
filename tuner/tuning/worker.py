"""Running trials: what every process working on a study does, the coordinating `tune` and its workers alike.

A worker (`tune --worker`, or a local process the coordinator spawns) waits for the coordinator's HM
floor, then draws and runs trials until the study has enough; it never concludes the study.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.process
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, NoReturn

import optuna
from optuna.trial import TrialState

from objectives import Constraints
from objectives.constraint import describe_rule
from tuner.common.budget import StudyBudget, await_priced, describe_budget, price_budget, store_study_budget, study_budget
from tuner.common.messages import UserError, first_line
from tuner.common.scratch import scratch_dir
from tuner.common.trials import DUPLICATE_ATTR, SETUP_COST_ATTR, NotRun, PrunedAt, finished, never_ran
from tuner.data import PositionalDataset
from tuner.engine.models import LoadedModel
from tuner.evaluation.evaluator import Evaluator
from tuner.evaluation.pools import SCREEN_SHARE, pool
from tuner.tracking.progress import Phase, StudyProgress
from tuner.tracking.runs import describe_config, local_store
from tuner.tuning.search_space import PAPER_GRID, trial_basket_shares
from tuner.tuning.session import FLOOR_ATTR, Session, await_floor, prepare
from tuner.tuning.settings import TuneSettings, local_worker_identity, process_identity, worker_devices
from tuner.tuning.storage import storage_error, storage_file
from tuner.tuning.study import OWNER_ATTR, WINNER_ATTR, Terminated, TrialsEnd, fail_dead_trials, run_trials, winner
from tuner.tuning.trial.objective import TrialObjective
from tuner.tuning.trial.scoring import SideSet

log = logging.getLogger(__name__)


def run_as_worker(session: Session) -> None:
    """Run trials of a study another `tune` coordinates, once it has stored the HM floor."""
    settings = session.settings
    workers = start_workers(settings, settings.workers - 1)
    floor = await_floor(session.study, settings)
    run_session_trials(session, floor, workers)


def run_session_trials(
    session: Session,
    floor: float,
    workers: list[multiprocessing.process.BaseProcess],
    conclude: Callable[[Path], object] | None = None,
) -> object:
    """Open the study's parent run, run trials until the study has enough, wait for the local `workers`,
    then `conclude(staging)` (the coordinator's last step) and return what it returns."""
    study, settings = session.study, session.settings
    budget = study_budget(study)  # the coordinator's `--budget`, resolved (`estimate.resolve_budget`)
    constraints = replace(settings.constraints(0.0), hm_floor=floor)
    _start_parent_run(session, constraints, budget)
    staging = scratch_dir()
    stop_watching = watch_workers(workers, study)
    try:
        objective = _objective(session, constraints, staging)
        allowance = objective.pricing.allowance = _trial_allowance(session, objective, budget)
        if setup := objective.scoring.setup_layer_tokens():  # per process: each one that encodes its baselines pays for them
            study.set_user_attr(f"{SETUP_COST_ATTR}{socket.gethostname()}:{os.getpid()}:{time.time_ns()}", setup)
        ended = _run_with_progress(session, objective, allowance)
        _join_workers(ended, workers, stop_watching)
        if ended.short:
            _stop_short(ended, session)
        return conclude(staging) if conclude is not None else None
    except KeyboardInterrupt as error:  # Ctrl-C or SIGTERM outside a trial (a side set's baseline, the conclusion)
        _stop_short(
            TrialsEnd(len(finished(study)), settings.trials, "terminated" if isinstance(error, Terminated) else "interrupted"), session
        )
    finally:
        stop_watching()
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
        session.tracker.flush()
        shutil.rmtree(staging, ignore_errors=True)


def _start_parent_run(session: Session, constraints: Constraints, budget: StudyBudget | None) -> None:
    """Open the study's MLflow parent run, described by its trials, budget and rule."""
    settings, model, tuning, name = session.settings, session.model, session.tuning, session.name
    within = f" within a budget of {budget.spec}" if budget else ""
    rule = describe_rule(constraints, session.in_force(constraints), settings.pareto, bool(session.structures))
    session.tracker.start_study(
        name,
        params={
            **session.identity,
            FLOOR_ATTR: constraints.hm_floor,
            "trials": settings.trials,
            "storage": session.storage,
            **({"budget": budget.spec} if budget else {}),
        },
        tags={"posfair.model": model.spec.alias, "posfair.dataset": tuning.name},
        description=f"Study {name}: {'at most ' if budget else ''}{settings.trials} trials{within} tuning {model.spec.alias} "
        f"on {tuning.name}: {rule} (--hm-floor {settings.hm_floor}).",
    )


def _objective(session: Session, constraints: Constraints, staging: Path) -> TrialObjective:
    """The trial objective of this process, its side sets' baselines measured."""
    settings, model, evaluator = session.settings, session.model, session.evaluator
    return TrialObjective(
        evaluator,
        session.space,
        constraints,
        session.tracker,
        session.name,
        staging,
        pareto=settings.pareto,
        general=_side_set(model, settings, session.general, cache_budget=0),  # short documents
        structures=_structure_sides(session),
        screen=_screen(session),
        profile_docs=settings.profile_docs,
        selection=settings.selection,
        prune=settings.prune,
        bisect=settings.bisect,
        repeat_limit=settings.trials,
    )


def _structure_sides(session: Session) -> list[SideSet]:
    """The tuning structures as rungs of every trial, each with its uncalibrated baseline measured here. A structure
    over a corpus of its own (crops, openings, packed passages) is encoded for it, which can take as long as a trial:
    a phase of its own, said as it starts and ends. One over the tuning corpus (a length half) encodes nothing."""
    settings, model, evaluator, tuning = session.settings, session.model, session.evaluator, session.tuning
    own = [s for s in session.structures if s.corpus != tuning.corpus]
    sides = []
    for structure in session.structures:
        if structure.corpus == tuning.corpus:
            sides.append(SideSet(_evaluator(model, settings, structure, cache_budget=0), shares=evaluator))
            continue
        number = next(i for i, s in enumerate(own, 1) if s is structure)
        with Phase(f"structure {number}/{len(own)}: encoding {structure.name} uncalibrated ({len(structure.corpus)} passages)"):
            prefix, budget = evaluator.cache.prefix_layers, settings.cache_budget
            sides.append(SideSet(_evaluator(model, settings, structure, prefix_layers=prefix, cache_budget=budget)))
    return sides


def _trial_allowance(session: Session, objective: TrialObjective, budget: StudyBudget | None) -> int | None:
    """What the study's trials may spend (None: no budget). The coordinator prices its `--budget` exactly on its
    loaded structures, with each depth's cost, and stores it; a worker waits for that price."""
    settings, study = session.settings, session.study
    if budget and settings.budget is not None and not settings.worker:
        pricing = objective.pricing
        budget = replace(price_budget(settings.budget, budget.setup_cost, pricing.grid_cost(PAPER_GRID)), depth_costs=pricing.depth_costs())
        store_study_budget(study, budget)
        log.info(describe_budget(budget))
    elif budget:  # a worker: the coordinator's exact price, once it has set it
        budget = await_priced(study)
    return budget.trial_allowance if budget else None


def _run_with_progress(session: Session, objective: TrialObjective, allowance: int | None) -> TrialsEnd:
    """Run the trials under the progress bar and lines; a store deleted, full or locked is named as the cause."""
    settings, study, tracker = session.settings, session.study, session.tracker
    session.evaluator.show_progress = False  # the trial bar (on a terminal) and the per-trial lines take over
    with StudyProgress(
        settings.trials, len(finished(study)), bar=not settings.worker, workers=settings.workers, allowance=allowance, estimate=session.cost
    ) as progress:
        stores = _local_stores(session)
        try:
            return run_trials(
                study,
                objective,
                settings.trials,
                [
                    partial(_log_trial, progress=progress, num_layers=session.model.num_layers, after=objective.after),
                    lambda s, trial: _require_stores(stores, trial.number),
                ],
                allowance=allowance,
            )
        except Exception as error:  # whatever the storage raised, a deleted store or a full or locked one is the cause to name
            _require_stores(stores, None)
            explained = storage_error(error, session.storage)
            if explained is None:
                raise
            if not settings.worker:
                tracker.finish_study({}, [], {"posfair.outcome": f"stopped: {explained}"}, "FAILED")
            raise explained from None


def _join_workers(ended: TrialsEnd, workers: list[multiprocessing.process.BaseProcess], stop_watching: Callable[[], None]) -> None:
    """Wait for the local workers to finish; a SIGTERM is passed on to them (a scheduler may have told only this process)."""
    if ended.stopped == "terminated":
        stop_watching()
        for worker in workers:
            worker.terminate()
    for worker in workers:
        worker.join()
    stop_watching()


class StoreLostError(UserError, RuntimeError):
    """A local store (the study database, MLflow's) was deleted while the study ran: nothing more can be recorded."""


def _local_stores(session: Session) -> dict[Path, int]:
    """The study's files (Optuna's SQLite database or journal, MLflow's SQLite store) with their inodes, watched
    while trials run."""
    stores = [storage_file(session.storage), local_store(session.tracker.uri)]
    return {store.resolve(): store.stat().st_ino for store in stores if store is not None and store.exists()}


def _require_stores(stores: dict[Path, int], trial: int | None) -> None:
    """After each trial, and when the storage fails: a store deleted under the run (`rm -rf mlruns/`) stops it
    with the cause, not with what Optuna or MLflow say about the empty database they create in its place."""
    for store, inode in stores.items():
        try:
            same = store.stat().st_ino == inode
        except FileNotFoundError:
            same = False
        if not same:
            raise StoreLostError(
                f"{store} was deleted while the study ran (was {store.parent.name}/ removed?), so nothing more can be "
                f"recorded; stopped{f' after trial {trial}' if trial is not None else ''}. Restore it (from a backup or "
                "the trash) and run the same command again to resume, or start afresh in an empty folder"
            ) from None


class StoppedEarlyError(UserError, RuntimeError):
    """The study ended short of its trials (Ctrl-C, SIGTERM, too many failures): nothing is exported as if complete."""

    label = "stopped early"
    EXIT_CODES: ClassVar[dict[str, int]] = {"interrupted": 130, "terminated": 143, "failures": 4}  # 128 + SIGINT, 128 + SIGTERM

    def __init__(self, message: str, stopped: str) -> None:
        super().__init__(message)
        self.exit_code = self.EXIT_CODES.get(stopped, 4)


def _why(ended: TrialsEnd) -> str:
    if ended.stopped == "terminated":
        return "terminated by SIGTERM"
    return "interrupted" if ended.stopped == "interrupted" else f"{ended.failures} trials of this run failed"


def stopped_message(ended: TrialsEnd, study: optuna.Study, rule: str) -> str:
    """What a study that ended short says (after the label "stopped early"), from its state: the cause, the
    trials complete, and `tune export` only when a complete trial meets the constraints, so there is a winner."""
    requeued = f"; trial {ended.requeued} was aborted and is queued to run again" if ended.requeued is not None else ""
    said = (
        f"{_why(ended)}; {ended.complete} of {ended.target} trials complete{requeued}; nothing exported. "
        "Run the same command again to resume"
    )
    if ended.complete == 0:
        return said
    picked = winner(study, rule)
    if picked is None:
        return said + "; no complete trial meets the constraints yet, so there is no winner to export"
    return said + f", or `tune export --study-name {study.study_name}` to export the winner so far (trial {picked[0].number})"


def _stop_short(ended: TrialsEnd, session: Session) -> NoReturn:
    """Say that the study ended short, mark the MLflow parent run, and end with an error: no export."""
    signalled = ended.stopped in ("interrupted", "terminated")
    why = _why(ended)
    message = stopped_message(ended, session.study, session.settings.selection)
    if not session.settings.worker:
        outcome = f"stopped early ({why}): {ended.complete} of {ended.target} trials"
        session.study.set_user_attr(WINNER_ATTR, f"none yet: the study {outcome} complete")
        session.tracker.finish_study(
            {"complete_trials": ended.complete},
            [],
            {"posfair.outcome": outcome},
            "KILLED" if signalled else "FAILED",
        )
    raise StoppedEarlyError(message, ended.stopped or "failures")


def watch_workers(workers: list[multiprocessing.process.BaseProcess], study: optuna.Study) -> Callable[[], None]:
    """Say at once when a local worker ends other than normally (which one, its pid, its signal or exit code, the
    trial it ran) and fail and re-queue that trial (`fail_dead_trials`), rather than leave it to the heartbeat
    check; returns the call that stops watching (before the workers are stopped on purpose)."""
    stopped = threading.Event()

    def watch() -> None:
        alive = {worker.sentinel: (number, worker) for number, worker in enumerate(workers, start=1)}
        while alive and not stopped.is_set():
            for sentinel in multiprocessing.connection.wait(list(alive), timeout=0.5):
                number, worker = alive.pop(sentinel)  # type: ignore[arg-type]
                worker.join(5)  # reaped (its pipe closes a moment before it can be): a zombie would count as alive
                if stopped.is_set() or not worker.exitcode:
                    continue
                code = worker.exitcode or 0
                how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                running = [
                    t.number
                    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                    if (t.user_attrs.get(OWNER_ATTR) or {}).get("pid") == worker.pid
                ]
                ran = f" while it ran trial {running[0]}" if running else " between trials"
                log.warning("local worker %d (pid %s) %s%s; the study goes on without it", number, worker.pid, how, ran)
                fail_dead_trials(study)

    thread = threading.Thread(target=watch, name="worker-watch", daemon=True)
    if workers:
        thread.start()

    def stop() -> None:
        stopped.set()
        if thread.is_alive():
            thread.join()

    return stop


def start_workers(settings: TuneSettings, count: int) -> list[multiprocessing.process.BaseProcess]:
    """Extra local worker processes on the same study (each loads its own model), each on its own GPU where
    there are several (`worker_devices`: worker i sees only its GPU, as cuda:0; this process keeps the first)."""
    context = multiprocessing.get_context("spawn")
    devices = worker_devices(count + 1)[1:]
    parent = process_identity(settings)
    workers: list[multiprocessing.process.BaseProcess] = [
        context.Process(
            target=_work,
            args=(replace(settings, workers=1, worker=True, array_task=None, worker_id=local_worker_identity(parent, i + 1)),),
            daemon=False,
        )
        for i in range(count)
    ]
    for worker, device in zip(workers, devices):
        with _visible_device(device):
            worker.start()
    return workers


@contextmanager
def _visible_device(device: str | None) -> Iterator[None]:
    """A process started inside sees only `device` (None: the environment as it is); spawn copies the environment."""
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = device
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def _work(settings: TuneSettings) -> None:
    quiet_libraries()
    logging.basicConfig(level=logging.INFO, format="[worker %(process)d] %(message)s", force=True)
    run_as_worker(prepare(settings))


def quiet_libraries() -> None:
    """Keep the log to posfair's own lines: no load reports, progress bars or library chatter."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for handler in logging.getLogger("optuna").handlers:  # a stop or a lost store is said in one line, not a traceback
        handler.addFilter(_no_traceback_for_the_environment)
    threading.excepthook = _thread_error  # Optuna's heartbeat thread writing into a deleted store, say
    for noisy in ("mlflow", "alembic", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # SQLAlchemy logs at ERROR only the cleanup failures it swallows (a cursor whose close a stop interrupted, with
    # a traceback); every failure that matters is raised, and a garbage-collected connection also warns
    logging.getLogger("sqlalchemy").setLevel(logging.CRITICAL)
    # MLflow's SQL store logs a failed write's traceback and SQL before it raises; posfair says it in one line
    logging.getLogger("mlflow.store.db.utils").addFilter(_not_a_lost_store)


def _environment_lost(error: BaseException | None) -> bool:
    """A file or database that went away under the run (not a bug), also as the cause of what a library raised
    (Optuna wraps it in StorageInternalError): said in one line, without a traceback."""
    import sqlalchemy.exc

    while error is not None:
        if isinstance(error, (OSError, sqlalchemy.exc.OperationalError)):
            return True
        error = error.__cause__
    return False


def _thread_error(args: threading.ExceptHookArgs) -> None:
    """A background thread's lost file or database in one line; anything else as Python prints it."""
    if _environment_lost(args.exc_value):
        name = args.thread.name if args.thread is not None else "a background thread"
        log.warning("%s stopped: %s", name, first_line(args.exc_value) or repr(args.exc_value))
        return
    threading.__excepthook__(args)


def _not_a_lost_store(record: logging.LogRecord) -> bool:
    """Drop a library's log of a file or database that went away under the run (it raises that error too)."""
    return not (record.exc_info and _environment_lost(record.exc_info[1]))


def _no_traceback_for_the_environment(record: logging.LogRecord) -> bool:
    """Optuna logs a failed trial's traceback. A stop (Ctrl-C, SIGTERM) or a file or database that went away
    under the run is not a bug: its one line (with the error) is enough, and posfair says the cause and the fix.
    A trial that was never run (`NotRun`, recorded FAIL) did not fail: posfair says why it did not run, and Optuna's
    line is dropped. Any other error keeps its traceback."""
    if record.exc_info and isinstance(record.exc_info[1], NotRun):
        return False
    if record.exc_info and (isinstance(record.exc_info[1], KeyboardInterrupt) or _environment_lost(record.exc_info[1])):
        record.exc_info = None
    return True


def _log_trial(
    study: optuna.Study,
    trial: optuna.trial.FrozenTrial,
    progress: StudyProgress,
    num_layers: int | None = None,
    after: Callable[[int], list[str]] = lambda number: [],
) -> None:
    """One readable line per finished trial, under Optuna's number, with its config (pruned or not), then what it
    queued (`after`: the objective's lines of it) and the study's progress (trials done of --trials, best so far,
    elapsed, ETA)."""
    attrs = trial.user_attrs
    params = {**trial.params, "layers": attrs.get("layers"), "basket_shares": trial_basket_shares(trial)}
    config = describe_config(params, num_layers)
    seconds = trial.duration.total_seconds() if trial.duration else 0.0
    if trial.state == TrialState.COMPLETE and DUPLICATE_ATTR in attrs:
        log.info("trial %d drew the calibration of trial %d again: not run, not counted", trial.number, attrs[DUPLICATE_ATTR])
        return
    if trial.state == TrialState.COMPLETE:
        truncated = int(attrs.get("metrics", {}).get("truncated_documents", 0))
        worst = f"worst-case PSI {attrs['robust_psi']:.3f} on {attrs['worst_structure']} · " if "worst_structure" in attrs else ""
        log.info(
            "trial %d: %sPSI %.3f ± %.3f, HM %.2f, ΔnDCG@10 %+.2f, drift %.4f on the tuning passages · %s · %s · %.0f s%s",
            trial.number,
            worst,
            attrs["psi"],
            attrs.get("psi_se", 0.0),
            100 * attrs["hm"],
            100 * attrs["metrics"].get("ndcg10_delta", 0.0),
            attrs.get("drift", 0.0),
            attrs.get("feasible", "").replace("yes: ", "feasible: ", 1).replace("NO: ", "infeasible: ", 1),
            config,
            seconds,
            f"  {truncated} passages truncated" if truncated else "",
        )
    elif trial.state == TrialState.PRUNED and (pruned := PrunedAt.of_trial(trial)) is not None:
        log.info(
            "trial %d pruned after %s (%s): %s · %s · %.0f s",
            trial.number,
            ", ".join(pruned.scored),
            pruned.where,
            pruned.reason,
            config,
            seconds,
        )
    elif never_ran(trial):
        return
    else:
        log.warning("trial %d %s: %s · %s", trial.number, trial.state.name, attrs.get("failure_reason", "interrupted"), config)
    for line in after(trial.number):
        log.info("%s", line)
    done = min(len(finished(study)), progress.total)
    log.info("after trial %d: %d of %d trials done · %s", trial.number, done, progress.total, progress.status(study))


def _screen(session: Session) -> SideSet | None:
    """The pooled screen of the tuning split (`tuner.evaluation.pools`), when the study prunes and the pool is
    at most `SCREEN_SHARE` of the corpus (a larger one would cost nearly what it saves). Built from the
    uncalibrated ranking, which every process measures alike, so workers and resumed runs share one pool."""
    settings, evaluator = session.settings, session.evaluator
    if not settings.screens:
        return None
    pooled = pool(session.tuning, [evaluator.run(None).run], per_group=settings.screen_queries)
    share = len(pooled.corpus) / len(session.tuning.corpus)
    if share > SCREEN_SHARE:
        if not settings.worker:
            log.info(
                "no pooled screen: a pool of %d queries would hold %.0f%% of %s's passages",
                len(pooled.queries),
                100 * share,
                session.tuning.name,
            )
        return None
    if not settings.worker:
        log.info(
            "pooled screen: %d queries over %d of %s's %d passages (%.0f%%), scored first in every trial",
            len(pooled.queries),
            len(pooled.corpus),
            session.tuning.name,
            len(session.tuning.corpus),
            100 * share,
        )
    return SideSet(
        _evaluator(session.model, settings, pooled, prefix_layers=evaluator.cache.prefix_layers, cache_budget=settings.cache_budget)
    )


def _side_set(model: LoadedModel, settings: TuneSettings, dataset: PositionalDataset | None, **cache: Any) -> SideSet | None:
    """A set scored beside the tuning split every trial, with its uncalibrated scores measured once."""
    if dataset is None:
        return None
    return SideSet(_evaluator(model, settings, dataset, **cache))


def _evaluator(model: LoadedModel, settings: TuneSettings, dataset: PositionalDataset, **cache: Any) -> Evaluator:
    return Evaluator(model, dataset, settings.batch_size, batch_tokens=settings.batch_tokens, **cache)
