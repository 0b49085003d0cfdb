"""The selection rules' figures (benchmarks.selection_rules): how noisy each kept study is between its top trials,
and what each rule's winners do held out against the paper default."""

from __future__ import annotations

import re
from typing import Any

from benchmarks.figures.common import HELD_OUT_NAMES, measured_on

RULE_NAMES = {
    "one-se": "one-SE, the mildest",
    "one-se-fairest": "one-SE, the fairest over the structures",
    "one-se-hm": "one-SE, the highest HM",
    "lowest": "the lowest objective",
}


def _seed(study: dict[str, Any]) -> str:
    return study["study"].rsplit("seed", 1)[-1]


def study_noise(data: dict[str, Any]) -> str:
    """Per kept study: the best trial, the exported winner and the runner-up, each gap with its paired SE."""
    lines = [
        "| design | seed | feasible | best objective | winner | winner − best ± paired SE "
        "| runner-up − best ± paired SE | decided by the tie-break |",
        "|---|---:|---:|---|---|---:|---:|---|",
    ]
    for study in data["results"]["studies"]:
        if not study.get("top"):
            lines.append(f"| `{study['design']}` | {_seed(study)} | 0 | — | — | — | — | — |")
            continue
        top = {row["trial"]: row for row in study["top"]}
        best = top[study["best"]]
        winner = top.get(study["winner"])
        runner = next((row for row in study["top"] if row["trial"] != study["best"]), None)

        def gap(row: dict[str, Any] | None) -> str:
            if row is None:
                return "—"
            se = row["paired_se"]
            return f"{row['gap']:+.3f} ± {se:.3f}" if se is not None else f"{row['gap']:+.3f}"

        lines.append(
            f"| `{study['design']}` | {_seed(study)} | {study['feasible']} "
            f"| {_short_layers(best['config'])} ({best['objective']:.3f}) "
            f"| {_short_layers(winner['config']) if winner else study['winner']} | {gap(winner)} | {gap(runner)} "
            f"| {'yes' if study['tie_break_decided'] else 'no'} |"
        )
    counts = []
    for design in dict.fromkeys(s["design"] for s in data["results"]["studies"]):
        studies = [s for s in data["results"]["studies"] if s["design"] == design and s.get("top")]
        decided = sum(bool(s["tie_break_decided"]) for s in studies)
        counts.append(f"{decided} of {len(studies)} studies on `{design}`")
    said = "The tie-break chose the winner in " + ", ".join(counts) + "."
    return "\n".join([*lines, "", f"{said} {measured_on(data)}"])


def rules_held_out(data: dict[str, Any]) -> str:
    """Per design, a table of rules by held-out set: how many seeds' winners beat the paper default beyond noise, the
    mean PSI difference from it, and whether the seeds agree; reversals where there are any."""
    results = data["results"]
    sets = results["heldout"]
    out = []
    for design, rules in results["verdicts"].items():
        out += [f"**`{design}`**", "", "| rule | " + " | ".join(HELD_OUT_NAMES.get(s, f"`{s}`") for s in sets) + " |"]
        out.append("|---|" + "---:|" * len(sets))
        for rule, verdict in rules.items():
            cells = []
            for name in sets:
                v = verdict[name]
                flips = f" · {v['reversed']} reversed" if v["reversed"] else ""
                agree = "✓" if v["agree"] else "✗"
                cells.append(f"{v['beat_paper']}/{v['seeds']} · {v['mean_psi_minus_paper']:+.3f} · {agree}{flips}")
            out.append(f"| {RULE_NAMES.get(rule, rule)} | " + " | ".join(cells) + " |")
        out.append("")
    legend = (
        "Each cell: seeds whose winner is fairer than the paper default by more than the SE of their PSI difference, "
        "with ΔHM and ΔnDCG@10 no lower than the low ends of the paper default's 95% intervals · the winners' "
        "mean PSI − the paper default's · ✓ where the seeds' PSI spreads no wider than one bootstrap SE."
    )
    return "\n".join([*out, legend, "", *rules_reading(results), "", measured_on(data)])


