"""The natural-question figures: the SQuAD splits and their probe, step by step (benchmarks.squad_card), and the
configs tuned on WikiPos scored on natural questions (benchmarks.natural)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.figures.common import HELD_OUT_NAMES, config_text, measured_on


def _counted(data: dict[str, Any]) -> str:
    source = data["results"]["source"]
    return (
        f"Counted by `{data['command'].removeprefix('.venv/bin/')}` at commit `{data['commit'][:10]}` from "
        f"`{source['member']}` of `{source['package']}` (SHA-256 `{source['sha256'][:12]}…`)."
    )


SPREAD = ("min", "median", "max")


def _spread(low: float, middle: float, high: float) -> str:
    return f"{low:,g} / {middle:,g} / {high:,g}"


def squad_card(data: dict[str, Any]) -> str:
    """The natural SQuAD splits, step by step (`tuner.data.squad.SquadCard`)."""
    cards = data["results"]["splits"]
    names = list(cards)
    rows = [
        ("articles", lambda c: f"{c['articles']}"),
        ("paragraphs (left out: longer than a window)", lambda c: f"{c['paragraphs']:,} ({c['long_paragraphs']})"),
        ("windows", lambda c: f"{c['windows']:,}"),
        ("tokens per window, min / median / max", lambda c: _spread(*(c[f"tokens_{k}"] for k in SPREAD))),
        ("questions", lambda c: f"{c['questions']:,}"),
        ("− unanswerable", lambda c: f"{c['unanswerable']:,}"),
        ("− in a paragraph left out", lambda c: f"{c['in_long_paragraphs']:,}"),
        ("− answer not at its `answer_start`", lambda c: f"{c['misaligned']:,}"),
        ("− ambiguous: the answer is in another window too", lambda c: f"{c['ambiguous']:,}"),
        ("**questions kept**", lambda c: f"**{c['kept']:,}**"),
        ("begin / middle / end", lambda c: " / ".join(f"{n:,}" for n in c["thirds"].values())),
        ("fifths, first to last", lambda c: " / ".join(f"{n:,}" for n in c["fifths"].values())),
    ]
    lines = ["| | " + " | ".join(f"`{n}`" for n in names) + " |", "|---|" + "---:|" * len(names)]
    lines += [f"| {label} | " + " | ".join(cell(cards[n]) for n in names) + " |" for label, cell in rows]
    mpnet = data["results"]["mpnet_tokens_max"]
    longest = ", ".join(f"`{n}` {mpnet[n]}" for n in names if mpnet.get(n) is not None)
    fits = f" all-mpnet-base-v2's own tokenizer counts the longest window at {longest} tokens." if longest else ""
    return "\n".join([*lines, "", f"Tokens are all-MiniLM-L6-v2's, [CLS] and [SEP] included;{fits} {_counted(data)}"])


def squad_probe_card(data: dict[str, Any]) -> str:
    """The probe built from SQuAD's paragraphs, step by step (`tuner.data.probe.ProbeCard`)."""
    c = data["results"]["probe"]
    source = "the retrieval set (`examples/squad/squad_to_beir.py`)"
    rows = [
        (source, f"{c['passages']:,} passages, {c['queries']:,} queries"),
        (f"− queries whose passage is over {c['short_tokens']} tokens (⅓ of a window)", f"{c['long_relevant']:,}"),
        ("− queries with more or fewer than one relevant passage", f"{c['several_relevant']:,}"),
        ("− queries of passages kept back as distractors", f"{c['pooled']:,}"),
        ("− queries of windows with no room for two distractors", f"{c['unpacked']:,}"),
        ("**queries kept**", f"**{c['kept']:,}** in {c['asked_passages']:,} windows"),
        ("begin / middle / end", " / ".join(f"{n:,}" for n in c["groups"].values())),
        ("distractor passages to draw from", f"{c['pool_passages']:,}"),
        ("distractors per window, min / median / max", _spread(*(c[f"distractors_{k}"] for k in SPREAD))),
        ("tokens per window, min / median / max", _spread(*(c[f"tokens_{k}"] for k in SPREAD))),
    ]
    head = [f"| `{c['name']}` (seed {c['seed']}) | |", "|---|---:|"]
    lines = [*head, *(f"| {label} | {value} |" for label, value in rows)]
    mpnet = data["results"]["mpnet_tokens_max"].get("probe")
    fits = "" if mpnet is None else f" all-mpnet-base-v2's own tokenizer counts the longest window at {mpnet} tokens."
    return "\n".join([*lines, "", f"Tokens are all-MiniLM-L6-v2's, [CLS] and [SEP] included;{fits} {_counted(data)}"])


