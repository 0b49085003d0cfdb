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

This module runs the cases and writes the JSON and the table: `benchmarks.gpu_cases` defines the cases,
`benchmarks.gpu_measure` measures one, `benchmarks.gpu_counters` counts host syncs and attention kernels.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_cases import PATHS, Case, Plan, build_model, plan_for
from benchmarks.gpu_measure import against_oracle, measure


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
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return answer.stdout.splitlines()[0].strip() if answer.stdout.strip() else None


def kernels_named(kernels: dict[str, Any]) -> str:
    """'EFFICIENT_ATTENTION' for a path whose SDPA and engine use one kernel, else each side's, e.g.
    'SDPA CUDNN_ATTENTION; engine CUDNN_ATTENTION + EFFICIENT_ATTENTION'."""
    if "error" in kernels:
        return f"not run: {kernels['error']}"
    sides = {
        run: " + ".join(sorted({b for kind in kernels[run].values() for b in kind})) or "none"
        for run in ("sdpa", "engine")
    }
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
        f"{kernels_named(result['kernels']['pinned'])} | {ratio(default)} "
        f"| {kernels_named(result['kernels']['default'])} | "
        f"{extra} | {syncs['engine']} (SDPA {syncs['sdpa']}) | "
        f"{'/'.join('yes' if bit.get(path) else 'NO' for path in PATHS)} | {same} |"
    )


def table(out: dict[str, Any]) -> str:
    v = out["versions"]
    built = f", CUDA {v['cuda']}, cuDNN {v['cudnn']}, driver {v['driver']}" if out["mode"] == "cuda" else ""
    lines = [
        (
            f"{out['device']} ({out['mode']}, {out['dtype']}, torch {v['torch']}, "
            f"transformers {v['transformers']}{built}), "
            f"{out['date']}; median of {out['pairs']} interleaved pairs; basket {out['basket']}; pinned: SDPA as "
            f"sdpa_kernel({out['pinned_backend']}), default: as torch picks"
        ),
        "",
        "| case | SDPA pinned | engine pinned | engine ÷ SDPA pinned | kernels pinned | engine ÷ SDPA default | "
        "kernels default | extra peak | host syncs / forward | λ 0 = SDPA pinned/default | prefix resume = full |",
        "|---|---:|---:|---:|---|---:|---|---:|---:|---|---|",
    ]
    lines += [row(result) for result in out["cases"]]
    lines += [
        "",
        "| model, pooling | dtype | max abs vs fp32 oracle | min cosine | float32 max abs |",
        "|---|---|---:|---:|---:|",
    ]
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
    parser.add_argument(
        "--pairs", type=int, default=None, help="interleaved pairs per case (default 10 on CUDA, 3 on CPU)"
    )
    parser.add_argument(
        "--budget-s", type=float, default=420.0, help="skip cases that would end the run later than this"
    )
    args = parser.parse_args(argv)
    plan = plan_for("cpu" if args.cpu or not torch.cuda.is_available() else "cuda", args.pairs)
    out = run(plan, args.budget_s, lambda line: print(line, flush=True))
    args.out.write_text(json.dumps(out, indent=1))
    print(table(out), flush=True)
    print(f"written: {args.out}", flush=True)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
