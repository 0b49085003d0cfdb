"""A study that ends short of its trials (Ctrl-C, SIGTERM, too many failures): said with its cause and what to run
next, its parent run marked, and nothing exported as if it were complete."""

from __future__ import annotations

from typing import ClassVar, NoReturn

import optuna

from tuner.common.messages import UserError
from tuner.tuning.candidates import winner
from tuner.tuning.session import Session
from tuner.tuning.study import WINNER_ATTR
from tuner.tuning.study_loop import TrialsEnd


class StoppedEarlyError(UserError, RuntimeError):
    """The study ended short of its trials (Ctrl-C, SIGTERM, too many failures): nothing is exported as if complete."""

    label = "stopped early"
    EXIT_CODES: ClassVar[dict[str, int]] = {
        "interrupted": 130,
        "terminated": 143,
        "failures": 4,
    }  # 128 + SIGINT, 128 + SIGTERM

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
    return (
        said
        + f", or `tune export --study-name {study.study_name}` to export the winner so far (trial {picked[0].number})"
    )


def stop_short(ended: TrialsEnd, session: Session) -> NoReturn:
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
