"""The GPU check's measurements of one case: paired times, the kernels that ran, peak memory, host syncs, the bit
identities and the agreement with the float32 oracle."""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from types import SimpleNamespace
from typing import Any

import torch

from benchmarks.gpu_cases import PATHS, Case, Plan, inputs_for, kernels, spec_for
from benchmarks.gpu_counters import AttentionKernels, HostSyncs


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def forward(model: torch.nn.Module, inputs: dict[str, torch.Tensor], spec: Any | None) -> torch.Tensor:
    from tuner.calibration import calibrating

    with torch.inference_mode(), calibrating(spec) if spec is not None else contextlib.nullcontext():
        return model(**inputs).last_hidden_state


def seconds_of(run: Callable[[], object], device: str) -> float:
    """One call's time: CUDA events around it (the device's time, not the launches'), else the wall clock."""
    if device != "cuda":
        began = time.perf_counter()
        run()
        return time.perf_counter() - began
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def peak_bytes(run: Callable[[], object], device: str) -> int | None:
    """What the call allocated at its peak above what was allocated before it (CUDA only)."""
    if device != "cuda":
        run()
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def paired_times(plain: Callable[[], object], engine: Callable[[], object], plan: Plan) -> dict[str, Any]:
    """Warm-ups, then `plan.pairs` interleaved pairs (ABBA): the median per-pair ratio engine ÷ SDPA."""
    for _ in range(plan.warmups):
        plain()
        engine()
    synchronize(plan.device)
    times: dict[str, list[float]] = {"sdpa": [], "engine": []}
    for i in range(plan.pairs):
        for name in ("sdpa", "engine") if i % 2 == 0 else ("engine", "sdpa"):
            times[name].append(seconds_of(plain if name == "sdpa" else engine, plan.device))
    ratios = [e / p for e, p in zip(times["engine"], times["sdpa"], strict=True)]
    return {
        "sdpa_s": statistics.median(times["sdpa"]),
        "engine_s": statistics.median(times["engine"]),
        "ratio": statistics.median(ratios),
        "pairs": plan.pairs,
        "ratios": ratios,
    }


def resumes_bit_identically(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], spec: Any | None, layer: int
) -> bool:
    """A pass resumed at `layer` from the hidden states recorded entering it (the prefix cache's mechanism) equals
    the full pass bit for bit."""
    from tuner.engine.models import LoadedModel
    from tuner.engine.prefix import LayerStack
    from tuner.engine.specs import ModelSpec

    loaded = LoadedModel(ModelSpec("random", "random", "cls", "right", 8192), model, SimpleNamespace(), "random")  # type: ignore[arg-type]
    stack = LayerStack(loaded)
    recorded: dict[int, torch.Tensor] = {}
    with stack.recording([layer], lambda i, h: recorded.__setitem__(i, h.clone())):
        forward(model, inputs, None)
    full = forward(model, inputs, spec)
    with stack.resuming(layer) as feed:
        feed(recorded[layer])
        resumed = forward(model, inputs, spec)
    return bool(torch.equal(full, resumed))


def pooled(hidden: torch.Tensor, inputs: dict[str, torch.Tensor], pooling: str) -> torch.Tensor:
    from tuner.engine.encoder import _pool

    return torch.nn.functional.normalize(_pool(hidden, inputs["attention_mask"], pooling), dim=-1)


