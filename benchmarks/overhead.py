"""What calibration costs: encode time and extra peak memory of four ways to run the same encoder.

    sdpa    plain forward, transformers' SDPA attention (the baseline every ratio refers to)
    eager   plain forward, transformers' eager attention (materialises B×H×Q×K)
    oracle  `tuner.calibration.reference` in float32, calibration applied: the original approach of
            Appendix A (full eager matrix, per-position basket index, scatter_add / gather)
    engine  attn_implementation "posfair" inside `calibrating(spec)`: only the pooled row is
            recomputed and calibrated (cls/last), or every row from one fused call per basket (mean)

Run from the repository root:

    .venv/bin/python -m benchmarks.overhead             # full run, ~11 min on 2 idle CPU cores
    .venv/bin/python -m benchmarks.overhead --quick     # 512 tokens + MiniLM, one timed forward each
    .venv/bin/python -m benchmarks.overhead --profile   # torch.profiler table of one engine attention call
    .venv/bin/python -m benchmarks.overhead --noop      # only: λ = 0 and short passages vs SDPA (~3 min)

How it measures (also printed with the results):
- every (model, pooling, length, method) runs in a fresh process (`python -m benchmarks.overhead
  --child ...`), with the same malloc settings for all (`MALLOC_MMAP_THRESHOLD_=65536`, so freed large
  tensors go back to the OS and resident memory tracks live memory; `MALLOC_ARENA_MAX=2`);
- extra peak memory = peak resident set during the full-length forwards minus the resident set just
  before them (after model load and a warm-up forward on a 32-token slice). The peak is the kernel's
  high-water mark (VmHWM, the counter behind getrusage's ru_maxrss), reset with /proc/self/clear_refs
  before each forward so that model loading cannot hide inside it;
- the same counter, reset on entry to the self-attention module of each calibrated layer, gives the
  attention call's own extra peak (Q/K/V projections, attention, calibrated rows);
- time = median over `repeats` forwards (3 up to 512 tokens, 2 above: the oracle at 2048 takes ~40 s a
  forward) after one untimed full-length forward, inference mode, default torch threads. The engine
  process also times the plain (uncalibrated) forward of the same loaded model, interleaved
  plain/calibrated (ABBA), as many pairs as fit in ~40 s (at least `repeats`, at most 16), and
  reports the median per-pair ratio: on a shared machine this paired
  ratio is less exposed to other load than a ratio across two processes. It also times one calibrated
  layer's attention call alone (SDPA vs engine, synthetic tensors of the model's shape) and scales the
  difference by the number of calibrated layers: a third, shorter and so steadier, estimate;
- SDPA runs twice per column, first and last, to show the noise floor of both figures; every process
  also records the load average and the latency of one small parallel op (a contention probe);
- every process returns its pooled embeddings: engine vs oracle and sdpa vs eager must agree.

`--noop` measures instead what the engine costs when it has nothing to calibrate: at λ = 0, and on
passages shorter than one basket (basket = the passage length). One process per column times the
uncalibrated forward (SDPA) and both of those calibrated forwards interleaved (the order rotates
every round, as many rounds as fit in ~60 s, 3 to 16), and reports the median per-round ratio to
SDPA, whether the embeddings are SDPA's, and, steadier, one calibrated layer's attention call timed
against SDPA's (as for the engine column), scaled to the forward.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks import record

METHODS = ("sdpa", "eager", "oracle", "engine")
METHOD_LABELS = {
    "sdpa": "sdpa (plain)",
    "eager": "eager (plain)",
    "oracle": "oracle (full matrix, fp32, calibrated)",
    "engine": "engine (posfair, calibrated)",
}
ORACLE_NAME = "posfair_reference_fp32"
CHILD_ENV = {
    "MALLOC_MMAP_THRESHOLD_": "65536",
    "MALLOC_ARENA_MAX": "2",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
}
# The paper's CLS-Soft setting of §5.2: λ 0.5, basket 128, last 50% of layers.
CALIBRATION = {"variant": "cls_soft", "strength": 0.5, "basket_size": 128, "layers": 0.5}
WARMUP_TOKENS = 32
CHILD_TIMEOUT_S = 1800
PAIRED_SECONDS = 40.0
MAX_PAIRS = 16
TARGET_POOLED_RATIO = 1.05
TARGET_MEAN_RATIO = 1.5
TARGET_EXTRA_MIB = 2.0
TARGET_NOOP_RATIO = 1.03  # nothing to calibrate: SDPA's cost, within the paired ratio's noise here
NOOP_SECONDS = 60.0
NOOP_CALL_REPEATS = 20
NOOP_CONDITIONS = ("sdpa", "strength 0", "short passages")
KIB = 1024
MIB = 2**20


@dataclass(frozen=True)
class Shape:
    """A randomly initialised XLM-R encoder (bge-m3's architecture)."""

    hidden: int
    heads: int
    intermediate: int
    vocab: int
    max_positions: int


SHAPES = {
    # bge-m3's width; the vocabulary is cut from 250,002 to 8,192 rows (only the embedding lookup sees it).
    "xlmr": Shape(hidden=1024, heads=16, intermediate=4096, vocab=8192, max_positions=8194),
    "tiny": Shape(hidden=32, heads=4, intermediate=64, vocab=64, max_positions=514),
}


@dataclass(frozen=True)
class Case:
    """One process: one model, pooling, length, batch and method."""

    model: str  # "xlmr" | "tiny" (random XLM-R) | "minilm" (the real all-MiniLM-L6-v2)
    method: str  # one of METHODS
    length: int
    batch: int
    pooling: str = "cls"
    layers: int = 2  # random XLM-R only
    repeats: int = 3
    basket: int = CALIBRATION["basket_size"]
    pad_one: bool = False  # the last item holds 3/4 of `length` real tokens, the rest is padding
    run: int = 1  # 2 for the noise-floor repeat of sdpa
    call_repeats: int = 3  # engine only: timed pairs of one calibrated layer's attention call
    threads: int = 0  # torch threads; 0 leaves torch's default


# ---------------------------------------------------------------- memory


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


# ---------------------------------------------------------------- one process


def build(case: Case) -> tuple[Any, Any, Any, dict[str, Any]]:
    """The model (fp32, CPU, eval) and the inputs: random token ids between the model's own <s> and </s>."""
    import torch

    torch.manual_seed(0)
    if case.model == "minilm":
        from tuner.engine.models import load_model

        loaded = load_model("minilm", device="cpu", dtype=torch.float32)
        model, tokenizer = loaded.model, loaded.tokenizer
        start, end, pad = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
        low, vocab = 1000, tokenizer.vocab_size  # ids below ~1000 are BERT's unused/special tokens
        name = "all-MiniLM-L6-v2 (real weights)"
    else:
        from transformers import XLMRobertaConfig, XLMRobertaModel

        shape = SHAPES[case.model]
        config = XLMRobertaConfig(
            vocab_size=shape.vocab,
            hidden_size=shape.hidden,
            num_hidden_layers=case.layers,
            num_attention_heads=shape.heads,
            intermediate_size=shape.intermediate,
            max_position_embeddings=shape.max_positions,
            type_vocab_size=1,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
        )
        model = XLMRobertaModel(config, add_pooling_layer=False).eval()
        start, end, pad, low, vocab = 0, 2, 1, 4, shape.vocab
        name = f"XLM-R random init ({case.model})"
    offset = 2 if case.model != "minilm" else 0  # XLM-R positions start after the padding index
    if case.length + offset > model.config.max_position_embeddings:
        raise ValueError(f"{case.length} tokens exceed the model's {model.config.max_position_embeddings} positions")
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(low, vocab, (case.batch, case.length), generator=generator)
    mask = torch.ones_like(ids)
    ids[:, 0] = start
    ids[:, -1] = end
    if case.pad_one:
        real = max(2, case.length * 3 // 4)
        ids[-1, real - 1] = end
        ids[-1, real:] = pad
        mask[-1, real:] = 0
    config = model.config
    info = {
        "model_name": name,
        "hidden": config.hidden_size,
        "heads": config.num_attention_heads,
        "head_dim": config.hidden_size // config.num_attention_heads,
        "intermediate": config.intermediate_size,
        "num_layers": config.num_hidden_layers,
        "vocab": config.vocab_size,
    }
    return model, ids, mask, info


def encode(model: Any, ids: Any, mask: Any) -> dict[str, Any]:
    """One forward pass; the embedding under each pooling (right padding), so plain runs serve any column.

    Every embedding is a copy: a view would keep the whole last hidden state alive into the next forward.
    """
    import torch

    hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    weights = mask[..., None].to(hidden.dtype)
    return {
        "cls": hidden[:, 0].clone(),
        "last": hidden[torch.arange(len(ids)), mask.sum(-1) - 1],
        "mean": (hidden * weights).sum(1) / weights.sum(1),
    }


def small_op_latency_us(samples: int = 15) -> float:
    """Median time of one small parallel op (64 Ki floats): a probe of contention from other processes.

    Tens of µs on an idle machine; when other processes keep the cores busy each parallel op waits
    for its worker threads to be scheduled (milliseconds), which is what small ops of the engine pay.
    """
    import torch

    x, y = torch.ones(8, 16, 512), torch.ones(8, 16, 512)
    times = []
    for _ in range(samples):
        began = time.perf_counter()
        x.mul_(y)
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e6


def time_attention_call(module: Any, case: Case, spec: Any, mask: Any, heads: int, dim: int, repeats: int) -> dict[str, float]:
    """Time one calibrated layer's attention call alone: transformers' SDPA vs the engine, interleaved.

    Synthetic query/key/value with the model's own shapes and strides ((B, T, H, D) projections seen
    as (B, H, T, D)); the difference is the engine's work per calibrated layer, measured on a piece
    of work far shorter (and so far less exposed to other load) than a whole forward.
    """
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from tuner.calibration import calibrating
    from tuner.calibration.attention import calibrated_attention

    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(case.batch, case.length, heads, dim, generator=generator).transpose(1, 2) for _ in range(3))
    allowed = None if bool(mask.all()) else mask.bool()[:, None, None, :].expand(-1, 1, case.length, -1)
    kwargs = {"scaling": module.scaling, "dropout": 0.0}
    plain, engine = [], []
    with torch.inference_mode(), calibrating(spec):
        calibrated_attention(module, q, k, v, allowed, **kwargs)  # warm-up
        for i in range(repeats):
            for which in ("plain", "engine") if i % 2 == 0 else ("engine", "plain"):
                began = time.perf_counter()
                if which == "plain":
                    sdpa_attention_forward(module, q, k, v, allowed, **kwargs)
                    plain.append(time.perf_counter() - began)
                else:
                    calibrated_attention(module, q, k, v, allowed, **kwargs)
                    engine.append(time.perf_counter() - began)
    return {
        "call_sdpa_s": statistics.median(plain),
        "call_engine_s": statistics.median(engine),
        "call_extra_s": statistics.median(e - p for e, p in zip(engine, plain, strict=True)),
        "call_repeats": repeats,
    }


def profile_call(case: Case, rows: int = 14) -> str:
    """torch.profiler table (top ops by self CPU time) of one engine attention call of a calibrated layer."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from tuner.calibration import CalibrationConfig, calibrating
    from tuner.calibration.attention import calibrated_attention

    if case.threads > 0:
        torch.set_num_threads(case.threads)
    model, _, _, info = build(case)
    spec = CalibrationConfig(**{**CALIBRATION, "basket_size": case.basket, "pooling": case.pooling}).resolve(info["num_layers"])
    module = next(m for m in model.modules() if getattr(m, "layer_idx", None) in spec.layers and hasattr(m, "scaling"))
    generator = torch.Generator().manual_seed(2)
    shape = (case.batch, case.length, info["heads"], info["head_dim"])
    q, k, v = (torch.randn(*shape, generator=generator).transpose(1, 2) for _ in range(3))
    kwargs = {"scaling": module.scaling, "dropout": 0.0}
    with torch.inference_mode(), calibrating(spec):
        calibrated_attention(module, q, k, v, None, **kwargs)  # warm-up
        began = time.perf_counter()
        sdpa_attention_forward(module, q, k, v, None, **kwargs)
        sdpa_s = time.perf_counter() - began
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
            began = time.perf_counter()
            calibrated_attention(module, q, k, v, None, **kwargs)
            engine_s = time.perf_counter() - began
    table = prof.key_averages(group_by_input_shape=True).table(
        sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=30, max_shapes_column_width=60
    )
    return (
        f"{case.model} {case.pooling} {case.length}×{case.batch}, {torch.get_num_threads()} threads, small-op latency "
        f"{small_op_latency_us():.0f} µs: SDPA call {sdpa_s * 1e3:.1f} ms, engine call {engine_s * 1e3:.1f} ms "
        f"(profiled)\n{table}"
    )


def measure(case: Case) -> dict[str, Any]:
    """Run one case in this process and return its figures (times in s, memory in KiB)."""
    import torch

    from tuner.calibration import ATTENTION_NAME, CalibrationConfig, calibrating
    from tuner.calibration.reference import register_reference

    if case.method not in METHODS:
        raise ValueError(f"unknown method {case.method!r}; one of {METHODS}")
    began = time.perf_counter()
    if case.threads > 0:
        torch.set_num_threads(case.threads)
    load_before = os.getloadavg()[0]
    latency_before = small_op_latency_us()
    memory = Memory()
    model, ids, mask, info = build(case)
    implementation = {
        "sdpa": "sdpa",
        "eager": "eager",
        "oracle": register_reference(ORACLE_NAME, torch.float32),
        "engine": ATTENTION_NAME,
    }[case.method]
    model.set_attn_implementation(implementation)
    config = CalibrationConfig(**{**CALIBRATION, "basket_size": case.basket, "pooling": case.pooling})
    spec = config.resolve(info["num_layers"])
    calibrated = case.method in ("oracle", "engine")
    attention_modules = [
        module for module in model.modules() if getattr(module, "layer_idx", None) in spec.layers and hasattr(module, "scaling")
    ]

    def forward(ids_: Any, mask_: Any, calibrate: bool) -> tuple[float, Any]:
        context = calibrating(spec) if calibrate else contextlib.nullcontext()
        began_ = time.perf_counter()
        with context:
            embedding = encode(model, ids_, mask_)
        return time.perf_counter() - began_, embedding

    short_ids, short_mask = ids[:, :WARMUP_TOKENS].clone(), mask[:, :WARMUP_TOKENS].clone()
    short_ids[:, -1] = ids[0, -1]
    runs: dict[bool, dict[str, Any]] = {flag: {"times": [], "peak": 0, "attn": []} for flag in (True, False)}
    with torch.inference_mode():
        for flag in (True, False) if case.method == "engine" else (calibrated,):
            forward(short_ids, short_mask, flag)
        gc.collect()
        rss_before = memory.rss()

        def timed(flag: bool, keep: bool) -> Any:
            memory.begin()
            with attention_meter(attention_modules, memory) as attention_peaks:
                seconds, embedding = forward(ids, mask, flag)
            run = runs[flag]
            run["peak"] = max(run["peak"], memory.peak())
            run["attn"].extend(attention_peaks)
            if keep:
                run["times"].append(seconds)
            return embedding

        warm_up = time.perf_counter()
        embedding = timed(calibrated, keep=False)  # full-length warm-up; its peak counts
        warm_up = time.perf_counter() - warm_up
        plain_embedding = None
        # The engine's paired ratio is the verdict: as many ABBA pairs as fit in PAIRED_SECONDS (at least
        # `repeats`, at most MAX_PAIRS), since one forward's noise here (±5–10%) exceeds what is measured.
        pairs = max(case.repeats, min(MAX_PAIRS, math.ceil(PAIRED_SECONDS / (2 * warm_up))))
        for i in range(pairs if case.method == "engine" else case.repeats):
            if case.method == "engine":  # ABBA: plain/calibrated, calibrated/plain, ...
                for flag in (False, True) if i % 2 == 0 else (True, False):
                    out = timed(flag, keep=True)
                    if flag:
                        embedding = out
                    else:
                        plain_embedding = out
            else:
                embedding = timed(calibrated, keep=True)
        ru_maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    main, plain = runs[calibrated], runs[False]
    result: dict[str, Any] = {
        "case": asdict(case),
        "implementation": implementation,
        "calibrated_layers": sorted(spec.layers),
        **info,
        "time_s": statistics.median(main["times"]) if main["times"] else None,
        "times_s": main["times"],
        "rss_before_kib": rss_before,
        "peak_kib": main["peak"],
        "extra_kib": main["peak"] - rss_before,
        "attn_extra_kib": max(main["attn"]) if main["attn"] else None,
        "ru_maxrss_end_kib": ru_maxrss,
        "memory_method": memory.method,
        "embedding": {name: value.float().tolist() for name, value in embedding.items()},
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_avg": [load_before, os.getloadavg()[0]],
        "small_op_us": [latency_before, small_op_latency_us()],
        "wall_s": time.perf_counter() - began,
    }
    if case.method == "engine":
        ratios = [c / p for c, p in zip(main["times"], plain["times"], strict=True)]
        result.update(
            plain_time_s=statistics.median(plain["times"]) if plain["times"] else None,
            plain_times_s=plain["times"],
            paired_ratio=statistics.median(ratios) if ratios else None,
            plain_extra_kib=plain["peak"] - rss_before,
            plain_attn_extra_kib=max(plain["attn"]) if plain["attn"] else None,
            plain_embedding={name: value.float().tolist() for name, value in (plain_embedding or {}).items()},
        )
        if attention_modules and case.call_repeats > 0:
            result.update(time_attention_call(attention_modules[0], case, spec, mask, info["heads"], info["head_dim"], case.call_repeats))
            if result["plain_time_s"]:
                share = len(spec.layers) * result["call_extra_s"] / result["plain_time_s"]
                result["call_estimated_ratio"] = 1.0 + share
    return result


def measure_noop(case: Case) -> dict[str, Any]:
    """Nothing to calibrate: the engine at λ = 0 and on passages shorter than one basket, each against the
    uncalibrated forward (SDPA) of the same loaded model, in rounds of all three in a rotating order."""
    import torch

    from tuner.calibration import ATTENTION_NAME, CalibrationConfig, calibrating

    if case.threads > 0:
        torch.set_num_threads(case.threads)
    load_before, latency_before = os.getloadavg()[0], small_op_latency_us()
    model, ids, mask, info = build(case)
    model.set_attn_implementation(ATTENTION_NAME)
    config = CalibrationConfig(**{**CALIBRATION, "basket_size": case.basket, "pooling": case.pooling})
    specs = {
        "sdpa": None,
        "strength 0": config.model_copy(update={"strength": 0.0}).resolve(info["num_layers"]),
        "short passages": config.model_copy(update={"basket_size": case.length}).resolve(info["num_layers"]),
    }
    times: dict[str, list[float]] = {name: [] for name in NOOP_CONDITIONS}
    embeddings: dict[str, Any] = {}

    def forward(name: str) -> float:
        spec = specs[name]
        began = time.perf_counter()
        with calibrating(spec) if spec is not None else contextlib.nullcontext():
            embeddings[name] = encode(model, ids, mask)[case.pooling]
        return time.perf_counter() - began

    with torch.inference_mode():
        warm_up = sum(forward(name) for name in NOOP_CONDITIONS)  # untimed
        rounds = max(case.repeats, min(MAX_PAIRS, math.ceil(NOOP_SECONDS / warm_up)))
        for i in range(rounds):
            order = NOOP_CONDITIONS[i % 3 :] + NOOP_CONDITIONS[: i % 3]
            for name in order if i % 2 == 0 else order[::-1]:
                times[name].append(forward(name))
    ratios = {name: statistics.median(t / p for t, p in zip(times[name], times["sdpa"], strict=True)) for name in NOOP_CONDITIONS[1:]}
    spec = specs["strength 0"]
    module = next(m for m in model.modules() if getattr(m, "layer_idx", None) in spec.layers and hasattr(m, "scaling"))
    forward_s = statistics.median(times["sdpa"])
    calls = {}
    for name in NOOP_CONDITIONS[1:]:
        call = time_attention_call(module, case, specs[name], mask, info["heads"], info["head_dim"], case.call_repeats)
        calls[name] = {**call, "estimated_ratio": 1.0 + len(spec.layers) * call["call_extra_s"] / forward_s}
    return {
        "case": asdict(case),
        **info,
        "calibrated_layers": sorted(spec.layers),
        "rounds": rounds,
        "times_s": times,
        "paired_ratio": ratios,
        "calls": calls,
        "max_abs_diff": {name: float((embeddings[name] - embeddings["sdpa"]).abs().max()) for name in NOOP_CONDITIONS[1:]},
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_avg": [load_before, os.getloadavg()[0]],
        "small_op_us": [latency_before, small_op_latency_us()],
    }


def noop_report(titles: list[str], results: list[dict[str, Any]], command: str) -> str:
    """One verdict line per column: the paired ratios to SDPA and whether the embeddings are SDPA's."""
    out = [f"== Nothing to calibrate: engine ÷ SDPA, same process, interleaved (target ≤ {TARGET_NOOP_RATIO}×) ==", f"Command: {command}"]
    for title, result in zip(titles, results, strict=True):
        ratios, diffs, calls = result["paired_ratio"], result["max_abs_diff"], result["calls"]
        sdpa = statistics.median(result["times_s"]["sdpa"])
        for name, ratio in ratios.items():
            call, estimate = calls[name], calls[name]["estimated_ratio"]
            out.append(
                f"[{'PASS' if ratio <= TARGET_NOOP_RATIO else 'FAIL'}] {title}, {name}: paired {ratio:.3f}× "
                f"(median of {result['rounds']} rounds, SDPA {sdpa:.3f} s/fwd); from the attention call "
                f"{f'{estimate:.3f}×' if estimate > 0 else 'no ratio (the difference is noise)'} "
                f"[{'PASS' if estimate <= TARGET_NOOP_RATIO else 'FAIL'}] (engine call {call['call_engine_s'] * 1e3:.1f} ms "
                f"vs SDPA {call['call_sdpa_s'] * 1e3:.1f} ms, median difference {call['call_extra_s'] * 1e3:+.2f} ms × "
                f"{len(result['calibrated_layers'])} layer(s), {call['call_repeats']} pairs); embedding max |Δ| vs SDPA "
                f"{diffs[name]:.1e}"
            )
        out.append(
            f"[info] {title}: torch threads {result['threads']}, load average {result['load_avg'][0]:.1f}→"
            f"{result['load_avg'][1]:.1f}, small-op latency {result['small_op_us'][0]:.0f}/{result['small_op_us'][1]:.0f} µs"
        )
    return "\n".join(out)


def child_main(encoded: str) -> None:
    """Entry of a measuring process: one case as JSON in, one `RESULT {json}` line out."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    case = Case(**json.loads(encoded))
    result = measure_noop(case) if case.method == "noop" else measure(case)
    print("RESULT " + json.dumps(result), flush=True)


# ---------------------------------------------------------------- orchestration (no torch in this process)


PLAIN = ("sdpa", "eager", "sdpa#2")  # uncalibrated: independent of the pooling


@dataclass
class Column:
    """One configuration measured with every method: a column of the final table."""

    model: str
    pooling: str
    length: int
    batch: int
    layers: int
    repeats: int
    pad_one: bool
    threads: int = 0
    plain_from: Column | None = None  # a column with the same forward pass whose plain processes are reused
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # "sdpa", "sdpa#2", "eager", ...
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def title(self) -> str:
        name = {"xlmr": "XLM-R", "tiny": "tiny XLM-R", "minilm": "MiniLM"}[self.model]
        return f"{name} {self.pooling} {self.length}×{self.batch}"

    def case(self, method: str, run: int = 1) -> Case:
        return Case(
            self.model,
            method,
            self.length,
            self.batch,
            self.pooling,
            self.layers,
            self.repeats,
            pad_one=self.pad_one,
            run=run,
            call_repeats=5 if self.length <= 1024 else 3,
            threads=self.threads,
        )

    def same_forward(self, other: Column) -> bool:
        keys = ("model", "length", "batch", "layers", "repeats", "pad_one", "threads")
        return all(getattr(self, k) == getattr(other, k) for k in keys)


def run_child(case: Case, env: dict[str, str]) -> dict[str, Any]:
    """Measure `case` in a fresh interpreter and return its result (raises with the child's stderr)."""
    command = [sys.executable, "-m", "benchmarks.overhead", "--child", json.dumps(asdict(case))]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        reason = "killed (out of memory?)" if done.returncode in (-9, 137) else f"exit {done.returncode}"
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{reason}: {last}")
    return json.loads(lines[-1][len("RESULT ") :])


def default_repeats(length: int) -> int:
    return 3 if length <= 512 else 2


def plan(args: argparse.Namespace) -> list[Column]:
    def column(model: str, pooling: str, length: int, batch: int, layers: int) -> Column:
        repeats = args.repeats or default_repeats(length)
        return Column(model, pooling, length, batch, layers, repeats, args.pad_one, args.threads)

    columns = [column("xlmr", "cls", length, args.batch, args.layers) for length in args.lengths]
    for length in args.mean_lengths:
        mean = column("xlmr", "mean", length, args.batch, args.layers)
        mean.plain_from = next((c for c in columns if c.same_forward(mean)), None)
        columns.append(mean)
    if args.minilm_batch > 0:
        columns.append(column("minilm", "mean", 512, args.minilm_batch, 6))
    return columns


def execute(columns: list[Column], log: Callable[[str], None]) -> None:
    env = {**os.environ, **CHILD_ENV}
    schedule = [
        (column, method, run)
        for column in columns
        for method, run in (("sdpa", 1), ("eager", 1), ("oracle", 1), ("engine", 1), ("sdpa", 2))  # sdpa brackets
        if column.plain_from is None or method in ("oracle", "engine")
    ]
    for number, (column, method, run) in enumerate(schedule, 1):
        key = method if run == 1 else f"{method}#{run}"
        started = time.perf_counter()
        try:
            result = run_child(column.case(method, run), env)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            column.errors[key] = str(error) or type(error).__name__
            log(f"[{number:2d}/{len(schedule)}] {column.title} {key:7s} FAILED: {error}")
            continue
        column.results[key] = result
        extra = result["extra_kib"] / KIB
        paired = f", paired ×{result['paired_ratio']:.3f}" if result.get("paired_ratio") else ""
        log(
            f"[{number:2d}/{len(schedule)}] {column.title} {key:7s} {result['time_s']:8.3f} s/fwd "
            f"(median of {len(result['times_s'])}{paired}), extra peak {extra:+9.1f} MiB, "
            f"load {result['load_avg'][0]:.1f}→{result['load_avg'][1]:.1f}, "
            f"small-op {result['small_op_us'][0]:.0f}/{result['small_op_us'][1]:.0f} µs, "
            f"process {time.perf_counter() - started:.0f} s"
        )
    for column in columns:
        if column.plain_from is not None:
            for key in PLAIN:
                if key in column.plain_from.results:
                    column.results[key] = column.plain_from.results[key]


# ---------------------------------------------------------------- report


def _max_abs_diff(a: list[list[float]] | None, b: list[list[float]] | None) -> float | None:
    if not a or not b:
        return None
    return max(abs(x - y) for row_a, row_b in zip(a, b, strict=True) for x, y in zip(row_a, row_b, strict=True))


def _range(values: list[float], fmt: str) -> str:
    return "—" if not values else f"{min(values):{fmt}}–{max(values):{fmt}}"


def contention(column: Column) -> dict[str, str]:
    """Load average and small-op latency seen by the column's processes (start and end of each)."""
    results = list(column.results.values())
    return {
        "load": _range([x for r in results for x in r["load_avg"]], ".1f"),
        "small_op": _range([x for r in results for x in r["small_op_us"]], ".0f"),
    }


def _mib(kib: float | None) -> str:
    return "—" if kib is None else f"{kib / KIB:+.1f}"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def cell(column: Column, key: str) -> str:
    result = column.results.get(key)
    if result is None:
        return f"failed ({column.errors.get(key, 'not run')})"
    sdpa = column.results.get("sdpa")
    ratio = f"{result['time_s'] / sdpa['time_s']:.2f}×" if sdpa else "—"
    shared = " ¹" if column.plain_from is not None and key in PLAIN else ""
    return f"{result['time_s']:.3f} s · {ratio} · {_mib(result['extra_kib'])} MiB{shared}"


def analytic(column: Column) -> dict[str, int]:
    result = next(iter(column.results.values()), None)
    heads = result["heads"] if result else (16 if column.model == "xlmr" else 12)
    row = column.batch * heads * column.length * 4
    return {"heads": heads, "row_bytes": row, "matrix_bytes": row * column.length}


def verdicts(columns: list[Column]) -> list[str]:
    """The issue's targets, one line each."""
    lines = []
    for column in columns:
        engine, sdpa, sdpa2 = (column.results.get(k) for k in ("engine", "sdpa", "sdpa#2"))
        if engine is None or sdpa is None:
            lines.append(f"[n/a ] {column.title}: engine or sdpa failed")
            continue
        target = TARGET_MEAN_RATIO if column.pooling == "mean" else TARGET_POOLED_RATIO
        cross = engine["time_s"] / sdpa["time_s"]
        paired = engine["paired_ratio"]
        busy = contention(column)
        noise = f"; SDPA run 2 / run 1 = {sdpa2['time_s'] / sdpa['time_s']:.3f}× (cross-process noise)" if sdpa2 else ""
        noise += f"; load average {busy['load']}, small-op latency {busy['small_op']} µs"
        call = ""
        if engine.get("call_estimated_ratio"):
            estimate = engine["call_estimated_ratio"]
            call = (
                f"; from the attention call {estimate:.3f}× [{'PASS' if estimate <= target else 'FAIL'}] "
                f"(engine call {engine['call_engine_s'] * 1e3:.1f} ms vs SDPA {engine['call_sdpa_s'] * 1e3:.1f} ms, "
                f"median difference {engine['call_extra_s'] * 1e3:+.1f} ms × {len(engine['calibrated_layers'])} "
                f"calibrated layer(s) ÷ {engine['plain_time_s']:.2f} s uncalibrated forward)"
            )
        lines.append(
            f"[{'PASS' if paired <= target else 'FAIL'}] {column.title}: engine time ≤ {target}× SDPA, judged on the "
            f"paired ratio (same process, interleaved) {paired:.3f}×; across processes {cross:.3f}× "
            f"[{'PASS' if cross <= target else 'FAIL'}]{call}{noise}"
        )
        if column.pooling == "mean":
            lines.append(
                f"[info] {column.title}: extra peak of engine over SDPA "
                f"{(engine['extra_kib'] - sdpa['extra_kib']) / KIB:+.2f} MiB (two float32 basket sums, "
                f"B×H×Q×D each, inside the attention call); attention call engine − SDPA "
                f"{_delta(column, 'engine', 'sdpa', 'attn_extra_kib')}"
            )
        else:
            delta = (engine["extra_kib"] - sdpa["extra_kib"]) / KIB
            floor = abs(sdpa2["extra_kib"] - sdpa["extra_kib"]) / KIB if sdpa2 else None
            in_process = (engine["extra_kib"] - engine["plain_extra_kib"]) / KIB
            attn = (
                (engine["attn_extra_kib"] - sdpa["attn_extra_kib"]) / KIB
                if engine["attn_extra_kib"] is not None and sdpa["attn_extra_kib"] is not None
                else None
            )
            scale = analytic(column)
            judged = column.length >= 2048
            verdict = ("PASS" if delta < TARGET_EXTRA_MIB else "FAIL") if judged else "info"
            lines.append(
                f"[{verdict}] {column.title}: extra peak of engine over SDPA {delta:+.2f} MiB"
                + (f" (target < {TARGET_EXTRA_MIB:g} MiB at 2048)" if judged else "")
                + (f"; noise floor |SDPA#1 − SDPA#2| {floor:.2f} MiB" if floor is not None else "")
                + f"; in-process calibrated − plain {in_process:+.2f} MiB"
                + (f"; attention call engine − SDPA {attn:+.2f} MiB" if attn is not None else "")
                + f"; one B×H×K fp32 row = {_bytes(scale['row_bytes'])}, one B×H×Q×K matrix = {_bytes(scale['matrix_bytes'])}"
            )
    return lines


AGREEMENT = {
    "engine vs oracle (calibrated)": (("engine", "embedding"), ("oracle", "embedding")),
    "sdpa vs eager (plain)": (("sdpa", "embedding"), ("eager", "embedding")),
    "engine uncalibrated vs sdpa": (("engine", "plain_embedding"), ("sdpa", "embedding")),
    "engine vs sdpa (calibration effect)": (("engine", "embedding"), ("sdpa", "embedding")),
}
"""Which processes' pooled vectors are compared: each pair's max |Δ| is what the record keeps of them."""
RAW = ("embedding", "plain_embedding")  # each process's pooled vectors: compared (`agreement_diffs`), not recorded


def agreement_diffs(results: dict[str, dict[str, Any]], pooling: str) -> dict[str, float]:
    """Max |Δ| of the pooled vectors of each `AGREEMENT` pair that both processes returned."""
    diffs = {}
    for name, ((a, a_field), (b, b_field)) in AGREEMENT.items():
        first = (results.get(a, {}).get(a_field) or {}).get(pooling)
        second = (results.get(b, {}).get(b_field) or {}).get(pooling)
        if (diff := _max_abs_diff(first, second)) is not None:
            diffs[name] = diff
    return diffs


def summarised(column: Column) -> dict[str, Any]:
    """A column as the record keeps it: every figure measured and the agreement of the pooled vectors, without the
    vectors themselves (8 × 1,024 floats per process and pooling: the record would weigh megabytes)."""
    results = {method: {k: v for k, v in result.items() if k not in RAW} for method, result in column.results.items()}
    kept = asdict(replace(column, plain_from=None, results=results))
    return {**kept, "title": column.title, "agreement": agreement_diffs(column.results, column.pooling)}


def agreement(columns: list[Column]) -> list[str]:
    lines = []
    for column in columns:
        parts = [f"{name} {diff:.2e}" for name, diff in agreement_diffs(column.results, column.pooling).items()]
        lines.append(f"{column.title}: max |Δ| pooled embedding: " + "; ".join(parts))
    return lines


def report(columns: list[Column], command: str, wall_s: float | None = None) -> str:
    first = next((r for c in columns for r in c.results.values()), None)
    out: list[str] = []
    out.append("== Setup ==")
    out.append(
        f"machine: {os.cpu_count()} CPU cores, torch threads {first['threads'] if first else '?'}"
        f"{' (set by --threads)' if first and first['case']['threads'] else ' (default)'}, "
        f"torch {first['torch'] if first else '?'}, python {platform.python_version()}; float32 on CPU"
    )
    for column in columns:
        result = next(iter(column.results.values()), None)
        if result is None:
            continue
        out.append(
            f"{column.title}: {result['model_name']}, hidden {result['hidden']}, {result['heads']} heads × {result['head_dim']}, "
            f"intermediate {result['intermediate']}, {result['num_layers']} layers, vocab {result['vocab']}; "
            f"calibrated layers {result['calibrated_layers']} (last 50%); pooling {column.pooling}; "
            f"batch {column.batch}; median of {column.repeats} timed forwards"
        )
    basket = first["case"]["basket"] if first else CALIBRATION["basket_size"]
    out.append(
        f"calibration: CLS-Soft, λ 0.5, basket {basket}, last 50% of layers (same spec for oracle and engine); "
        "the calibrated share of layers (1/2) is bge-m3's (12 of 24)"
    )
    shared = [c for c in columns if c.plain_from is not None]
    if shared:
        out.append(
            "¹ "
            + "; ".join(f"{c.title} reuses the sdpa/eager processes of {c.plain_from.title}" for c in shared)
            + " (an uncalibrated forward does not depend on the pooling)"
        )
    pad = any(c.pad_one for c in columns)
    out.append(
        "inputs: random token ids, <s> … </s> at full length, same ids for every method; "
        + ("the last item padded to 3/4 of the length" if pad else "no padding")
    )
    if first:
        out.append(
            f"memory: one fresh process per cell, env {' '.join(f'{k}={v}' for k, v in CHILD_ENV.items() if k.startswith('MALLOC'))}; "
            f"extra peak = peak RSS during the full-length forwards − RSS just before them (after load + a "
            f"{WARMUP_TOKENS}-token warm-up); peak = {first['memory_method']}"
        )
    out.append(
        "time: inference mode, one untimed full-length forward, then the median of the timed ones; ×SDPA is the "
        "ratio to the sdpa process of the same column; 'paired' is the engine process's own median ratio of "
        "calibrated to uncalibrated forwards, interleaved ABBA (uncalibrated posfair = SDPA)"
    )
    out.append("")
    out.append("== Results: time per forward · ratio to SDPA · extra peak memory ==")
    out.append(f"Command: {command}")
    out.append("")
    out.append("| method | " + " | ".join(c.title for c in columns) + " |")
    out.append("|---|" + "---|" * len(columns))
    for key in METHODS:
        out.append(f"| {METHOD_LABELS[key]} | " + " | ".join(cell(c, key) for c in columns) + " |")

    def row(label: str, value: Callable[[Column], str]) -> None:
        out.append(f"| {label} | " + " | ".join(value(c) for c in columns) + " |")

    def get(column: Column, key: str, name: str) -> Any:
        return column.results.get(key, {}).get(name)

    row("engine ÷ uncalibrated, same process (paired)", lambda c: f"{v:.3f}×" if (v := get(c, "engine", "paired_ratio")) else "—")
    row(
        "attention call of one calibrated layer: sdpa → engine",
        lambda c: f"{v * 1e3:.1f} → {get(c, 'engine', 'call_engine_s') * 1e3:.1f} ms" if (v := get(c, "engine", "call_sdpa_s")) else "—",
    )
    row("engine ratio estimated from the attention call", lambda c: f"{v:.3f}×" if (v := get(c, "engine", "call_estimated_ratio")) else "—")
    row("sdpa, second process (noise floor)", lambda c: cell(c, "sdpa#2"))
    row("extra peak: engine − sdpa", lambda c: _delta(c, "engine", "sdpa", "extra_kib"))
    row("extra peak: sdpa#2 − sdpa (noise)", lambda c: _delta(c, "sdpa#2", "sdpa", "extra_kib"))
    row("attention call extra peak: sdpa", lambda c: _mib(get(c, "sdpa", "attn_extra_kib")) + " MiB")
    row("attention call extra peak: engine", lambda c: _mib(get(c, "engine", "attn_extra_kib")) + " MiB")
    row("load average during the column", lambda c: contention(c)["load"])
    row("small-op latency, µs (contention probe)", lambda c: contention(c)["small_op"])
    row("one B×H×K fp32 row (analytic)", lambda c: _bytes(analytic(c)["row_bytes"]))
    row("one B×H×Q×K fp32 matrix (analytic)", lambda c: _bytes(analytic(c)["matrix_bytes"]))
    out.append("")
    out.append("== Targets ==")
    out.extend(verdicts(columns))
    out.append("")
    out.append("== Agreement (the methods compute what they claim) ==")
    out.extend(agreement(columns))
    errors = [f"{c.title} {k}: {e}" for c in columns for k, e in c.errors.items()]
    if errors:
        out.append("")
        out.append("== Failed cells ==")
        out.extend(errors)
    if wall_s is not None:
        out.append("")
        out.append(f"Total wall time: {wall_s / 60:.1f} min")
    return "\n".join(out)


def _delta(column: Column, a: str, b: str, name: str) -> str:
    x, y = column.results.get(a, {}).get(name), column.results.get(b, {}).get(name)
    return "—" if x is None or y is None else f"{(x - y) / KIB:+.2f} MiB"


# ---------------------------------------------------------------- command line


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.overhead",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: XLM-R cls at 512 tokens and MiniLM, one timed forward each")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048], help="XLM-R cls lengths")
    parser.add_argument("--mean-lengths", type=int, nargs="*", default=[512], help="XLM-R mean-pooling lengths (none: skip)")
    parser.add_argument("--layers", type=int, default=2, help="XLM-R layers (bge-m3 has 24; the last half is calibrated)")
    parser.add_argument("--batch", type=int, default=8, help="XLM-R batch size")
    parser.add_argument("--minilm-batch", type=int, default=16, help="MiniLM batch at 512 tokens (0: skip MiniLM)")
    parser.add_argument("--repeats", type=int, default=0, help="timed forwards per process (default 3 up to 512 tokens, else 2)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads in every process (default: torch's)")
    parser.add_argument("--pad-one", action="store_true", help="pad the last item of each batch to 3/4 of the length")
    parser.add_argument("--json", help="also write the raw per-process results here, as a record (benchmarks.record)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead of measuring, print a torch.profiler table of one engine attention call per column",
    )
    parser.add_argument(
        "--noop",
        action="store_true",
        help="instead, time the engine with nothing to calibrate (λ = 0; passages shorter than a basket) against "
        "SDPA: XLM-R cls and mean at --mean-lengths, and MiniLM",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.lengths, args.mean_lengths, args.repeats = [512], [], args.repeats or 1
    return args


def plan_noop(args: argparse.Namespace) -> list[Column]:
    columns = [
        Column("xlmr", pooling, length, args.batch, args.layers, args.repeats or default_repeats(length), args.pad_one, args.threads)
        for length in args.mean_lengths
        for pooling in ("cls", "mean")
    ]
    if args.minilm_batch > 0:
        columns.append(Column("minilm", "mean", 512, args.minilm_batch, 6, args.repeats or 3, args.pad_one, args.threads))
    return columns


def run_noop(args: argparse.Namespace, command: str) -> None:
    env = {**os.environ, **CHILD_ENV}
    columns, results = plan_noop(args), []
    for column in columns:
        result = run_child(replace(column.case("noop"), call_repeats=NOOP_CALL_REPEATS), env)
        results.append(result)
        ratios = ", ".join(f"{name} {ratio:.3f}×" for name, ratio in result["paired_ratio"].items())
        print(f"{column.title}: {ratios} ({result['rounds']} rounds)", flush=True)
    print()
    print(noop_report([c.title for c in columns], results, command), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if args.child:
        child_main(args.child)
        return
    began = time.perf_counter()
    command = " ".join([".venv/bin/python -m benchmarks.overhead", *argv])
    if args.noop:
        run_noop(args, command)
        return
    columns = plan(args)
    if args.profile:
        for column in columns:
            print(profile_call(column.case("engine")), flush=True)
        return
    execute(columns, lambda line: print(line, flush=True))
    print()
    print(report(columns, command, time.perf_counter() - began), flush=True)
    if args.json:
        record.write(Path(args.json), "overhead", command, {"columns": [summarised(c) for c in columns]})


if __name__ == "__main__":
    main()
