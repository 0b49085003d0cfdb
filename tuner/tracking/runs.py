"""MLflow logging: one parent run per study, one nested run per trial, in MLflow's model-training view.

The default store is `./mlruns`: a SQLite file (`mlruns/mlflow.db`) and an artifact folder
(`mlruns/artifacts`) that the store records by a path *relative* to the folder holding `mlruns/`, so a
copied or moved `mlruns/` keeps its artifacts (`tune ui` serves it from there). `--tracking-uri` points
at a server instead (whose artifacts are proxied, `mlflow-artifacts:`, and so portable too).

A trial's run opens when the trial starts (so it shows as running, with its real duration) and closes
with the trial's state. Runs carry a one-sentence description (`mlflow.note.content`), and the baseline,
the paper default, infeasible trials and the winner are marked in run names and tags. Metrics are named
for what they mean and are on the console's scale (nDCG@10 and HM ×100, PSI 0–1); `METRIC_NAMES` maps
the 0–1 names the code uses to them.

Every log is an action of its own (a trial's metrics, its tags, each artifact, the close of its run). If the
server goes away mid-study, or the store's disk fills up, the actions are kept and retried, in order, before
the next one and at the end: finished trials are never lost to a logging failure, and a retried run keeps its
real start and end times. An action MLflow refuses for good (`classify_failure`) is dropped alone, said once
per reason, and the rest go on: a refused artifact still leaves the trial's run closed with its metrics.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from objectives.constraint import CONSTRAINTS
from objectives.selection import RULES, describe_selection_rule
from tuner.common.files import ARTIFACTS, MLFLOW_DB
from tuner.common.messages import UserError, causes, database_locked, disk_full, first_line
from tuner.common.options import check_tracking_uri
from tuner.common.stores import MLFLOW, is_database, require_own_database, schema_version

log = logging.getLogger(__name__)

DEFAULT_TRACKING_URI = f"sqlite:///{MLFLOW_DB}"  # relative: the store moves with its folder
MAX_PARAM_LENGTH = 6000
MAX_TAG_LENGTH = 5000

KIND_TAG = "mlflow.experimentKind"  # MLflow 3 opens an experiment without it in the GenAI view
TRAINING_KIND = "custom_model_development"  # the model-training view (runs, charts, models)
NOTE = "mlflow.note.content"  # the description MLflow shows on a run or experiment page
PARENT = "mlflow.parentRunId"
# A run-list view stored on the experiment: MLflow 3.17's UI applies an experiment tag
# `mlflow.sharedViewState.KEY` (JSON of its view state) when the address carries `viewStateShareKey=KEY`
# (its "share view" feature). It is how a first visit sees the useful columns: the column choice otherwise
# lives in each browser's local storage.
VIEW_KEY = "posfair"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
RUN_LIST_COLUMNS = (
    "worst_structure_psi",
    "psi",
    "hm_x100",
    "feasible",
    "ndcg10_change_vs_uncalibrated_x100",
    "heldout_winner_change_hm_x100",
    "heldout_winner_change_psi",
)
RUN_LIST_VIEW = json.dumps({"selectedColumns": [f"metrics.`{name}`" for name in RUN_LIST_COLUMNS]})


def experiment_note() -> str:
    """The experiment's description: the rule every study applies, built from the constraint list
    (`objectives.constraint.CONSTRAINTS`) and the selection rules (`objectives.selection`), with each study's own
    limits and rule on its parent run."""
    rules = "\n".join(f"- {r.title} ({r.option}): {r.rule}" for r in CONSTRAINTS)
    selection = "\n".join(f"- {rule}{' (the default)' if rule == RULES[0] else ''}: {describe_selection_rule(rule)}" for rule in RULES)
    return f"""posfair tunes attention calibration (Michail et al., 2026) per model with Optuna.
One parent run per study (its rule and limits, the winner, held-out figures with 95% bootstrap intervals, plots,
the exported YAML), one nested run per trial (its config, figures and attention profile).

Objective: minimise **worst_structure_psi**, the worst PSI over the tuning structures (the tuning passages as
they are and rebuilt otherwise: crops, openings, packed passages, or length halves; the tuning passages alone
with --no-structures). PSI (Position Sensitivity Index) = 1 - min/max of nDCG@10 over the position groups
(0 = position-fair); HM = their harmonic mean. Subject to these constraints, each where its option is set:
{rules}

