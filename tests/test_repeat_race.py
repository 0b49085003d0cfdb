"""The repeat check against a config that another process is running right now (README, "Repeats are not spent").

Two workers that drew the same calibration at the same moment both ran it: the check saw complete trials only.
Every trial records its calibration key before it looks and whether it runs or waits after, so at least the
later of two to look sees the other: a trial waits for a lower-numbered trial of its calibration, or a
higher-numbered one that runs it, repeats its values if it completes, and runs the config itself if it fails,
is pruned, its process is gone or the wait ends. Tested on one SQLite study storage, each "other process" a
second handle on it (in a thread where both look at once).
"""

from __future__ import annotations

import logging
import os
import random
import socket
import subprocess
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner.common.trials import DUPLICATE_ATTR, calibration_key
from tuner.tuning.owners import OWNER_ATTR
from tuner.tuning.storage import make_storage
from tuner.tuning.trial.repeats import RepeatCheck

# one resolved calibration as `TrialObjective.__call__` logs it (a parameter or fixed by the space)
X = {
    "strength": 0.55,
    "variant": "cls_soft",
    "depth": "50%",
    "basket_size": 128,
    "layers": [2, 3],
    "basket_shares": "equal",
}
OTHER = {**X, "strength": 0.7}

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")


def drawing(study: optuna.Study, params: dict[str, object], pid: int | None = None) -> optuna.Trial:
    """A RUNNING trial that drew `params`, with the attributes the study loop and the objective set before the
    repeat check: its owner (`run_trials`), its worker and its calibration key (`TrialObjective.__call__`)."""
    return drawing_as(study.ask(), params, pid)


def drawing_as(trial: optuna.Trial, params: dict[str, object], pid: int | None = None) -> optuna.Trial:
    trial.set_user_attr(OWNER_ATTR, {"host": socket.gethostname(), "pid": pid or os.getpid(), "trial": trial.number})
    trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
    trial.set_user_attr("calibration", calibration_key(params))
    return trial


def check(poll: float = 0.05, wait: float = 120.0, repeat_limit: int = 12) -> RepeatCheck:
    """The repeat check a trial objective runs (no model, data or tracker)."""
    return RepeatCheck(repeat_limit, wait_seconds=wait, poll_seconds=poll)


