"""The tuning run end to end: prepare the study, then coordinate it, or, as a worker, only run its trials.

Each step is a module of its own: `tuner.tuning.settings` (the options), `tuner.tuning.session` (model, data, storage
and tracking, ready), `tuner.tuning.coordinator` (baseline, floor, reference trials), `tuner.tuning.worker` (running
trials; one trial is `tuner.tuning.trial`) and `tuner.tuning.conclusion` (winner, held-out scores, export, summary);
`tuner.tuning.reexport` exports a stored study again.
"""

from __future__ import annotations

from tuner.tuning.conclusion import NoFeasibleTrialError, TuneOutcome
from tuner.tuning.coordinator import coordinate
from tuner.tuning.library_logs import quiet_libraries
from tuner.tuning.local_workers import run_as_worker
from tuner.tuning.reexport import reexport
from tuner.tuning.session import prepare
from tuner.tuning.settings import DEFAULT_TRIALS, TuneSettings, dataset_reason
from tuner.tuning.stopped_early import StoppedEarlyError

__all__ = [
    "DEFAULT_TRIALS",
    "NoFeasibleTrialError",
    "StoppedEarlyError",
    "TuneOutcome",
    "TuneSettings",
    "dataset_reason",
    "quiet_libraries",
    "reexport",
    "tune",
]


def tune(settings: TuneSettings) -> TuneOutcome | None:
    """Run (or resume) a study and export its winner; None from a `worker` (it only runs trials) or when another
    process finishing the study at the same time exports it."""
    session = prepare(settings)
    if settings.worker:
        run_as_worker(session)
        return None
    return coordinate(session)
