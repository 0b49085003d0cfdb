"""One GPU per worker: `tune --workers N` hands each local process its own device, round-robin over the
visible GPUs, and the settings table says which. No GPU here: the device list is simulated."""

from __future__ import annotations

import os

import pytest
import torch

from tuner.tuning import local_workers
from tuner.tuning.settings import TuneSettings, describe_devices, settings_in_force, worker_devices


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    """Simulate `count` visible CUDA devices, with CUDA_VISIBLE_DEVICES as given (None: unset)."""

    def simulate(count: int, visible: str | None = None) -> None:
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)

    return simulate


def test_workers_get_the_visible_gpus_round_robin(gpus) -> None:
    gpus(2)
    assert worker_devices(3) == ["0", "1", "0"]
    gpus(3, "5,7,GPU-1c2f")  # the user's own selection is handed out, in its order and spelling
    assert worker_devices(4) == ["5", "7", "GPU-1c2f", "5"]
    gpus(1, "5,7")  # CUDA stops at an entry it cannot use: only the ones it counts are handed out
    assert worker_devices(2) == ["5", "5"]
    gpus(0)
    assert worker_devices(2) == [None, None]


def test_the_settings_table_says_which_worker_has_which_device(gpus) -> None:
    gpus(2, "4,6")
    assert (
        settings_in_force(TuneSettings(workers=3))["devices"] == "coordinator: GPU 4, worker 1: GPU 6, worker 2: GPU 4"
    )
    assert settings_in_force(TuneSettings())["devices"] == "GPU 4"
    gpus(0)
    assert (
        settings_in_force(TuneSettings(workers=2))["devices"]
        == describe_devices([None, None])
        == "cpu (no CUDA device visible)"
    )


class RecordingContext:
    """A spawn context whose processes record the CUDA_VISIBLE_DEVICES they would inherit when started."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []
        context = self

        class Process:
            def __init__(self, target, args, daemon) -> None:
                self.worker_id = args[0].worker_id

            def start(self) -> None:
                context.seen.append((self.worker_id, os.environ.get("CUDA_VISIBLE_DEVICES")))

        self.Process = Process


@pytest.mark.parametrize(
    ("count", "visible", "want"),
    [
        (2, None, [("1", "1"), ("2", "0")]),
        (2, "3,1", [("1", "1"), ("2", "3")]),
        (0, None, [("1", None), ("2", None)]),
    ],
)
def test_each_started_worker_sees_only_its_gpu_and_the_environment_is_restored(
    gpus, monkeypatch, count: int, visible: str | None, want: list
) -> None:
    gpus(count, visible)
    context = RecordingContext()
    monkeypatch.setattr(local_workers.multiprocessing, "get_context", lambda method: context)
    started = local_workers.start_workers(TuneSettings(workers=3), 2)
    assert len(started) == 2
    assert context.seen == want
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == visible, "this process keeps what it had"