@pytest.fixture(params=["sqlite", "journal"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQLite study database, or an Optuna journal (each handle replays what the others appended)."""
    return (
        f"sqlite:///{tmp_path / 'optuna.db'}" if request.param == "sqlite" else f"journal:{tmp_path / 'study.journal'}"
    )


def study_on(storage: str) -> optuna.Study:
    return optuna.create_study(study_name="race", storage=make_storage(storage), load_if_exists=True)


def ends_elsewhere(storage: str, number: int, state: TrialState, after: float) -> threading.Thread:
    """Another process (its own storage handle) ends trial `number` in `state` `after` seconds from now."""

    def end() -> None:
        time.sleep(after)
        other = study_on(storage)
        if state == TrialState.COMPLETE:
            other.tell(number, 0.123)
        else:
            other.tell(number, state=state)

    thread = threading.Thread(target=end, daemon=True)
    thread.start()
    return thread


def test_a_trial_drawing_a_config_an_earlier_trial_is_running_waits_and_repeats_it(
    storage: str, caplog: pytest.LogCaptureFixture
) -> None:
    study = study_on(storage)
    first = drawing(study_on(storage), X)  # drawn by another process, through its own handle on the storage
    second = drawing(study, X)
    assert first.number < second.number
    ended = ends_elsewhere(storage, first.number, TrialState.COMPLETE, after=0.5)
    with caplog.at_level(logging.INFO, logger="tuner"):
        repeated = check().repeat_of(second, calibration_key(X))
    ended.join()
    said = [r.getMessage() for r in caplog.records if "waiting for it" in r.getMessage()]
    assert said == [f"trial {second.number} drew the calibration trial {first.number} is running: waiting for it"], (
        "said once"
    )
    assert repeated is not None, "the second trial ran the config the first one was running (the race)"
    assert repeated.number == first.number and repeated.state == TrialState.COMPLETE and repeated.values == [0.123]


def test_a_lower_numbered_trial_that_looks_later_waits_for_the_one_already_running(storage: str) -> None:
    """Trial numbers are given when trials start, configs drawn after: the higher-numbered trial can look first,
    see nothing and run; the lower-numbered one then sees it running and must wait, not run the config too."""
    study = study_on(storage)
    lower = study.ask()
    higher = drawing(study_on(storage), X)  # another process, a moment ahead
    assert check().repeat_of(higher, calibration_key(X)) is None, "it saw nothing: it runs"
    drawing_as(lower, X)
    ended = ends_elsewhere(storage, higher.number, TrialState.COMPLETE, after=0.5)
    repeated = check().repeat_of(lower, calibration_key(X))
    ended.join()
    assert repeated is not None and repeated.number == higher.number, "both ran the config"


def test_two_workers_drawing_one_config_at_once_run_it_once_however_their_steps_interleave(storage: str) -> None:
    """Two threads, each with its own handle on the storage (as two processes have), draw one config at the same
    moment (within 0.15 s), round after round: exactly one runs it, the other repeats it."""
    handles = [study_on(storage), study_on(storage)]
    rng = random.Random(0)

    def worker(
        handle: optuna.Study, params: dict[str, object], jitter: float, start: threading.Barrier, out: dict
    ) -> None:
        trial = handle.ask()
        start.wait()
        time.sleep(jitter)
        drawing_as(trial, params)
        repeated = check().repeat_of(trial, calibration_key(params))
        out[trial.number] = None if repeated is None else repeated.number
        if repeated is None:  # it runs the config, for longer than the two draws lie apart
            time.sleep(0.3)
            handle.tell(trial, 0.5)
        else:  # what `tuner.tuning.trial.repeats.repeat` does
            trial.set_user_attr(DUPLICATE_ATTR, repeated.number)
            handle.tell(trial, repeated.values[0])

    for round_ in range(12):
        params = {**X, "strength": round(0.05 + 0.05 * round_, 2)}
        start, out = threading.Barrier(2), {}
        threads = [
            threading.Thread(target=worker, args=(handle, params, rng.uniform(0, 0.15), start, out), daemon=True)
            for handle in handles
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert len(out) == 2, f"round {round_}: a worker is still waiting"
        ran = [number for number, repeated in out.items() if repeated is None]
        assert len(ran) == 1, f"round {round_}: {out} (None: ran the config itself)"
        assert set(out.values()) == {None, ran[0]}, f"round {round_}: the other repeats the one that ran"


@pytest.mark.parametrize("state", [TrialState.FAIL, TrialState.PRUNED])
def test_when_the_running_trial_fails_or_is_pruned_the_waiting_one_runs_the_config(
    storage: str, state: TrialState
) -> None:
    study = study_on(storage)
    first = drawing(study, X)
    second = drawing(study, X)
    ended = ends_elsewhere(storage, first.number, state, after=0.3)
    started = time.monotonic()
    assert check().repeat_of(second, calibration_key(X)) is None
    ended.join()
    assert time.monotonic() - started < 60, "it stopped waiting once the other trial had ended, not at the limit"


def test_a_running_trial_whose_process_is_gone_is_failed_and_not_waited_for(storage: str) -> None:
    """The study loop fails a dead local process's trial at once (`fail_dead_trials`); so does the wait."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    study = study_on(storage)
    first = drawing(study, X, pid=dead.pid)
    second = drawing(study, X)
    started = time.monotonic()
    assert check().repeat_of(second, calibration_key(X)) is None
    assert time.monotonic() - started < 60, "not waited for until the limit"
    assert study_on(storage).trials[first.number].state == TrialState.FAIL


def test_the_wait_is_bounded_and_then_the_trial_runs_the_config(storage: str, caplog: pytest.LogCaptureFixture) -> None:
    study = study_on(storage)
    first = drawing(study, X)  # runs on, never ends
    second = drawing(study, X)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="tuner"):
        assert check(wait=0.4).repeat_of(second, calibration_key(X)) is None
    assert time.monotonic() - started >= 0.4
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"trial {second.number}: trial {first.number} still runs the same calibration after 0 s; it is run here too"
    ]


def test_of_two_trials_that_see_each_other_the_lower_numbered_runs_once_the_other_has_decided_to_wait(
    storage: str,
) -> None:
    """Both recorded the key before either looked: the higher-numbered one waits for the lower-numbered one, which
    runs as soon as it sees that decision (until then it cannot tell whether the other one is running it)."""
    study = study_on(storage)
    first = drawing(study, X)
    second = drawing(study_on(storage), X)  # another process
    elsewhere = drawing(study, OTHER)
    waited: dict[str, object] = {}

    def second_looks() -> None:
        time.sleep(0.3)  # after the first has looked and seen it undecided
        waited["repeated"] = check().repeat_of(second, calibration_key(X))

    thread = threading.Thread(target=second_looks, daemon=True)
    thread.start()
    started = time.monotonic()
    assert check().repeat_of(first, calibration_key(X)) is None, "the lower-numbered trial runs"
    assert check().repeat_of(elsewhere, calibration_key(OTHER)) is None, "another config is not waited for"
    assert time.monotonic() - started < 60, "it ran once the other had decided, not at the limit"
    study.tell(first, 0.3)
    thread.join(timeout=60)
    assert waited["repeated"].number == first.number, "the higher-numbered trial waited and repeats it"


def test_a_complete_trial_of_the_config_is_repeated_at_once_and_the_repeat_limit_still_holds(storage: str) -> None:
    study = study_on(storage)
    first = drawing(study, X)
    study.tell(first, 0.2)
    second = drawing(study, X)
    assert check(wait=600).repeat_of(second, calibration_key(X)).number == first.number
    third = drawing(study, X)
    running = drawing(study, OTHER)
    later = drawing(study, OTHER)
    started = time.monotonic()
    assert (
        check(repeat_limit=0, wait=600).repeat_of(third, calibration_key(X)) is None
    )  # the space is as good as exhausted
    assert check(repeat_limit=0, wait=600).repeat_of(later, calibration_key(OTHER)) is None  # not even waited for
    assert time.monotonic() - started < 60 and running.number < later.number
