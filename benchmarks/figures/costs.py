"""What calibration costs: the engine's time and memory (benchmarks.overhead), a trial's encodes
(benchmarks.trial_cost), and the layer inputs held in RAM or memory-mapped (benchmarks.footprint)."""

from __future__ import annotations

from typing import Any

from benchmarks.figures.common import gb, measured_on, minutes


def overhead(data: dict[str, Any]) -> str:
    columns = data["results"]["columns"]
    methods = ("sdpa", "eager", "oracle", "engine")
    lines = [
        "| method | " + " | ".join(c["title"] for c in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for method in methods:
        cells = []
        for column in columns:
            result, sdpa = column["results"].get(method), column["results"].get("sdpa")
            cells.append(
                "—"
                if result is None or sdpa is None
                else f"{result['time_s']:.2f} s · {result['time_s'] / sdpa['time_s']:.2f}×"
            )
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    paired = [column["results"].get("engine", {}).get("paired_ratio") for column in columns]
    lines.append(
        "| **engine ÷ uncalibrated, same process, interleaved** | "
        + " | ".join("—" if p is None else f"**{p:.3f}×**" for p in paired)
        + " |"
    )
    extra = []
    for column in columns:
        engine, sdpa = column["results"].get("engine"), column["results"].get("sdpa")
        have = (
            engine is not None
            and sdpa is not None
            and engine.get("extra_kib") is not None
            and sdpa.get("extra_kib") is not None
        )
        extra.append(f"{(engine['extra_kib'] - sdpa['extra_kib']) / 1024:+.2f} MiB" if have else "—")  # type: ignore[index]
    lines.append("| extra peak memory, engine − SDPA | " + " | ".join(extra) + " |")
    return "\n".join([*lines, "", measured_on(data)])


def trial_cost(data: dict[str, Any]) -> str:
    trial = data["results"]["trial"]
    lines = ["| encode | seconds | × full encode | × same trial from scratch |", "|---|---:|---:|---:|"]
    for key, seconds in trial["times"].items():
        vs = trial["vs_scratch"].get(key)
        against_scratch = "1.00" if vs is None and "scratch" in key else ("" if vs is None else f"{vs:.2f}")
        lines.append(f"| {key} | {seconds:.1f} | {trial['ratios'][key]:.2f} | {against_scratch} |")
    return "\n".join([*lines, "", measured_on(data)])


def footprint(data: dict[str, Any]) -> str:
    r = data["results"]
    variants = r["variants"]
    lines = [
        "| held in RAM | `tune` wall time | × both in RAM | peak memory | `mlruns/` after | exported config |",
        "|---|---:|---:|---:|---:|---|",
    ]
    labels = {
        "both": "layer inputs and first-layer sums in RAM",
        "sums": "first-layer sums in RAM, layer inputs memory-mapped",
        "neither": "neither: layer inputs memory-mapped, sums recomputed",
    }
    both = variants["both"]
    for name, label in labels.items():
        v = variants[name]
        c = v["config"]
        config = f"{c['variant']} λ {c['strength']:g} L{c['layers']} B{c['basket_size']}"
        lines.append(
            f"| {label} | {minutes(v['seconds'])} | {v['seconds'] / both['seconds']:.2f}× "
            f"| {gb(v['peak_rss_bytes'])} | {gb(v['mlruns_bytes'])} | {config} |"
        )
    return "\n".join([*lines, "", measured_on(data)])
