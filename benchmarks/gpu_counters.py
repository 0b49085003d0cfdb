"""What a forward asks of the device, counted through torch's dispatch: host syncs and attention kernels."""

from __future__ import annotations

from collections import Counter
from typing import Any, Self

import torch
from torch.nn.attention import SDPBackend
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that make the host wait for the device: a value read back (bool(t), t.item(), int(t)), a comparison
# answered on the host, or an output whose size depends on the data (boolean indexing, nonzero).
SYNC_OPS = {
    "aten._local_scalar_dense",
    "aten.is_nonzero",
    "aten.item",
    "aten.equal",
    "aten.nonzero",
    "aten.masked_select",
    "aten.unique",
    "aten._unique2",
}
SYNC_METHODS = {"tolist", "numpy"}  # read a tensor's data on the host without passing through the dispatcher


class _Counting:
    """Enters the counter's torch modes in order and leaves them in reverse, as one context."""

    _modes: tuple[Any, ...]

    def __enter__(self) -> Self:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


class HostSyncs(_Counting):
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
                if name in SYNC_OPS or (
                    name in ("aten.index", "aten.index_put", "aten.index_put_") and _bool_index(args)
                ):
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


def _bool_index(args: tuple) -> bool:
    """Whether an index / index_put call indexes with a boolean mask (its output size is the mask's count)."""
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


# The fused kernels the engine calls itself (`tuner.calibration.kernels`), by the SDPA backend each belongs to.
DIRECT_KERNELS = {
    "aten._scaled_dot_product_efficient_attention": SDPBackend.EFFICIENT_ATTENTION,
    "aten._scaled_dot_product_flash_attention": SDPBackend.FLASH_ATTENTION,
    "aten._scaled_dot_product_flash_attention_for_cpu": SDPBackend.FLASH_ATTENTION,
    "aten._scaled_dot_product_cudnn_attention": SDPBackend.CUDNN_ATTENTION,
}


class AttentionKernels(_Counting):
    """Count the attention kernels of the code run inside, by SDPA backend: `sdpa` for the calls of
    `scaled_dot_product_attention` (the backend torch's dispatcher picks for each, `torch._fused_sdp_choice`,
    which honours `sdpa_kernel`), `direct` for the fused kernels the engine calls itself.

    A dispatch mode sees SDPA only as `aten.scaled_dot_product_attention`, before the backend is chosen, so the
    choice is asked for with the call's own arguments; the direct calls are aten ops of their own."""

    def __init__(self) -> None:
        self.sdpa: Counter[str] = Counter()
        self.direct: Counter[str] = Counter()
        self._in_sdpa = 0  # SDPA's own kernel call, which autograd's decomposition shows as an op: not a direct one
        outer = self

        class _Function(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
                if func is not torch.nn.functional.scaled_dot_product_attention:
                    return func(*args, **(kwargs or {}))
                outer.sdpa[_chosen_backend(args, kwargs or {})] += 1
                outer._in_sdpa += 1
                try:
                    return func(*args, **(kwargs or {}))
                finally:
                    outer._in_sdpa -= 1

        class _Dispatch(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
                backend = DIRECT_KERNELS.get(func.overloadpacket._qualified_op_name.replace("::", "."))
                if backend is not None and not outer._in_sdpa:
                    outer.direct[backend.name] += 1
                return func(*args, **(kwargs or {}))

        self._modes = (_Function(), _Dispatch())

    @property
    def backends(self) -> set[str]:
        return set(self.sdpa) | set(self.direct)

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {"sdpa": dict(sorted(self.sdpa.items())), "direct": dict(sorted(self.direct.items()))}


def _chosen_backend(args: tuple, kwargs: dict[str, Any]) -> str:
    """The SDPA backend torch would run for this call (its name; ERROR: none of the allowed ones can)."""
    try:
        return SDPBackend(torch._fused_sdp_choice(*args, **kwargs)).name
    except (RuntimeError, TypeError, ValueError) as error:  # an argument this torch's chooser does not take
        return f"unknown ({type(error).__name__})"
