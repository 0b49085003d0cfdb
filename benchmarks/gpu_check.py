"""One prepared check of the engine on a CUDA device (and, with tiny sizes, on CPU).

Host syncs are counted with `HostSyncs`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that make the host wait for the device: a value read back (bool(t), t.item(), int(t)), a comparison
# answered on the host, or an output whose size depends on the data (boolean indexing, nonzero).
SYNC_OPS = {"aten._local_scalar_dense", "aten.is_nonzero", "aten.item", "aten.equal", "aten.nonzero",
            "aten.masked_select", "aten.unique", "aten._unique2"}
SYNC_METHODS = {"tolist", "numpy"}  # read a tensor's data on the host without passing through the dispatcher


class HostSyncs:
    """Count the device-to-host syncs of the code run inside (`with HostSyncs() as syncs: ...; syncs.total`).

    A dispatch mode sees every aten op, also on CPU where nothing waits: what would sync on a GPU is counted
    on any device. `tolist` and `numpy` read data without an aten op, so a function mode counts those.
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        outer = self

        class _Dispatch(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
                name = func.overloadpacket._qualified_op_name.replace("::", ".")
                if name in SYNC_OPS or (name in ("aten.index", "aten.index_put", "aten.index_put_") and _bool_index(args)):
                    outer.counts[name] += 1
                return func(*args, **(kwargs or {}))

        class _Function(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
                if getattr(func, "__name__", None) in SYNC_METHODS:
                    outer.counts[func.__name__] += 1
                return func(*args, **(kwargs or {}))

        self._modes = (_Function(), _Dispatch())

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __enter__(self) -> HostSyncs:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


def _bool_index(args: tuple) -> bool:
    """Whether an index / index_put call indexes with a boolean mask (its output size is the mask's count)."""
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())