def rules_reading(results: dict[str, Any]) -> list[str]:
    """Per design, the sets on which some rule's winners all beat the paper default, agree and reverse nothing (the
    promise met), and where none does."""
    said = []
    for design, rules in results["verdicts"].items():
        met = {
            name: [
                f"`{rule}`"
                for rule, verdict in rules.items()
                if verdict[name]["beat_paper"] == verdict[name]["seeds"]
                and verdict[name]["agree"]
                and not verdict[name]["reversed"]
            ]
            for name in results["heldout"]
        }
        kept = [f"{HELD_OUT_NAMES.get(n, f'`{n}`')} ({', '.join(r)})" for n, r in met.items() if r]
        missed = [HELD_OUT_NAMES.get(n, f"`{n}`") for n, r in met.items() if not r]
        first = f"On `{design}`, every seed's winner beats the paper default, the seeds agree and none reverses on "
        parts = [first + "; ".join(kept)] if kept else [f"On `{design}`, no rule meets all three tests on any set"]
        if kept and missed:
            parts.append("no rule does on " + ", ".join(missed))
        said.append("- " + "; ".join(parts) + ".")
    return said


def _short_layers(label: str) -> str:
    """A config's label with a run of consecutive layers written as its ends: L[12–23] for L[12, 13, …, 23]."""

    def short(match: re.Match[str]) -> str:
        layers = [int(n) for n in match.group(1).split(",")]
        consecutive = len(layers) > 2 and layers == list(range(layers[0], layers[-1] + 1))
        return f"L[{layers[0]}–{layers[-1]}]" if consecutive else match.group(0)

    return re.sub(r"L\[([\d, ]+)\]", short, label)


def _points(interval: list[float]) -> str:
    estimate, low, high = interval
    return f"{estimate:+.1f} [{low:+.1f}, {high:+.1f}]"


def gaps_held_out(data: dict[str, Any]) -> str:
    """Per held-out set: no calibration, the paper default and each study's exported winner, with its begin-to-end
    gap, how far it moved that gap against no calibration and its ΔnDCG@10 (95% intervals); then, per set, how
    many winners narrowed the gap beyond noise and how many lost nDCG@10 beyond noise."""
    from benchmarks.selection_rules import NONE, PAPER

    results = data["results"]
    seeds: dict[tuple[str, str], list[str]] = {}  # (design, winner) → the seeds that exported it
    for s in results["studies"]:
        if "winner_config" in s:
            seeds.setdefault((s["design"], s["winner_config"]), []).append(_seed(s))
    rows = [(NONE, NONE), (PAPER, PAPER)]
    for (design, config), numbers in seeds.items():
        same = all(scores[config] == scores[PAPER] for scores in results["scores"].values())
        shown = f"{_short_layers(config)}{' (the paper default)' if same else ''}"
        rows.append((config, f"`{design}` seed{'s' * (len(numbers) > 1)} {', '.join(numbers)}: {shown}"))
    out = []
    for name in results["heldout"]:
        scores = results["scores"][name]
        out += [
            f"Held out, {HELD_OUT_NAMES.get(name, f'`{name}`')}:",
            "",
            "| config | PSI× | end − begin | moved against no calibration | ΔnDCG@10 |",
            "|---|---:|---:|---:|---:|",
        ]
        for label, shown in rows:
            c = scores[label]
            out.append(
                f"| {shown} | {c['psi_ratio']:.2f}× | {_points(c['end_minus_begin'])} | {_points(c['gap_delta'])} "
                f"| {_points(c['ndcg_delta'])} |"
            )
        out.append("")
    said = []
    for design, sets in results["exported"].items():
        for name, v in sets.items():
            paper = v["paper_default"]
            said.append(
                f"- {HELD_OUT_NAMES.get(name, f'`{name}`')}, `{design}`: the winner narrows the gap beyond noise in "
                f"{v['narrowed']} of {v['seeds']} studies and loses nDCG@10 beyond noise in {v['ndcg_lost']}; the "
                "paper default "
                f"{'narrows' if paper['narrowed'] else 'does not narrow'} it beyond noise and "
                f"{'loses' if paper['ndcg_lost'] else 'does not lose'} nDCG@10 beyond noise."
            )
    legend = (
        "End − begin: the last position group's nDCG@10 less the first's (points; below 0 the beginning is "
        "favoured); moved: that gap less no calibration's on the same query resamples. A gap narrows beyond noise "
        "when the whole 95% interval of the move points towards zero and the bias is not reversed; nDCG@10 is lost "
        "beyond noise when the whole interval of ΔnDCG@10 lies below zero."
    )
    return "\n".join([*out, legend, "", *said, "", measured_on(data)])