NATURAL_SETS = {"squad-test": "the natural SQuAD held-out split (`squad-test`)"}


def _points(values: Sequence[float]) -> str:
    estimate, low, high = values
    return f"{estimate:+.2f} [{low:+.2f}, {high:+.2f}]"


def _set_title(name: str) -> str:
    if name.startswith("probe:"):
        return f"the probe built from `{Path(name.removeprefix('probe:')).name}`"
    return NATURAL_SETS.get(name, HELD_OUT_NAMES.get(name, f"`{name}`"))


def _knob_text(knobs: dict[str, Any] | None) -> str:
    return (
        "no calibration" if not knobs or not knobs.get("strength") else config_text({"config": {**knobs, "weight": 0}})
    )


def natural(data: dict[str, Any]) -> str:
    """Configs tuned on WikiPos scored on natural questions: one table per set, then what the record says of them."""
    r = data["results"]
    parts = []
    for name in r["sets"]:
        lines = [
            f"**{_set_title(name)}**",
            "",
            "| config | nDCG@10 | HM | PSI ↓ | PSI − paper default | ΔHM | ΔnDCG@10 | end − begin |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for label, c in r["scores"][name].items():
            knobs = r["winners"].get(label)
            title = f"{label}: {_knob_text(knobs)}" if label.startswith("winner") else label
            versus = (
                "—"
                if label == "paper default"
                else f"{c['psi_minus_reference']:+.3f} ± {c['psi_minus_reference_se']:.3f}"
            )
            change = "—" if label == "no calibration" else None
            lines.append(
                f"| {title} | {c['ndcg10']:.2f} | {c['hm']:.2f} | {c['psi']:.3f} | {versus} "
                f"| {change or _points(c['hm_delta'])} | {change or _points(c['ndcg_delta'])} "
                f"| {_points(c['end_minus_begin'])} |"
            )
        parts += [*lines, "", natural_reading(r, name), ""]
    return "\n".join(
        [
            *parts,
            "nDCG@10 and HM ×100; Δ against no calibration and end − begin (points; < 0: the beginning favoured) "
            "with 95% paired-bootstrap intervals; PSI − paper default with the bootstrap SE of the difference. "
            + measured_on(data),
        ]
    )


def natural_reading(r: dict[str, Any], name: str) -> str:
    """Which winners are fairer than the paper default beyond noise (by more than one SE of the difference) on
    `name`."""
    cells = r["scores"][name]

    def seeds(labels: list[str]) -> str:
        numbers = [label.removeprefix("winner, seed ") for label in labels]
        if len(numbers) == 1:
            return f"the winner of seed {numbers[0]} is"
        return f"the winners of seeds {', '.join(numbers[:-1])} and {numbers[-1]} are"

    fairer = [
        label for label in r["winners"] if cells[label]["psi_minus_reference"] < -cells[label]["psi_minus_reference_se"]
    ]
    others = [label for label in r["winners"] if label not in fairer]
    said = []
    if fairer:
        said.append(f"{seeds(fairer)} fairer than the paper default by more than one SE")
    if others:
        said.append(f"{seeds(others)} not fairer than the paper default beyond one SE")
    return f"On {_set_title(name)}, " + "; ".join(said) + "."


def natural_reverse(data: dict[str, Any]) -> str:
    """The study tuned on the natural tuning split, its winner and the paper default held out on WikiPos."""
    study = data["results"].get("reverse")
    if not study:
        return "Not measured in this record."
    default = (study.get("paper_default") or {}).get("heldout")
    said = "" if default else ": the paper default itself, so its rows are the paper default's"

    def cell(h: dict[str, Any]) -> str:
        return f"{h['psi_ratio']:.2f}× · {h['hm_delta']} · {h['ndcg_delta']} · {h['end_minus_begin']:+.1f}"

    lines = [
        f"Winner: {_knob_text(study['config'])} (trial {study['winner']} of {study['trials']}){said}.",
        "",
        "| held-out set | winner: PSI ÷ uncalibrated · ΔHM · ΔnDCG@10 · end − begin |"
        + (" paper default: the same |" if default else ""),
        "|---|---|" + ("---|" if default else ""),
    ]
    for name, w in study["heldout"].items():
        lines.append(
            f"| {HELD_OUT_NAMES.get(name, name)} | {cell(w)} |" + (f" {cell(default[name])} |" if default else "")
        )
    return "\n".join([*lines, "", measured_on(data)])
