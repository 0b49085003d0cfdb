"""The first `make tune`'s figures (benchmarks.first_tune): what it takes, its held-out results, its trials, its
output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.figures.common import HELD_OUT_NAMES, config_text, gb, measured_on, minutes


def prerequisites(data: dict[str, Any]) -> str:
    r = data["results"]
    return "\n".join(
        [
            "| the first run, on a fresh clone | measured |",
            "|---|---:|",
            f"| `make setup` (creates `.venv`, downloads packages) | {minutes(r['setup_seconds'])} |",
            f"| `make tune` | {minutes(r['tune_seconds'])} |",
            f"| peak memory of `make tune` (all its processes) | {gb(r['tune_peak_rss_bytes'])} |",
            f"| disk: `.venv/` | {gb(r['venv_bytes'])} |",
            f"| disk: `mlruns/` after the run (stores, cache, export) | {gb(r['mlruns_bytes'])} |",
            "",
            measured_on(data),
        ]
    )


def _interval(values: Sequence[float] | None, scale: float, digits: int) -> str:
    if values is None:
        return "—"
    estimate, low, high = (v * scale for v in values)
    return f"{estimate:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def heldout_table(data: dict[str, Any], set_name: str) -> str:
    """No calibration, the paper default and the winner on one held-out set, with 95% paired-bootstrap intervals."""
    lines = [
        "| config | | HM | PSI ↓ | nDCG@10 | ΔHM | ΔPSI | ΔnDCG@10 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in data["results"]["summary"]:
        held = row["heldout"][set_name]
        metrics, intervals = held["metrics"], held["intervals"] or {}
        lines.append(
            f"| {row['label']} | {config_text(row)} | {100 * metrics['hm']:.2f} | {metrics['psi']:.3f} "
            f"| {100 * metrics['ndcg10']:.2f} "
            f"| {_interval(intervals.get('hm'), 100, 2)} | {_interval(intervals.get('psi'), 1, 3)} "
            f"| {_interval(intervals.get('ndcg10'), 100, 2)} |"
        )
    return "\n".join(lines)


def results(data: dict[str, Any]) -> str:
    first = next(iter(data["results"]["summary"][0]["heldout"]))
    return "\n".join(
        [
            heldout_table(data, first),
            "",
            f"{HELD_OUT_NAMES.get(first, first)}, never seen by the tuner; nDCG@10 and HM ×100; "
            "Δ against no calibration with 95% paired-bootstrap intervals. " + measured_on(data),
        ]
    )


def heldout_all(data: dict[str, Any]) -> str:
    sets = list(data["results"]["summary"][0]["heldout"])
    parts = []
    for name in sets:
        parts += [f"**{HELD_OUT_NAMES.get(name, name)}**", "", heldout_table(data, name), ""]
    return "\n".join([*parts, measured_on(data)])


def trials(data: dict[str, Any]) -> str:
    """The study's trials as every store counts them (`tuner.common.trials.TrialCounts`, kept in the record), and
    the draw the budget had no room for, which never ran."""
    study = data["results"]["study"]
    counts, attrs = study["counts"], study["user_attrs"]
    ran = (
        f"The default study ran {counts['complete'] + counts['pruned']} trials ({counts['complete']} complete, "
        f"{counts['pruned']} pruned between rungs)"
    )
    end = attrs.get("budget_end")
    if end is None:
        return ran + ": `--trials` ended it before the budget did."
    left = max(int(end["trials"]) - int(end["spent"]), 0)
    return (
        f"{ran}, then stopped: trial {end['trial']} would have needed up to "
        f"{int(end['needed']) / 1e6:.2f} M layer-tokens "
        f"and {left / 1e6:.2f} M were left of the trials' {int(end['trials']) / 1e6:.2f} M, so it was not run."
    )


def example_output(data: dict[str, Any]) -> str:
    """The tuning split's table as the run printed it (the held-out ones follow it), then its closing lines."""
    r = data["results"]
    lines = r["stdout"].rstrip().splitlines()
    tuning = lines[: next((i for i, line in enumerate(lines) if "held out," in line), len(lines))]
    keep = ("winner:", "exported config:", "registered model:")  # whole lines: a wrapped one would be cut
    tail = [line.strip() for line in r["stderr_tail"] if line.strip().startswith(keep)]
    return "```text\n" + "\n".join(line.rstrip() for line in tuning) + "\n" + "\n".join(tail) + "\n```"
