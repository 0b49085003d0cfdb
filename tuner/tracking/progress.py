"""Study progress a person can follow: a line per finished trial (k/N, best feasible so far, elapsed, ETA)
that reaches a log file as well as a terminal, and on a terminal a progress bar drawn by the same rich
console as the log lines, so neither overwrites the other.
"""

from __future__ import annotations

import logging
import time
from types import TracebackType
from typing import TYPE_CHECKING

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.common.trials import finished, trials_spent

if TYPE_CHECKING:
    from tuner.evaluation.cost import StudyCost

log = logging.getLogger(__name__)


def clock(seconds: float) -> str:
    """12 s, 4m05s, 1h02m."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def logging_console() -> object | None:
    """The rich console the root logger writes through, if it is a terminal (else: no bar)."""
    from rich.logging import RichHandler

    for handler in logging.getLogger().handlers:
        if isinstance(handler, RichHandler) and handler.console.is_terminal:
            return handler.console
    return None


class StudyProgress:
    """Counts complete trials towards `total` (those done before a resume included) and times the rest; with a
    `allowance` (the layer-tokens the trials may spend under `--budget`), also what of it is spent; with the `estimate`
    printed before the study (`StudyCost`), the held-out scoring after the trials, at the pace the trials measured."""

    def __init__(
        self,
        total: int,
        done: int,
        *,
        bar: bool = True,
        workers: int = 1,
        allowance: int | None = None,
        estimate: StudyCost | None = None,
    ) -> None:
        self.total, self.done_at_start, self.workers = total, done, workers
        self.allowance, self.estimate = allowance, estimate
        self.started = time.monotonic()
        self._bar = bar
        self._progress: object | None = None
        self._task: object | None = None

    def __enter__(self) -> StudyProgress:
        console = logging_console() if self._bar else None
        if console is not None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            columns = (TextColumn("trials"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            progress = Progress(*columns, console=console, transient=True)  # type: ignore[arg-type]
            progress.start()
            self._task = progress.add_task("trials", total=self.total, completed=self.done_at_start)
            self._progress = progress
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()  # type: ignore[attr-defined]

    def status(self, study: optuna.Study) -> str:
        """'best feasible so far: trial 3 (worst-case PSI 0.052, HM 56.90) · elapsed 2m10s · ETA 6m30s' (and the bar
        moves)."""
        done = min(len(finished(study)), self.total)
        if self._progress is not None:
            self._progress.update(self._task, completed=done)  # type: ignore[attr-defined]
        elapsed = time.monotonic() - self.started
        spent, used = "", trials_spent(study) if self.allowance is not None else 0
        if self.allowance is not None:
            spent = (
                f" · {used / 1e6:.2f}M of the trials' budget of {self.allowance / 1e6:.2f}M layer-tokens "
                f"({used / self.allowance:.0%})"
            )
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        return f"{best_so_far(complete)} · elapsed {clock(elapsed)}{spent} · {self.eta(finished(study), done, used)}"

    def eta(self, trials: list[FrozenTrial], done: int, used: int = 0) -> str:
        """The remaining trials at the mean duration of the calibrating trials so far, pruned ones included (the
        baseline, λ 0, reuses cached vectors and says nothing of a trial's cost), shared by the workers; with a budget,
        of which the trials have `used` so much, no more trials than its rest buys at their mean layer-tokens. With the
        estimate, the held-out scoring follows at the pace the trials measured (seconds per layer-token), and the
        measured duration of a complete trial stands beside the estimated one."""
        calibrating = [t for t in trials if t.duration is not None and t.params.get("strength", 1) != 0]
        held = self._heldout_seconds(calibrating)
        if done >= self.total:
            return "trials done" + (f"; held-out scoring ≈ {clock(held)}" if held is not None else "")
        if not calibrating:
            return "ETA after the first calibrating trial"
        remaining: float = self.total - done
        if self.allowance is not None:
            per_trial = sum(int(t.user_attrs.get("layer_tokens", 0)) for t in calibrating) / len(calibrating)
            remaining = min(remaining, max(self.allowance - used, 0) / max(per_trial, 1.0))
        seconds = sum(_seconds(t) for t in calibrating) / len(calibrating)
        text = f"ETA {clock(seconds * remaining / self.workers + (held or 0.0))}"
        if held is None or self.estimate is None:
            return text
        whole = [_seconds(t) for t in calibrating if t.state == TrialState.COMPLETE]
        pace = (
            f"{clock(sum(whole) / len(whole))} per complete trial, estimated ≈ {clock(self.estimate.trial_seconds)}"
            if whole
            else ""
        )
        return f"{text} with held-out scoring (≈ {clock(held)}), at the pace measured so far" + (
            f" ({pace})" if pace else ""
        )

    def _heldout_seconds(self, calibrating: list[FrozenTrial]) -> float | None:
        """The held-out scoring's estimated layer-tokens at the trials' measured seconds per layer-token (None:
        no estimate, nothing held out, or no trial measured yet)."""
        if self.estimate is None or not self.estimate.heldout_layer_tokens:
            return None
        tokens = sum(int(t.user_attrs.get("layer_tokens", 0)) for t in calibrating)
        if tokens <= 0:
            return None
        return self.estimate.heldout_layer_tokens * sum(_seconds(t) for t in calibrating) / tokens


def _seconds(trial: FrozenTrial) -> float:
    return trial.duration.total_seconds() if trial.duration is not None else 0.0


def best_so_far(complete: list[FrozenTrial]) -> str:
    """The feasible complete trial with the lowest objective (the worst PSI over the structures), in words."""
    feasible = [t for t in complete if "psi" in t.user_attrs and all(c <= 0 for c in t.constraints.values())]
    if not feasible:
        return "no feasible trial yet"
    best = min(feasible, key=lambda t: t.user_attrs.get("robust_psi", t.user_attrs["psi"]))
    objective = best.user_attrs.get("robust_psi", best.user_attrs["psi"])
    return (
        f"best feasible so far: trial {best.number} "
        f"(worst-case PSI {objective:.3f}, HM {100 * best.user_attrs['hm']:.2f})"
    )


class Phase:
    """A phase of the run, logged when it starts and when it ends (with its duration)."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> Phase:
        self.started = time.monotonic()
        log.info("%s ...", self.what)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if kind is None:
            log.info("%s: done in %s", self.what, clock(time.monotonic() - self.started))
