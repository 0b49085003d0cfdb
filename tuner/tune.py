"""The tuning run end to end: prepare the study, then coordinate it, or, as a worker, only run its trials.

Each step is a module of its own: `tuner.settings` (the options), `tuner.session` (model, data, storage
and tracking, ready), `tuner.coordinator` (baseline, floor, reference trials), `tuner.worker` (running
trials) and `tuner.conclusion` (winner, held-out scores, export, summary).
"""

from __future__ import annotations

from tuner.conclusion import NoFeasibleTrialError, TuneOutcome, reexport
from tuner.coordinator import coordinate
from tuner.session import prepare
from tuner.settings import DEFAULT_TRIALS, TuneSettings, dataset_reason
from tuner.worker import StoppedEarlyError, quiet_libraries, run_as_worker

__all__ = [
    "DEFAULT_TRIALS", "NoFeasibleTrialError", "StoppedEarlyError", "TuneOutcome", "TuneSettings", "dataset_reason", "quiet_libraries",
    "reexport", "tune",
]


def tune(settings: TuneSettings) -> TuneOutcome | None:
    """Run (or resume) a study and export its winner; a `worker` only runs trials and returns None."""
    session = prepare(settings)
    if settings.worker:
        run_as_worker(session)
        return None
    return coordinate(session)
