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

This module is the command line and runs the processes: `benchmarks.overhead_cases` holds what they measure,
`benchmarks.overhead_process` is one measuring process (with `benchmarks.overhead_memory`'s meter) and
`benchmarks.overhead_report` the table, the verdicts and the record.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchmarks import record
from benchmarks.overhead_cases import CHILD_ENV, KIB, PLAIN, Case, Column
from benchmarks.overhead_process import child_main, profile_call
from benchmarks.overhead_report import noop_report, report, summarised

CHILD_TIMEOUT_S = 1800
NOOP_CALL_REPEATS = 20


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


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.overhead",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: XLM-R cls at 512 tokens and MiniLM, one timed forward each"
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048], help="XLM-R cls lengths")
    parser.add_argument(
        "--mean-lengths", type=int, nargs="*", default=[512], help="XLM-R mean-pooling lengths (none: skip)"
    )
    parser.add_argument(
        "--layers", type=int, default=2, help="XLM-R layers (bge-m3 has 24; the last half is calibrated)"
    )
    parser.add_argument("--batch", type=int, default=8, help="XLM-R batch size")
    parser.add_argument("--minilm-batch", type=int, default=16, help="MiniLM batch at 512 tokens (0: skip MiniLM)")
    parser.add_argument(
        "--repeats", type=int, default=0, help="timed forwards per process (default 3 up to 512 tokens, else 2)"
    )
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
        Column(
            "xlmr",
            pooling,
            length,
            args.batch,
            args.layers,
            args.repeats or default_repeats(length),
            args.pad_one,
            args.threads,
        )
        for length in args.mean_lengths
        for pooling in ("cls", "mean")
    ]
    if args.minilm_batch > 0:
        columns.append(
            Column("minilm", "mean", 512, args.minilm_batch, 6, args.repeats or 3, args.pad_one, args.threads)
        )
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
