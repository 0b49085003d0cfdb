"""One prepared check of the engine on a CUDA device, in one run of at most ~8 minutes; with tiny sizes on CPU.

    python -m benchmarks.gpu_check                 # CUDA if there is one, else the reduced CPU form
    python -m benchmarks.gpu_check --cpu           # the reduced CPU form (what CI runs), ~20 s
    python -m benchmarks.gpu_check --out gpu.json  # where the JSON goes (default gpu_check.json)

What it measures, per case (a randomly initialised model, a batch of random token ids with its last item
padded to 3/4 of the length, calibration CLS-Soft λ 0.5, last 50% of layers, basket 128 — 16 on CPU), with
SDPA pinned to the kernel of posfair's mean-pooling path (`torch.nn.attention.sdpa_kernel`: the memory-efficient
kernel on CUDA, whose log-sum-exp that path blends; the fused flash kernel on CPU) and, for time, λ = 0 and the
kernels, also as torch picks them by default (cuDNN's, where a recent cuDNN on an H100/H200 offers it):
- time: engine ÷ SDPA forward, the same loaded model calibrated and not (outside `calibrating` the posfair
  attention function is SDPA's own call), after warm-ups, as the median of ≥ 10 interleaved pairs (ABBA),
  timed with CUDA events (perf_counter on CPU);
- the attention kernels each timed forward runs (`AttentionKernels`): every SDPA call by the backend torch's
  dispatcher picks for it, and the engine's own calls of a fused kernel;
- peak memory: max_memory_allocated over the forward above what was allocated before it, engine − SDPA
  (CUDA only);
- host syncs per forward (`HostSyncs`), calibrated and plain;
- whether λ = 0 is SDPA bit for bit, and whether a pass resumed from a middle layer's recorded input
  (`tuner.engine.prefix`) is the full pass bit for bit, plain and calibrated;
- which fused attention kernel the engine found (`_fused_kernel`).
The JSON also names the device, torch, transformers, CUDA, cuDNN and the driver.
Once per model and pooling, at 512 tokens (64 on CPU), batch 2: the engine in the run's dtype (bf16 on
CUDA) and in float32 against the float32 oracle (`tuner.calibration.reference`, on CPU): max |Δ| and the
lowest cosine of the pooled, L2-normalised vectors.

Cases on CUDA, bf16: XLM-R at bge-m3's width (hidden 1024, 16 heads, FFN 4096, 24 layers, vocabulary cut
to 8,192) with cls and mean pooling at 512, 2,048 and 8,192 tokens (32K tokens a batch), and Qwen3 of tiny
width (hidden 128, 4 heads, 2 key/value heads, 4 layers) with last-token pooling at the same lengths. On
CPU, fp32: the same models at tiny width, 64 and 128 tokens. A time budget (--budget-s) skips what does
not fit, and says so in the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Self

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
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

    def __enter__(self) -> Self:
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


# The fused kernels the engine calls itself (`tuner.calibration.attention`), by the SDPA backend each belongs to.
DIRECT_KERNELS = {
    "aten._scaled_dot_product_efficient_attention": SDPBackend.EFFICIENT_ATTENTION,
    "aten._scaled_dot_product_flash_attention": SDPBackend.FLASH_ATTENTION,
    "aten._scaled_dot_product_flash_attention_for_cpu": SDPBackend.FLASH_ATTENTION,
    "aten._scaled_dot_product_cudnn_attention": SDPBackend.CUDNN_ATTENTION,
}


class AttentionKernels:
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

    def __enter__(self) -> Self:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


def _chosen_backend(args: tuple, kwargs: dict[str, Any]) -> str:
    """The SDPA backend torch would run for this call (its name; ERROR: none of the allowed ones can)."""
    try:
        return SDPBackend(torch._fused_sdp_choice(*args, **kwargs)).name
    except (RuntimeError, TypeError, ValueError) as error:  # an argument this torch's chooser does not take
        return f"unknown ({type(error).__name__})"


@contextlib.contextmanager
def kernels(path: str, plan: Plan) -> Iterator[None]:
    """SDPA as torch picks it ("default") or pinned to the plan's kernel ("pinned")."""
    with sdpa_kernel(plan.pinned) if path == "pinned" else contextlib.nullcontext():
        yield


