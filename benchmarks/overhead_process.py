"""One measuring process of the overhead benchmark: it builds the model of its case, runs the forwards and
returns their times, memory and pooled vectors (`python -m benchmarks.overhead --child CASE`)."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import resource
import statistics
import time
from dataclasses import asdict
from typing import Any

from benchmarks.overhead_cases import CALIBRATION, METHODS, SHAPES, WARMUP_TOKENS, Case
from benchmarks.overhead_memory import Memory, attention_meter

ORACLE_NAME = "posfair_reference_fp32"
PAIRED_SECONDS = 40.0
MAX_PAIRS = 16
NOOP_SECONDS = 60.0
NOOP_CONDITIONS = ("sdpa", "strength 0", "short passages")


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


def time_attention_call(
    module: Any, case: Case, spec: Any, mask: Any, heads: int, dim: int, repeats: int
) -> dict[str, float]:
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
    spec = CalibrationConfig(**{**CALIBRATION, "basket_size": case.basket, "pooling": case.pooling}).resolve(
        info["num_layers"]
    )
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
        module
        for module in model.modules()
        if getattr(module, "layer_idx", None) in spec.layers and hasattr(module, "scaling")
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
            result.update(
                time_attention_call(
                    attention_modules[0], case, spec, mask, info["heads"], info["head_dim"], case.call_repeats
                )
            )
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
    ratios = {
        name: statistics.median(t / p for t, p in zip(times[name], times["sdpa"], strict=True))
        for name in NOOP_CONDITIONS[1:]
    }
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
        "max_abs_diff": {
            name: float((embeddings[name] - embeddings["sdpa"]).abs().max()) for name in NOOP_CONDITIONS[1:]
        },
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_avg": [load_before, os.getloadavg()[0]],
        "small_op_us": [latency_before, small_op_latency_us()],
    }


def child_main(encoded: str) -> None:
    """Entry of a measuring process: one case as JSON in, one `RESULT {json}` line out."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    case = Case(**json.loads(encoded))
    result = measure_noop(case) if case.method == "noop" else measure(case)
    print("RESULT " + json.dumps(result), flush=True)