The winner (--selection) is not simply the lowest objective: the tuning split is small, and a lower value
within its noise is as likely luck as merit. It is
{selection}

`feasible` = 1 when a trial meets every constraint it was checked on; its description names each one and how
close it came. A pruned trial stopped after the rungs (structures) that showed it cannot win: its run says
`pruned`, its figures are all under `pruned/` (a worst case over fewer structures is a lower bound, not a result;
`pruned/structure/...` per structure scored), and it is never a candidate. nDCG@10, HM and
recall are x100 (points, as the console prints them); PSI and drift are 0-1; λ is the parameter `lambda_strength`.
Run names mark the baseline (trial 0, no calibration), the paper default (trial 1), infeasible and pruned trials, and
the winner first of all (`winner · trial-N`), which is registered as the model posfair-MODEL with the alias
`champion`."""


EXPERIMENT_NOTE = experiment_note()


class TrackingUnavailableError(UserError, RuntimeError):
    """The tracking server or store cannot be used; the message names it and the fix."""


def default_tracking_uri() -> str:
    """The default store, relative to the working folder (nothing is created here)."""
    return DEFAULT_TRACKING_URI


def local_store(uri: str) -> Path | None:
    """The SQLite file of a local tracking URI, None for a server."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def describe_store(uri: str) -> str:
    """Where a tracking URI's runs live, for people: the absolute folder of a local store."""
    path = local_store(uri)
    if path is None:
        return uri
    state = "" if path.exists() else ", created when the first trial starts"
    return f"{uri}  ({path.resolve()}{state})"


def ui_command(uri: str, host: str, port: int) -> list[str]:
    """`mlflow ui` on a store; started in the working folder, where the default store's relative paths resolve.
    One server worker: the UI serves one person's browser, and each of MLflow's default four imports the whole
    server at start (on 2 cores, four took about twice as long to answer as one)."""
    import sys

    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port), "--workers", "1"]
    store = local_store(uri)
    if store is not None:
        command += ["--default-artifact-root", str((store.parent / ARTIFACTS.name).resolve())]
    return command


JOB_EXECUTION_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"


