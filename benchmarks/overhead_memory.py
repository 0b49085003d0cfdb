"""Resident memory of a measuring process: its peak over a window, and each attention call's own extra peak."""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterator, Sequence
from typing import Any

from benchmarks.overhead_cases import KIB


class Memory:
    """Resident memory of this process in KiB: VmRSS and the high-water mark VmHWM (= ru_maxrss).

    Writing "5" to /proc/self/clear_refs resets the high-water mark to the current resident set; where
    that is not possible (not Linux, or procfs read-only) the peak is the process's lifetime peak.
    """

    def __init__(self) -> None:
        self._peak = 0
        self.has_status = os.path.exists("/proc/self/status")
        self.resettable = self._clear()
        self.method = (
            "VmHWM/ru_maxrss, reset per forward via /proc/self/clear_refs"
            if self.resettable
            else "ru_maxrss over the process lifetime (clear_refs unavailable)"
        )

    def _status(self, field_name: str) -> int:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
        raise KeyError(field_name)

    def rss(self) -> int:
        if self.has_status:
            return self._status("VmRSS")
        import psutil

        return psutil.Process().memory_info().rss // KIB

    def hwm(self) -> int:
        if self.has_status:
            return self._status("VmHWM")
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def _clear(self) -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")
            return True
        except OSError:
            return False

    def begin(self) -> None:
        """Start a measurement window: the peak from here on."""
        self._peak = 0
        self.reset()

    def reset(self) -> None:
        """Fold the high-water mark into the window's peak, then restart it at the current resident set."""
        self._peak = max(self._peak, self.hwm())
        if self.resettable:
            self._clear()

    def peak(self) -> int:
        return max(self._peak, self.hwm())


@contextlib.contextmanager
def attention_meter(modules: Sequence[Any], memory: Memory) -> Iterator[list[int]]:
    """Extra peak (KiB) of each call of the given self-attention modules over the RSS at its entry."""
    peaks: list[int] = []
    entry: list[int] = [0]

    def before(module: Any, args: Any) -> None:
        memory.reset()
        entry[0] = memory.rss()

    def after(module: Any, args: Any, output: Any) -> None:
        if memory.resettable:
            peaks.append(memory.hwm() - entry[0])

    handles = [m.register_forward_pre_hook(before) for m in modules] + [m.register_forward_hook(after) for m in modules]
    try:
        yield peaks
    finally:
        for handle in handles:
            handle.remove()