PATHS = ("pinned", "default")


# ---------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Case:
    """One model, pooling and length; `batch` passages of `length` tokens, the last one padded to 3/4."""

    model: str  # "xlmr" | "qwen3"
    pooling: str
    length: int
    batch: int

    @property
    def title(self) -> str:
        return f"{self.model} {self.pooling} {self.length}×{self.batch}"


@dataclass(frozen=True)
class Plan:
    """What one run measures, on which device."""

    device: str
    dtype: torch.dtype
    width: str  # "bge-m3" | "tiny": XLM-R's width
    cases: tuple[Case, ...]
    pairs: int
    warmups: int
    basket: int
    oracle_length: int
    pinned: SDPBackend  # SDPA's kernel in the comparable path: the one the engine's mean-pooling path calls itself
    threads: int = 0  # torch threads (0: torch's default)


def plan_for(device: str, pairs: int | None = None) -> Plan:
    """The CUDA plan, or its reduced CPU form."""
    if device == "cuda":
        lengths, per_batch = (512, 2048, 8192), 32768
        cases = tuple(
            Case(model, pooling, n, per_batch // n)
            for model, pooling in (("xlmr", "cls"), ("xlmr", "mean"), ("qwen3", "last"))
            for n in lengths
        )
        return Plan("cuda", torch.bfloat16, "bge-m3", cases, pairs or 10, 3, 128, 512, SDPBackend.EFFICIENT_ATTENTION)
    cases = tuple(
        Case(model, pooling, n, 2) for model, pooling in (("xlmr", "cls"), ("xlmr", "mean"), ("qwen3", "last")) for n in (64, 128)
    )
    return Plan(
        "cpu", torch.float32, "tiny", cases, pairs or 3, 1, 16, 64, SDPBackend.FLASH_ATTENTION, threads=1
    )  # tiny: threads only contend


WIDTHS = {  # XLM-R: hidden, heads, intermediate, layers
    "bge-m3": (1024, 16, 4096, 24),
    "tiny": (32, 4, 64, 4),
}


def build_model(case: Case, plan: Plan) -> torch.nn.Module:
    """Random weights (seeded), the posfair attention function, eval mode, on the plan's device and dtype."""
    from transformers import Qwen3Config, Qwen3Model, XLMRobertaConfig, XLMRobertaModel

    from tuner.calibration import ATTENTION_NAME, register

    register()
    torch.manual_seed(0)
    if case.model == "xlmr":
        hidden, heads, intermediate, layers = WIDTHS[plan.width]
        config = XLMRobertaConfig(
            vocab_size=8192,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=intermediate,
            max_position_embeddings=8194,
            type_vocab_size=1,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
        )
        model = XLMRobertaModel(config, add_pooling_layer=False)
    else:
        config = Qwen3Config(
            vocab_size=8192,
            hidden_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            intermediate_size=256,
            max_position_embeddings=8192,
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=3,
        )
        model = Qwen3Model(config)
    model.set_attn_implementation(ATTENTION_NAME)
    return model.to(device=plan.device, dtype=plan.dtype).eval()


def inputs_for(case: Case, device: str) -> dict[str, torch.Tensor]:
    """Random token ids between the model's start and end tokens; the last item padded to 3/4 of the length,
    on the right for XLM-R and on the left for Qwen3 (as Qwen3-Embedding pads)."""
    generator = torch.Generator().manual_seed(1)
    start, end, pad = (0, 2, 1) if case.model == "xlmr" else (2, 3, 0)
    ids = torch.randint(4, 8192, (case.batch, case.length), generator=generator)
    mask = torch.ones_like(ids)
    ids[:, 0], ids[:, -1] = start, end
    real = max(2, case.length * 3 // 4)
    if case.model == "xlmr":
        ids[-1, real - 1], ids[-1, real:], mask[-1, real:] = end, pad, 0
    else:
        cut = case.length - real
        ids[-1, :cut], ids[-1, cut], mask[-1, :cut] = pad, start, 0
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}


def spec_for(case: Case, plan: Plan, model: torch.nn.Module, **overrides: object) -> Any:
    from tuner.calibration import CalibrationConfig

    values = {
        "variant": "cls_soft",
        "strength": 0.5,
        "basket_size": plan.basket,
        "layers": 0.5,
        "pooling": case.pooling,
        "padding_side": "left" if case.model == "qwen3" else "right",
        **overrides,
    }
    return CalibrationConfig(**values).resolve(model.config.num_hidden_layers)


# ---------------------------------------------------------------- measurements


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


def resumes_bit_identically(model: torch.nn.Module, inputs: dict[str, torch.Tensor], spec: Any | None, layer: int) -> bool:
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
                result["kernels"][path] = {name: kernels_of(run).as_dict() for name, run in (("sdpa", plain), ("engine", engine))}
                unscaled = forward(model, inputs, spec_for(case, plan, model, strength=0.0))
                result["strength_0_is_sdpa_bit_for_bit"][path] = bool(torch.equal(unscaled, plain()))
        except RuntimeError as error:  # e.g. "No available kernel" where the pinned kernel cannot take an input
            result["time"][path] = result["kernels"][path] = {"error": str(error).splitlines()[0] if str(error) else type(error).__name__}
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
    from tuner.calibration import attention as engine_module

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
        "fused_kernel": engine_module._fused_kernel(plan.device) is not None,
    }