def against_oracle(case: Case, plan: Plan, model: torch.nn.Module) -> dict[str, Any]:
    """The engine in the run's dtype and in float32 on the run's device against the float32 oracle at
    `plan.oracle_length`, batch 2. The oracle runs on CPU: it is plain code (per-position basket indices built on
    the host), and the CPU's float32 is the reference here."""
    from tuner.calibration.reference import register_reference

    small = Case(case.model, case.pooling, plan.oracle_length, 2)
    inputs = inputs_for(small, plan.device)
    spec = spec_for(small, plan, model)
    engine = pooled(forward(model, inputs, spec), inputs, case.pooling).cpu()
    full = copy.deepcopy(model).float()
    engine32 = pooled(forward(full, inputs, spec), inputs, case.pooling).cpu()
    full = full.cpu()
    full.set_attn_implementation(register_reference("posfair_reference_fp32", torch.float32))
    on_cpu = {k: v.cpu() for k, v in inputs.items()}
    oracle = pooled(forward(full, on_cpu, spec), on_cpu, case.pooling)
    del full

    def compare(got: torch.Tensor) -> dict[str, float]:
        return {
            "max_abs": float((got - oracle).abs().max()),
            "min_cosine": float(torch.nn.functional.cosine_similarity(got, oracle, dim=-1).min()),
        }

    return {
        "length": small.length,
        "batch": small.batch,
        str(plan.dtype).removeprefix("torch."): compare(engine),
        "float32": compare(engine32),
    }


def measure(case: Case, plan: Plan, model: torch.nn.Module) -> dict[str, Any]:
    """Every figure of one case (see the module's docstring): under the pinned kernel, and time, kernels and
    λ = 0 also under torch's default choice. A path whose kernels cannot run this case says why."""
    inputs = inputs_for(case, plan.device)
    spec = spec_for(case, plan, model)
    plain, engine = (lambda: forward(model, inputs, None)), (lambda: forward(model, inputs, spec))
    result: dict[str, Any] = {
        "case": asdict(case),
        "title": case.title,
        "calibrated_layers": sorted(spec.layers),
        "pinned_backend": plan.pinned.name,
        "time": {},
        "kernels": {},
        "strength_0_is_sdpa_bit_for_bit": {},
    }
    for path in PATHS:
        try:
            with kernels(path, plan):
                result["time"][path] = paired_times(plain, engine, plan)
                result["kernels"][path] = {
                    name: kernels_of(run).as_dict() for name, run in (("sdpa", plain), ("engine", engine))
                }
                unscaled = forward(model, inputs, spec_for(case, plan, model, strength=0.0))
                result["strength_0_is_sdpa_bit_for_bit"][path] = bool(torch.equal(unscaled, plain()))
        except RuntimeError as error:  # e.g. "No available kernel" where the pinned kernel cannot take an input
            result["time"][path] = result["kernels"][path] = {
                "error": str(error).splitlines()[0] if str(error) else type(error).__name__
            }
    pinned = result["kernels"]["pinned"]
    used = {backend for run in ("sdpa", "engine") for kind in pinned.get(run, {}).values() for backend in kind}
    result["kernels_alike"] = used == {plan.pinned.name}  # every attention call of both timed forwards, pinned
    result["figures_kernels"] = "pinned" if "error" not in pinned else "default"
    with kernels(result["figures_kernels"], plan):
        result.update(_once_figures(plan, model, inputs, spec, plain, engine))
    return result


def kernels_of(run: Callable[[], object]) -> AttentionKernels:
    with AttentionKernels() as counted:
        run()
    return counted


def _once_figures(
    plan: Plan,
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    spec: Any,
    plain: Callable[[], object],
    engine: Callable[[], object],
) -> dict[str, Any]:
    """Peak memory, host syncs, the prefix resume and the fused kernel, measured once (pinned, where it runs)."""
    from tuner.calibration import kernels

    sdpa_peak, engine_peak = peak_bytes(plain, plan.device), peak_bytes(engine, plan.device)
    syncs = {}
    for name, run in (("sdpa", plain), ("engine", engine)):
        with HostSyncs() as counted:
            run()
        syncs[name] = counted.total
    first = min(spec.layers)
    return {
        "peak_mib": None
        if sdpa_peak is None or engine_peak is None
        else {"sdpa": sdpa_peak / 2**20, "engine": engine_peak / 2**20, "extra": (engine_peak - sdpa_peak) / 2**20},
        "host_syncs_per_forward": syncs,
        "prefix_resume_bit_identical": {
            "plain": resumes_bit_identically(model, inputs, None, first),
            "calibrated": resumes_bit_identically(model, inputs, spec, first),
        },
        "fused_kernel": kernels._fused_kernel(plan.device) is not None,
    }