def ui_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment `mlflow ui` runs in: MLflow's job runner off unless the user set it. posfair's runs use no
    MLflow job (GenAI scorers, trace roll-ups), and the runner starts eight processes that each import MLflow: the
    UI answered in 10.3 s against 12.8 s with it, having used 10 s of CPU against 35 (`benchmarks/ui_start.py`)."""
    return {**environ, JOB_EXECUTION_ENV: environ.get(JOB_EXECUTION_ENV, "false")}


def serve_ui(command: list[str], grace: float = 10.0) -> int:
    """Run `mlflow ui` in its own process group until it exits or this process gets SIGTERM / SIGINT; then
    stop the whole group (the server and the workers it forks; SIGKILL after `grace` seconds), so no
    worker outlives `tune ui` and keeps the port. Returns the server's exit code (128 + signal if stopped)."""
    import signal

    server = subprocess.Popen(command, start_new_session=True, env=ui_environment(os.environ))
    stopped: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        stopped.append(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while server.poll() is None and not stopped:
            time.sleep(0.2)
        _stop_group(server, grace)
        server.wait()
        return 128 + stopped[0] if stopped else server.returncode
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop_group(leader: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM to every process of the leader's group, SIGKILL to what is left after `grace` seconds; the
    leader is reaped on the way (a zombie would still count as a member)."""
    import signal

    for signum, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        deadline = time.monotonic() + wait
        try:
            os.killpg(leader.pid, signum)
        except ProcessLookupError:
            return
        while time.monotonic() < deadline:
            leader.poll()
            try:
                os.killpg(leader.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def check_store_schema(uri: str) -> None:
    """A database store must be MLflow's (`require_own_database`) and have the schema this MLflow reads: on any
    other, MLflow's server starts and then fails on every page, and MLflow's own message advises
    `mlflow db upgrade` even for a store a newer MLflow wrote, which no upgrade can take back."""
    import mlflow
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    if not is_database(uri):
        return
    require_own_database(uri, MLFLOW)
    version = schema_version(uri)
    if version is None:  # a new store: MLflow makes its tables
        return
    migrations = ScriptDirectory.from_config(_get_alembic_config(uri))
    head = migrations.get_current_head()
    if version == head:
        return
    where = f"the MLflow store {describe_store(uri)}"
    if version in {revision.revision for revision in migrations.walk_revisions()}:
        raise TrackingUnavailableError(
            f"{where} was written by an older MLflow (schema {version}; MLflow {mlflow.__version__} reads {head}): "
            f"back it up, then upgrade it: mlflow db upgrade {uri}"
        )
    raise TrackingUnavailableError(
        f"{where} has schema {version}, unknown to this MLflow ({mlflow.__version__}): a newer MLflow wrote it, and "
        "no command takes a store back. Read it with that MLflow (pip install -U mlflow in this environment), or "
        "give another --tracking-uri"
    )


def training_view_url(uri: str, host: str, port: int) -> str:
    """The experiment's run list in MLflow's model-training view, with posfair's columns (`VIEW_TAG`).
    MLflow 3.17's UI picks the view from the URL's `workflowType` first, then from the browser's last
    choice (default: GenAI); the experiment's `mlflow.experimentKind` tag does not decide it, so the link
    carries it."""
    found = None
    store = local_store(uri)
    if store is None or store.exists():
        try:
            found = MlflowClient(f"sqlite:///{store.resolve()}" if store else uri).get_experiment_by_name("posfair")
        except Exception:  # noqa: BLE001 - the link is a convenience; the UI itself reports a broken store
            found = None
    if found is None:
        return f"http://{host}:{port}/#/experiments?workflowType=machine_learning"
    view = f"&viewStateShareKey={VIEW_KEY}" if VIEW_TAG in found.tags else ""
    return f"http://{host}:{port}/#/experiments/{found.experiment_id}/runs?workflowType=machine_learning{view}"


# --- metric names: the code's 0-1 names → names that say what they are, on the console's scale ----------

_POINTS = 100.0
METRIC_NAMES: dict[str, tuple[str, float]] = {
    "psi": ("psi", 1.0),
    "psi_se": ("psi_std_error", 1.0),
    "hm": ("hm_x100", _POINTS),
    "hm_low": ("hm_lower_bound_x100", _POINTS),
    "hm_floor": ("hm_floor_x100", _POINTS),
    "ndcg10": ("ndcg10_x100", _POINTS),
    "recall10": ("recall10_x100", _POINTS),
    "n_queries": ("queries", 1.0),
    "ndcg10_delta": ("ndcg10_change_vs_uncalibrated_x100", _POINTS),
    "general_ndcg10_delta": ("general_ndcg10_change_vs_uncalibrated_x100", _POINTS),
    "ndcg10_delta_high": ("ndcg10_change_upper_bound_x100", _POINTS),
    # Optuna's constraints are <= 0 when met; as margins they read the other way round: >= 0 is met
    "constraint_hm_floor": ("hm_margin_over_floor_x100", -_POINTS),
    "constraint_ndcg_drop": ("ndcg10_drop_allowance_left_x100", -_POINTS),
    "constraint_general_drop": ("general_ndcg10_drop_allowance_left_x100", -_POINTS),
    "constraint_reversal": ("tilt_reversal_allowance_left_x100", -_POINTS),
    "constraint_structure_ndcg": ("structure_ndcg10_drop_allowance_left_x100", -_POINTS),
    "constraint_drift": ("drift_allowance_left_x_paper_default", -1.0),
    "robust_psi": ("worst_structure_psi", 1.0),
    "robust_psi_se": ("worst_structure_psi_std_error", 1.0),
    "reversal": ("tilt_reversal_x100", _POINTS),
    "drift": ("drift_from_uncalibrated_vectors", 1.0),
    "feasible": ("feasible", 1.0),
    "encode_seconds": ("encode_seconds", 1.0),
    "truncated_documents": ("truncated_documents", 1.0),
    "psi_fifths": ("psi_over_fifths", 1.0),
    "tilt": ("tilt_x100", _POINTS),
    "profile_first_bin_mass": ("last_layer_attention_on_first_tenth_pct", _POINTS),
    "profile_last_bin_mass": ("last_layer_attention_on_last_tenth_pct", _POINTS),
}


def metric_name(name: str) -> tuple[str, float]:
    """(display name, factor) of one 0-1 metric; per-group nDCG@10, query counts and token masses by pattern."""
    prefix, _, tail = name.rpartition("/")
    if prefix:
        shown, factor = metric_name(tail)
        return f"{prefix}/{shown}", factor
    if name in METRIC_NAMES:
        return METRIC_NAMES[name]
    if name.startswith("ndcg10_"):
        return f"{name}_x100", _POINTS
    if name.startswith("n_"):
        return f"queries_{name[2:]}", 1.0
    if name.startswith("profile_") and name.endswith("_token_mass"):
        return f"last_layer_attention_on_{name.removeprefix('profile_').removesuffix('_mass')}_pct", _POINTS
    return name, 1.0


SHOWN_DIGITS = 4
"""Significant digits of a metric as MLflow stores and shows it: beyond the console's (PSI 0.265, HM 57.17) and
below the noise of any figure posfair logs; whole numbers (passages, layer-tokens) keep every digit."""


def significant(value: float) -> float:
    """`value` to `SHOWN_DIGITS` significant digits, never fewer than its integer part: MLflow's run list and
    charts print a stored float whole (57.171079012…), so the store holds what is worth reading."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, max(0, SHOWN_DIGITS - 1 - math.floor(math.log10(abs(value)))))


REFUSED_IN_NAMES = re.compile(r"[^\w\-. :/]")
"""What MLflow refuses in a metric's name (it takes letters, digits, `_ - . : /` and spaces): a dataset's name, which
reaches metric names (`structure/<name>/psi`), may hold more (`wikipos-dev+titles`, a path)."""


def _stored(metrics: Mapping[str, float], timestamp: int) -> list[Metric]:
    """Display-named metrics as MLflow gets them: each to `significant` digits, all at one time, every character
    MLflow refuses in a name stored as `_` (one refused name would drop the whole batch)."""
    return [Metric(REFUSED_IN_NAMES.sub("_", name), significant(float(value)), timestamp, 0) for name, value in metrics.items()]


def display_metrics(values: Mapping[str, float], prefix: str = "") -> dict[str, float]:
    """0-1 metrics as MLflow shows them: self-explanatory names, on the console's scale."""
    shown = {}
    for name, value in values.items():
        key, factor = metric_name(name)
        shown[prefix + key] = float(value) * factor
    return shown


def summary_metrics(
    prefix: str, report: Mapping[str, float | None], intervals: Mapping[str, tuple[float, float, float]] | None
) -> dict[str, float]:
    """A config's headline figures under `prefix/` and, with `intervals` (metric → estimate, low, high: the
    change against no calibration), `prefix/change_<metric>` with `_ci_low` / `_ci_high`."""
    headline = {k: v for k, v in report.items() if v is not None and "/" not in k and not k.startswith("n_")}
    shown = display_metrics(headline, f"{prefix}/")
    for metric, (estimate, low, high) in (intervals or {}).items():
        name, factor = metric_name(metric)
        shown |= {
            f"{prefix}/change_{name}": estimate * factor,
            f"{prefix}/change_{name}_ci_low": low * factor,
            f"{prefix}/change_{name}_ci_high": high * factor,
        }
    return shown


# --- descriptions ------------------------------------------------------------------------------------

VARIANTS = {"uniform": "Uniform", "cls_soft": "CLS-Soft", "cls_hard": "CLS-Hard"}


def describe_config(params: Mapping[str, object], num_layers: int | None = None) -> str:
    """A trial's config in words, e.g. 'CLS-Soft, λ 0.55 on layers [4, 5], baskets of 256 tokens (equal shares)'."""
    strength = float(params.get("strength", 0.0))  # type: ignore[arg-type]
    if strength == 0:
        return "no calibration (λ 0)"
    variant = VARIANTS.get(str(params.get("variant")), str(params.get("variant")))
    if params.get("variant") == "cls_hard" and "weight" in params:
        variant += f" (w {float(params['weight']):.2f})"  # type: ignore[arg-type]
    layers = params.get("layers")
    where = f"layers {layers}" + (f" of {num_layers}" if num_layers else "") if layers is not None else f"depth {params.get('depth')}"
    shares = f" ({params['basket_shares']} shares)" if params.get("basket_shares") else ""
    return f"{variant}, λ {strength:.2f} on {where}, baskets of {params.get('basket_size')} tokens{shares}"


def describe_outcome(metrics: Mapping[str, float], worst: str, feasibility: str) -> str:
    """What a complete trial scored and whether it is feasible, in the console's words and scale: its objective
    (the worst PSI over the tuning structures, and on which), the tuning passages' own PSI and HM, then
    `feasibility` (`Constraints.explain`: every constraint checked, how it was met or missed)."""
    return (
        f"worst-case PSI {metrics['robust_psi']:.3f} (on {worst}; lower is fairer), PSI {metrics['psi']:.3f} and "
        f"HM {100 * metrics['hm']:.2f} on the tuning passages; {feasibility}"
    )


RUN_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "FINISHED", "FAIL": "FAILED"}
"""A trial's Optuna state → its MLflow run status. A pruned trial ran as far as it had to and ended as designed:
FINISHED, as Optuna's own MLflow callback and Ray Tune's log an early-stopped trial (MLflow's KILLED means "killed by
user", a red cross that users read as a crash); its name says `pruned` and the tag `posfair.state` PRUNED."""


def run_name(number: int, markers: list[str]) -> str:
    """'trial-6', or with its markers: 'trial-0 · baseline', 'trial-3 · infeasible'; the winner's starts with its role,
    'winner · trial-2 · paper default', so the run list, which cuts long names, shows it."""
    first = ["winner"] if "winner" in markers else []
    return " · ".join([*first, f"trial-{number}", *(m for m in markers if m != "winner")])


@dataclass
class TrialRecord:
    """Everything one trial logs at its end; kept until MLflow has accepted it."""

    number: int
    state: str  # COMPLETE, PRUNED or FAIL (Optuna's names; `RUN_STATUS` gives MLflow's)
    params: dict[str, object]
    metrics: dict[str, float]  # 0-1 names (`display_metrics` renames them)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: list[Path] = field(default_factory=list)
    description: str = ""
    markers: list[str] = field(default_factory=list)
    start_ms: int = 0
    end_ms: int = field(default_factory=lambda: int(time.time() * 1000))


class Tracker:
    """Logs a study and its trials to MLflow through the client API (no global fluent state).

    Nothing is created until the first write: a run that fails before its study starts leaves no
    store behind. A server is checked at once, so an unreachable one fails before any work, and so is a
    database store (`check_store_schema`): MLflow's client opens a store of another schema without a word,
    and its writes then fail one by one.
    """

    def __init__(self, tracking_uri: str | None, experiment: str) -> None:
        self.uri = tracking_uri or default_tracking_uri()
        check_tracking_uri(self.uri)
        check_store_schema(self.uri)  # a study database, or a store of another MLflow: before MLflow writes to it
        self.experiment_name = experiment
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # its bars would garble the log
        if self.uri.startswith(("http://", "https://")):
            # A lost server must cost a trial seconds, not MLflow's default minutes of retries.
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")
            _check_server(self.uri)
        self._client: MlflowClient | None = None
        self._store_uri = self.uri
        self._pending: list[_Action] = []
        self._refusals: set[str] = set()  # the reasons of the refusals said so far: each is said once
        self._experiment_id: str | None = None
        self._trial_runs: dict[int, str] = {}
        self.parent_id: str | None = None

    @property
    def client(self) -> MlflowClient:
        """The MLflow client; the first use opens (or creates) the store and the experiment."""
        if self._client is None:
            _ = self.experiment_id
        assert self._client is not None
        return self._client

    @property
    def store_uri(self) -> str:
        """The URI the client opened: a local store by its absolute path. Whatever MLflow reaches through its
        global tracking URI must use this one, or a relative default would reach the folder that used it first."""
        _ = self.client
        return self._store_uri

    @property
    def experiment_id(self) -> str:
        """The experiment, created (in the model-training view) on first use."""
        if self._experiment_id is None:
            try:
                with _store_lock(self.uri):  # processes starting together must not race to create a new store
                    store = local_store(self.uri)
                    if store is not None:
                        store.parent.mkdir(parents=True, exist_ok=True)
                    # a client with a registry URI creates the registry's tables at once: only under the lock.
                    # It opens the store by its absolute path: MLflow caches one store per URI string per
                    # process, so the relative default would reach whichever folder used it first.
                    self._store_uri = f"sqlite:///{store.resolve()}" if store is not None else self.uri
                    self._client = MlflowClient(self._store_uri, registry_uri=self._store_uri)
                    self._experiment_id = self._open_experiment()
            except Exception as error:  # noqa: BLE001 - any failure here means the store is unusable
                fix = (
                    "Another process keeps it locked: finish or close what holds it, then run the same command again."
                    if database_locked(error)
                    else "Start the server or fix --tracking-uri."
                )
                raise TrackingUnavailableError(
                    f"cannot use the MLflow tracking store {self.uri!r} ({error.__class__.__name__}: {first_line(error)}). {fix}"
                ) from None
        return self._experiment_id

    def _open_experiment(self) -> str:
        store = local_store(self.uri)
        found = self.client.get_experiment_by_name(self.experiment_name)
        if found is None:
            try:
                experiment_id = self.client.create_experiment(
                    self.experiment_name, tags={KIND_TAG: TRAINING_KIND, NOTE: EXPERIMENT_NOTE, VIEW_TAG: RUN_LIST_VIEW}
                )
            except Exception as error:  # noqa: BLE001 - another worker just created it: use theirs
                found = self.client.get_experiment_by_name(self.experiment_name)
                if found is None or "already exists" not in str(error).lower():
                    raise
                return found.experiment_id
            if store is not None:
                _artifacts_beside_store(self.uri, store, experiment_id)
            return experiment_id
        for key, value in {KIND_TAG: TRAINING_KIND, NOTE: EXPERIMENT_NOTE, VIEW_TAG: RUN_LIST_VIEW}.items():
            if found.tags.get(key) != value:  # a store made by an older posfair
                self.client.set_experiment_tag(found.experiment_id, key, value)
        return found.experiment_id

    # --- the study's parent run -------------------------------------------------------------------

    def start_study(self, study: str, params: dict[str, object], tags: dict[str, str], description: str = "") -> str:
        """Open (or, on resume, reopen) the study's parent run; processes starting together on a local store
        take its lock, so they share one parent run."""
        experiment_id = self.experiment_id  # opened first: the store lock below is not re-entrant
        with _store_lock(self.uri):
            existing = self.client.search_runs(
                [experiment_id], f"tags.`posfair.study` = '{study}' and tags.`posfair.role` = 'study'", max_results=1
            )
            if existing:
                self.parent_id = existing[0].info.run_id
                self.client.update_run(self.parent_id, status="RUNNING")
            else:
                extra = {NOTE: description} if description else {}
                run = self.client.create_run(
                    experiment_id, run_name=study, tags={"posfair.study": study, "posfair.role": "study", **tags, **extra}
                )
                self.parent_id = run.info.run_id
                self.client.log_batch(self.parent_id, params=_params(params))
        return self.parent_id

    def finish_study(self, metrics: dict[str, float], artifacts: list[Path], tags: dict[str, str], status: str = "FINISHED") -> None:
        """Log the study's figures (already display-named), artifacts and tags, and close the parent run."""
        run = self.parent_id
        assert run is not None
        now = int(time.time() * 1000)
        self._submit("the study's figures", lambda: self.client.log_batch(run, metrics=_stored(metrics, now)))
        self._submit("the study's tags", lambda: self.client.log_batch(run, tags=_tags(tags)))
        for path in artifacts:
            self._submit(f"the study's {path.name}", partial(self._log_artifact, run, path))
        self._submit(f"the close of the study's run ({status})", lambda: self.client.set_terminated(run, status))
        self.flush()

    # --- trial runs -------------------------------------------------------------------------------

    def start_trial(
        self, study: str, number: int, params: dict[str, object], description: str, markers: list[str], tags: dict[str, str] | None = None
    ) -> str | None:
        """Open the trial's run now (shown as running); its id, or None while MLflow is unreachable."""
        start = int(time.time() * 1000)
        self._submit(f"trial {number}'s run", lambda: self._open_trial(study, number, params, description, markers, tags or {}, start))
        return self._trial_runs.get(number)

    def finish_trial(self, study: str, record: TrialRecord) -> None:
        """Log a trial's outcome to its run and close it with the trial's state, one action per log (see the
        module's docstring). A run found closed already (a resumed study's) is left alone; one that was never
        opened (an outage, then a restart) is opened first, with the trial's own start."""
        number = record.number
        found: list[str] = []  # the trial's open run, once `find` has looked it up

        def find() -> None:
            run_id = self._trial_runs.get(number) or self._existing_trial_run(study, number)
            if run_id is None:
                self._open_trial(study, number, record.params, record.description, record.markers, {}, record.start_ms or record.end_ms)
                run_id = self._trial_runs[number]
            elif self.client.get_run(run_id).info.status in ("FINISHED", "FAILED", "KILLED"):
                return
            found.append(run_id)

        def on_run(action: Callable[[str], object]) -> Callable[[], None]:
            def act() -> None:
                if found:
                    action(found[0])

            return act

        tags = {"posfair.state": record.state, NOTE: record.description, **record.tags}
        self._submit(f"trial {number}'s run", find)
        metrics = _stored(display_metrics(record.metrics), record.end_ms)
        self._submit(f"trial {number}'s metrics", on_run(lambda run: self.client.log_batch(run, metrics=metrics)))
        self._submit(f"trial {number}'s tags", on_run(lambda run: self.client.log_batch(run, tags=_tags(tags))))
        self._submit(f"trial {number}'s name", on_run(lambda run: self.client.update_run(run, name=run_name(number, record.markers))))
        for path in record.artifacts:
            self._submit(f"trial {number}'s {path.name}", on_run(partial(self._log_artifact, path=path)))
        status = RUN_STATUS.get(record.state, "FAILED")
        self._submit(
            f"the close of trial {number}'s run ({status})",
            on_run(lambda run: self.client.set_terminated(run, status, end_time=record.end_ms)),
        )

    def _log_artifact(self, run: str, path: Path) -> None:
        self.client.log_artifact(run, str(path))

    def trial_run_id(self, number: int) -> str | None:
        return self._trial_runs.get(number)

    def find_trial_run(self, study: str, number: int) -> str | None:
        """The run of `study`'s trial `number`, opened by this process or another (None: MLflow has none)."""
        return self._trial_runs.get(number) or self._existing_trial_run(study, number)

    def _open_trial(
        self, study: str, number: int, params: dict[str, object], description: str, markers: list[str], tags: dict[str, str], start: int
    ) -> None:
        assert self.parent_id is not None
        run_id = self._existing_trial_run(study, number)
        if run_id is None:
            run = self.client.create_run(
                self.experiment_id,
                run_name=run_name(number, markers),
                start_time=start,
                tags={
                    PARENT: self.parent_id,
                    "posfair.study": study,
                    "posfair.role": "trial",
                    "posfair.trial": str(number),
                    "posfair.state": "RUNNING",
                    NOTE: description,
                    **tags,
                },
            )
            run_id = run.info.run_id
            self.client.log_batch(run_id, params=_params(params))
        elif not self.client.get_run(run_id).data.params:  # opened just before an outage cut off its params
            self.client.log_batch(run_id, params=_params(params))
        self._trial_runs[number] = run_id

    def _existing_trial_run(self, study: str, number: int) -> str | None:
        """The run of this study's trial `number` if one was opened (by this process or before a restart)."""
        query = f"tags.`posfair.study` = '{study}' and tags.`posfair.trial` = '{number}'"
        runs = self.client.search_runs([self.experiment_id], query)
        return runs[0].info.run_id if runs else None

    def mark_trial(self, study: str, number: int, markers: list[str], tags: dict[str, str], description: str) -> None:
        """Re-mark a closed trial's run (the winner, known only at the end)."""

        def mark() -> None:
            run_id = self._trial_runs.get(number) or self._existing_trial_run(study, number)
            if run_id is None:
                return
            self.client.update_run(run_id, name=run_name(number, markers))
            for key, value in {**tags, NOTE: description}.items():
                self.client.set_tag(run_id, key, value[:MAX_TAG_LENGTH])

        self._submit(f"trial {number}'s winner mark", mark)

    def close_stale_trials(self, study: str, failed: list[int]) -> None:
        """Close the runs of trials Optuna failed elsewhere (a killed worker's): they would show as running forever."""

        def close() -> None:
            for number in failed:
                run_id = self._trial_runs.get(number) or self._existing_trial_run(study, number)
                if run_id is not None and self.client.get_run(run_id).info.status == "RUNNING":
                    self.client.set_tag(run_id, "posfair.state", "FAIL")
                    self.client.set_tag(run_id, NOTE, f"Trial {number} failed: its worker stopped answering (missed heartbeats).")
                    self.client.set_terminated(run_id, "KILLED")

        if failed:
            self._submit(f"the close of the runs of trials {failed} (failed elsewhere)", close)

    # --- retries ----------------------------------------------------------------------------------

    def flush(self) -> bool:
        """Retry everything MLflow has not accepted yet, in order; True when nothing is left pending.

        Only an outage or a full disk keeps an action (and those after it) for the next flush. An action MLflow
        refuses for any other reason would fail the same way forever and hold back every later log: it is
        dropped, its reason said once, and the rest go on.
        """
        while self._pending:
            action = self._pending[0]
            try:
                action.run()
            except TrackingUnavailableError:
                raise
            except Exception as error:  # noqa: BLE001 - neither a dead server nor a refused log may end the study
                failure = classify_failure(error)
                if failure == "outage" and database_locked(error):
                    log.warning(
                        "MLflow's store %s is locked by another process; %d log(s) kept for retry",
                        describe_store(self.uri),
                        len(self._pending),
                    )
                    return False
                if failure == "outage":
                    log.warning("MLflow still unreachable (%s); %d log(s) kept for retry", error.__class__.__name__, len(self._pending))
                    return False
                if failure == "disk full":
                    log.warning(
                        "MLflow cannot write %s: the disk is full (%s); %d log(s) kept and retried before each later log "
                        "and at the end: free space on that disk",
                        _full_file(error) or describe_store(self.uri),
                        first_line(error),
                        len(self._pending),
                    )
                    return False
                reason = f"{error.__class__.__name__}: {first_line(error)}"
                if reason not in self._refusals:
                    self._refusals.add(reason)
                    log.warning(
                        "MLflow refused %s, dropped (%s); the other logs go on (later logs refused the same way are "
                        "dropped without repeating this)",
                        action.what,
                        reason,
                    )
            self._pending.pop(0)
        return True

    def _submit(self, what: str, action: Callable[[], object]) -> None:
        """Queue one log (`what` names it for people) and try everything pending."""
        self._pending.append(_Action(what, action))
        self.flush()


@dataclass(frozen=True)
class _Action:
    """One log call the tracker keeps until MLflow accepts or refuses it for good."""

    what: str  # e.g. "trial 3's metrics"
    run: Callable[[], object]


def _tags(values: Mapping[str, str]) -> list[RunTag]:
    return [RunTag(k, v[:MAX_TAG_LENGTH]) for k, v in values.items()]


Failure = Literal["outage", "disk full", "refused"]

_SCHEMA_SIGNS = ("no such column", "no such table", "has no column named", "does not exist", "doesn't exist", "unknown column")
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


def _full_file(error: BaseException) -> str | None:
    """The file a full disk refused, when the error names it (an artifact's copy does)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.filename:
            return str(seen.filename)
        seen = seen.__cause__ or seen.__context__
    return None


def _artifacts_beside_store(uri: str, store: Path, experiment_id: str) -> None:
    """Keep a SQLite store's artifacts in `artifacts/` beside it, recorded relative to the working folder
    when the store was given relatively (the default `mlruns/`).

    MLflow resolves a relative artifact location to an absolute one when it creates an experiment (and
    without one uses `./mlruns` of whatever folder the run started in), which ties every artifact to that
    folder. Runs and logged models inherit their experiment's location, so one entry, written right after
    creation, makes the default store relocatable: `tune ui` (and `mlflow server` started beside `mlruns/`)
    resolves it where it now is.
    """
    import sqlalchemy

    folder = store.parent / ARTIFACTS.name / experiment_id
    location = folder.as_uri() if store.is_absolute() else folder.as_posix()
    engine = sqlalchemy.create_engine(uri)
    try:
        with engine.begin() as connection:
            connection.execute(
                sqlalchemy.text("UPDATE experiments SET artifact_location = :location WHERE experiment_id = :id"),
                {"location": location, "id": int(experiment_id)},
            )
    finally:
        engine.dispose()


@contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """An exclusive file lock beside a SQLite store while it is opened (and maybe created)."""
    store = local_store(uri)
    if store is None:
        yield
        return
    lock_path = Path(f"{store}.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _check_server(uri: str) -> None:
    """Fail fast, before any work, when the tracking server does not answer."""
    import requests

    try:
        requests.get(uri.rstrip("/") + "/health", timeout=5).raise_for_status()
    except requests.RequestException as error:
        raise TrackingUnavailableError(
            f"the MLflow tracking server {uri} does not answer ({error.__class__.__name__}). "
            "Start it (e.g. `mlflow server --host 127.0.0.1 --port 5000`) or fix --tracking-uri."
        ) from None


PARAM_NAMES = {"strength": "lambda_strength"}
"""Trial parameters MLflow shows under another name. Its compare view plots the first three parameters that differ
between the runs in alphabetical order (MLflow 3.17's parallel-coordinates panel): `lambda_strength` sorts among them
(after `basket_size` and `depth`), where `strength` sorted behind `layers`."""


def _params(values: dict[str, object]) -> list[Param]:
    return [Param(PARAM_NAMES.get(k, k), str(v)[:MAX_PARAM_LENGTH]) for k, v in values.items()]