# ---------------------------------------------------------------- the run


def run(plan: Plan, budget_s: float, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every case of `plan` that fits the budget, then the oracle comparisons; what did not fit is listed. A
    case's cost is guessed from the model's previous case in proportion to the length: a batch holds the same
    tokens whatever the length, and attention grows with tokens × length."""
    began, threads = time.perf_counter(), torch.get_num_threads()
    torch.set_num_threads(plan.threads or threads)
    try:
        return _run(plan, budget_s, log, began)
    finally:
        torch.set_num_threads(threads)


def _run(plan: Plan, budget_s: float, log: Callable[[str], None], began: float) -> dict[str, Any]:
    device_name = torch.cuda.get_device_name() if plan.device == "cuda" else "cpu"
    out: dict[str, Any] = {
        "device": device_name,
        "mode": plan.device,
        "dtype": str(plan.dtype),
        "torch": torch.__version__,
        "versions": versions(plan.device),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "pairs": plan.pairs,
        "basket": plan.basket,
        "pinned_backend": plan.pinned.name,
        "cases": [],
        "oracle": [],
        "skipped": [],
    }
    models: dict[str, torch.nn.Module] = {}
    per_token_length: dict[str, float] = {}  # a model's last case: seconds ÷ its length (tokens a batch are fixed)
    for case in plan.cases:
        guess = per_token_length.get(case.model, 0.0) * case.length
        if time.perf_counter() - began + guess > budget_s:
            out["skipped"].append(case.title)
            log(f"{case.title}: skipped, it would end the run past the budget of {budget_s:.0f} s")
            continue
        if case.model not in models:
            models[case.model] = build_model(case, plan)
        started = time.perf_counter()
        result = measure(case, plan, models[case.model])
        per_token_length[case.model] = (time.perf_counter() - started) / case.length
        out["cases"].append(result)
        log(row(result))
    for model_name, pooling in dict.fromkeys((c.model, c.pooling) for c in plan.cases):
        if model_name in models and time.perf_counter() - began < budget_s:
            out["oracle"].append(
                {
                    "model": model_name,
                    "pooling": pooling,
                    **against_oracle(Case(model_name, pooling, plan.oracle_length, 2), plan, models[model_name]),
                }
            )
    out["wall_s"] = time.perf_counter() - began
    return out


def versions(device: str) -> dict[str, Any]:
    """What the figures depend on beyond the code: torch, transformers, and on CUDA the CUDA runtime torch was
    built with, cuDNN, the driver and which SDPA backends torch may choose (None where not applicable)."""
    import transformers

    cuda = device == "cuda"
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "driver": driver_version() if cuda else None,
        "sdpa_backends_enabled": {
            "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
            "flash": torch.backends.cuda.flash_sdp_enabled(),
            "efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "math": torch.backends.cuda.math_sdp_enabled(),
        }
        if cuda
        else None,
    }


def driver_version() -> str | None:
    """The NVIDIA driver's version, as nvidia-smi reports it (None without it)."""
    try:
        answer = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return answer.stdout.splitlines()[0].strip() if answer.stdout.strip() else None


def kernels_named(kernels: dict[str, Any]) -> str:
    """'EFFICIENT_ATTENTION' for a path whose SDPA and engine use one kernel, else each side's, e.g.
    'SDPA CUDNN_ATTENTION; engine CUDNN_ATTENTION + EFFICIENT_ATTENTION'."""
    if "error" in kernels:
        return f"not run: {kernels['error']}"
    sides = {run: " + ".join(sorted({b for kind in kernels[run].values() for b in kind})) or "none" for run in ("sdpa", "engine")}
    return sides["sdpa"] if sides["sdpa"] == sides["engine"] else f"SDPA {sides['sdpa']}; engine {sides['engine']}"


def row(result: dict[str, Any]) -> str:
    t, peak, syncs = result["time"], result["peak_mib"], result["host_syncs_per_forward"]
    resumed = result["prefix_resume_bit_identical"]
    extra = "—" if peak is None else f"{peak['extra']:+.2f} MiB"
    same = "yes" if resumed["plain"] and resumed["calibrated"] else f"NO {resumed}"
    pinned, default = t["pinned"], t["default"]

    def ms(path: dict[str, Any], key: str) -> str:
        return "—" if "error" in path else f"{path[key] * 1e3:.1f} ms"

    def ratio(path: dict[str, Any]) -> str:
        return "—" if "error" in path else f"{path['ratio']:.3f}×"

    bit = result["strength_0_is_sdpa_bit_for_bit"]
    return (
        f"| {result['title']} | {ms(pinned, 'sdpa_s')} | {ms(pinned, 'engine_s')} | {ratio(pinned)} | "
        f"{kernels_named(result['kernels']['pinned'])} | {ratio(default)} | {kernels_named(result['kernels']['default'])} | "
        f"{extra} | {syncs['engine']} (SDPA {syncs['sdpa']}) | "
        f"{'/'.join('yes' if bit.get(path) else 'NO' for path in PATHS)} | {same} |"
    )


def table(out: dict[str, Any]) -> str:
    v = out["versions"]
    built = f", CUDA {v['cuda']}, cuDNN {v['cudnn']}, driver {v['driver']}" if out["mode"] == "cuda" else ""
    lines = [
        (
            f"{out['device']} ({out['mode']}, {out['dtype']}, torch {v['torch']}, transformers {v['transformers']}{built}), "
            f"{out['date']}; median of {out['pairs']} interleaved pairs; basket {out['basket']}; pinned: SDPA as "
            f"sdpa_kernel({out['pinned_backend']}), default: as torch picks"
        ),
        "",
        "| case | SDPA pinned | engine pinned | engine ÷ SDPA pinned | kernels pinned | engine ÷ SDPA default | "
        "kernels default | extra peak | host syncs / forward | λ 0 = SDPA pinned/default | prefix resume = full |",
        "|---|---:|---:|---:|---|---:|---|---:|---:|---|---|",
    ]
    lines += [row(result) for result in out["cases"]]
    lines += ["", "| model, pooling | dtype | max abs vs fp32 oracle | min cosine | float32 max abs |", "|---|---|---:|---:|---:|"]
    for entry in out["oracle"]:
        dtype = out["dtype"].removeprefix("torch.")
        lines.append(
            f"| {entry['model']} {entry['pooling']} {entry['length']}×{entry['batch']} | {dtype} | "
            f"{entry[dtype]['max_abs']:.2e} | {entry[dtype]['min_cosine']:.6f} | {entry['float32']['max_abs']:.2e} |"
        )
    if out["skipped"]:
        lines += ["", "skipped (time budget): " + ", ".join(out["skipped"])]
    lines += ["", f"wall time {out['wall_s']:.0f} s"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the reduced CPU form even where CUDA is available")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="the JSON file written")
    parser.add_argument("--pairs", type=int, default=None, help="interleaved pairs per case (default 10 on CUDA, 3 on CPU)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip cases that would end the run later than this")
    args = parser.parse_args(argv)
    plan = plan_for("cpu" if args.cpu or not torch.cuda.is_available() else "cuda", args.pairs)
    out = run(plan, args.budget_s, lambda line: print(line, flush=True))
    args.out.write_text(json.dumps(out, indent=1))
    print(table(out), flush=True)
    print(f"written: {args.out}", flush=True)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
