"""What every figure's text shares: the line that says how a record was measured, sizes, durations, a config's
name and the held-out sets' names."""

from __future__ import annotations

from typing import Any

HELD_OUT_NAMES = {  # as the pages name the held-out sets
    "wikipos-test": "WikiPos-test",
    "wikipos-test-packed": "WikiPos-test packed",
    "wikipos-sentences": "`sentences`",
    "wikipos-mixed": "`mixed`",
    "wikipos-lengths": "`lengths`",
}


def gb(size: float) -> str:
    """Bytes in GB, one decimal."""
    return f"{size / 1e9:.1f} GB"


def minutes(seconds: float) -> str:
    """A duration as whole minutes and seconds."""
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


def measured_on(data: dict[str, Any]) -> str:
    """The sentence under a figure: the command, commit and machine of its record, and whether others shared it."""
    device = data["device"]
    where = device["gpu"] or f"{device['cores']} CPU cores ({device['cpu']}), {device['memory_gib']:g} GiB of memory"
    load = device["load_average"][0]
    # a benchmark keeps every core busy itself, so the last minute's load reaches the core count without anyone
    # else; a whole runnable job more than that is another process's
    busy = ": other jobs shared the machine" if load >= device["cores"] + 1 else ""
    return (
        f"Measured by `{data['command'].removeprefix('.venv/bin/')}` at commit `{data['commit'][:10]}` on {where}, "
        f"load average {load:g}{busy}."
    )


def config_text(row: dict[str, Any]) -> str:
    """A row's calibration config in the pages' words ("—" for no calibration)."""
    config = row["config"]
    if config is None:
        return "—"
    variant = {"uniform": "Uniform", "cls_soft": "CLS-Soft", "cls_hard": "CLS-Hard"}[config["variant"]]
    weight = f" w {config['weight']:g}" if config["variant"] == "cls_hard" else ""
    return f"{variant}{weight}, λ {config['strength']:g}, layers {config['layers']}, basket {config['basket_size']}"
