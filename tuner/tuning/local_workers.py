"""Worker processes: what `tune --worker` runs, and the local workers a coordinator starts on the same study, each
on its own GPU where there are several."""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.process
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from tuner.tuning.hm_floor import await_floor
from tuner.tuning.library_logs import quiet_libraries
from tuner.tuning.session import Session, prepare
from tuner.tuning.settings import TuneSettings, local_worker_identity, process_identity, worker_devices
from tuner.tuning.worker import run_session_trials


def run_as_worker(session: Session) -> None:
    """Run trials of a study another `tune` coordinates, once it has stored the HM floor."""
    settings = session.settings
    workers = start_workers(settings, settings.workers - 1)
    floor = await_floor(session.study, settings)
    run_session_trials(session, floor, workers)


def start_workers(settings: TuneSettings, count: int) -> list[multiprocessing.process.BaseProcess]:
    """Extra local worker processes on the same study (each loads its own model), each on its own GPU where
    there are several (`worker_devices`: worker i sees only its GPU, as cuda:0; this process keeps the first)."""
    context = multiprocessing.get_context("spawn")
    devices = worker_devices(count + 1)[1:]
    parent = process_identity(settings)
    workers: list[multiprocessing.process.BaseProcess] = [
        context.Process(
            target=_work,
            args=(
                replace(
                    settings, workers=1, worker=True, array_task=None, worker_id=local_worker_identity(parent, i + 1)
                ),
            ),
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
