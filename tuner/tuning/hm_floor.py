"""The study's HM floor: stored by the coordinating `tune` once it has measured the baseline, awaited by every
worker before its first trial."""

from __future__ import annotations

import optuna

from tuner.common.waiting import NOTICE_SECONDS, wait_until
from tuner.tuning.settings import TuneSettings

FLOOR_ATTR = "floor_value"  # the study attribute that holds the HM floor
COORDINATOR_WAIT_SECONDS = 3600.0  # how long a worker waits for the coordinator's HM floor


def await_floor(
    study: optuna.Study,
    settings: TuneSettings,
    timeout: float = COORDINATOR_WAIT_SECONDS,
    every: float = NOTICE_SECONDS,
    poll: float = 2.0,
) -> float:
    """The HM floor, once the coordinating `tune` has measured the baseline and stored it; a worker waits for it,
    saying so at once and periodically (`wait_until`), and gives up after `timeout` seconds."""
    array = settings.array_task is not None
    coordinator = "task 0 of the job array (the coordinator)" if array else "the coordinating `tune` (without --worker)"
    wait_until(
        lambda: FLOOR_ATTR in study.user_attrs,
        waiting=f"waiting for {coordinator} to measure the baseline and set the HM floor of study {study.study_name!r}",
        gave_up=f"no coordinator set the HM floor of study {study.study_name!r}: start {coordinator} first, or read "
        "its log for why it stopped, then start this one again",
        timeout=timeout,
        every=every,
        poll=poll,
    )
    return float(study.user_attrs[FLOOR_ATTR])
