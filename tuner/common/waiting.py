"""Waiting on another process, said: what is awaited and for how long, at once and then periodically, so that a
task of a job array whose coordinator never came says so in its log instead of waiting an hour in silence."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tuner.common.messages import UserError

NOTICE_SECONDS = 60.0  # a wait is said again this often

log = logging.getLogger(__name__)


class WaitedTooLongError(UserError, RuntimeError):
    """What a process waited for did not happen within its time; the message says what to do."""


def wait_until(
    ready: Callable[[], bool],
    *,
    waiting: str,
    gave_up: str,
    timeout: float,
    every: float = NOTICE_SECONDS,
    poll: float = 1.0,
) -> None:
    """Call `ready` every `poll` seconds until it answers True. If it does not at once, `waiting` (what is awaited,
    from whom) is logged with the limit, then again every `every` seconds with the time so far; after `timeout`
    seconds `WaitedTooLongError(gave_up)` is raised."""
    if ready():
        return
    start = time.monotonic()
    log.info("%s; giving up after %s", waiting, _duration(timeout))
    said = start
    while not ready():
        now = time.monotonic()
        if now - start > timeout:
            raise WaitedTooLongError(f"{gave_up} (waited {_duration(timeout)})")
        if now - said >= every:
            log.info("still %s: %s so far, giving up after %s", waiting, _duration(now - start), _duration(timeout))
            said = now
        time.sleep(poll)


def _duration(seconds: float) -> str:
    """Seconds as a person reads them: `45 s`, `5 min`, `1 h 30 min`."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h" + (f" {minutes % 60} min" if minutes % 60 else "")
