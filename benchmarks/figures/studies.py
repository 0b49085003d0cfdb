"""The figures of whole studies: where each model's bias points (benchmarks.baseline_direction), what studies cost
and win (benchmarks.search_cost), the rules on each model's studies (benchmarks.rules_transfer) and the tuning
signal (benchmarks.tuning_signal)."""

from __future__ import annotations

from typing import Any

from benchmarks import record
from benchmarks.figures.common import measured_on


def _direction(row: dict[str, Any]) -> str:
    if row["tilt"] is None:
        return "unknown"
    if not row["beyond_noise"]:
        return "level (within noise): no direction to reverse"
    return "beginning favoured" if row["tilt"] < 0 else "end favoured"


def baseline_direction(data: dict[str, Any]) -> str:
    r = data["results"]
    lines = ["| model | structure | PSI ± SE | tilt ± SE | uncalibrated bias |", "|---|---|---:|---:|---|"]
    for model, rows in r["models"].items():
        for row in rows:
            tilt = "—" if row["tilt"] is None else f"{row['tilt']:+.3f} ± {row['tilt_se']:.3f}"
            lines.append(
                f"| {model} | {row['structure']} | {row['psi']:.3f} ± {row['psi_se']:.3f} | {tilt} "
                f"| {_direction(row)} |"
            )
    summary = []
    for model, rows in r["models"].items():
        kinds = [_direction(row).split(" (")[0] for row in rows]
        counted = ", ".join(f"{kind} on {kinds.count(kind)}" for kind in dict.fromkeys(kinds))
        summary.append(f"**{model}**, uncalibrated, of {len(rows)} structures: {counted}.")
    note = (
        "Tilt: the fitted change of nDCG@10 from a passage's first to its last character, as a fraction of its mean; "
        f"a direction is beyond noise at {r['direction_z']:g} standard errors. {measured_on(data)}"
    )
    return "\n".join([*lines, "", " ".join(summary), "", note])


def studies(data: dict[str, Any]) -> str:
    """The default studies (plain `tune`) and the grid; the other samplers' are the `samplers` figure's."""
    from benchmarks.search_cost import table

    default = [r for r in data["results"]["studies"] if r["arm"] in ("robust-third", "grid")]
    return "\n".join([table(default), "", measured_on(data)])


def samplers(data: dict[str, Any]) -> str:
    from benchmarks.search_cost import sampler_table

    return "\n".join([sampler_table(data["results"]["studies"]), "", measured_on(data)])


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in counts.items()) or "none"


def _missed(counts: dict[str, int]) -> str:
    """Each constraint by the title the tuner's own messages give it."""
    from objectives.constraint import REQUIREMENTS

    return "; ".join(f"{REQUIREMENTS[name].title}: {n}" for name, n in counts.items()) or "none"


def rules_transfer(data: dict[str, Any]) -> str:
    r = data["results"]
    models = r["models"]
    low, high = r["drift_exponent_bounds"]

    def exponents(m: dict[str, Any]) -> str:
        e = m["exponents"]
        if not e["pairs"]:
            return "no family measured at two λ"
        where_feasible = (
            f" ({e['outside_where_feasible']} in a family with a feasible λ)"
            if e["outside"] and "outside_where_feasible" in e  # records made before it was counted lack it
            else ""
        )
        return (
            f"{e['pairs']} pairs: {e['low']:.2f} to {e['high']:.2f}, median {e['median']:.2f}; "
            f"{e['outside']} outside [{low:g}, {high:g}]{where_feasible}"
        )

    def paper(m: dict[str, Any]) -> str:
        ratios = ", ".join(f"{x:.2f}×" for x in m["paper_default_psi_ratio"])
        return (
            f"feasible in {m['paper_default_feasible']} of {len(m['paper_default_psi_ratio'])} studies; "
            f"worst-case PSI {ratios} the uncalibrated"
        )

    rows = [
        (
            "studies · calibrated trials (complete, pruned)",
            lambda m: f"{m['studies']} · {m['trials']} ({m['complete']}, {m['pruned']})",
        ),
        ("trials that missed each constraint", lambda m: _missed(m["missed"])),
        ("complete trials that met every constraint", lambda m: str(m["feasible"])),
        ("pruned as worse beyond noise (no constraint missed)", lambda m: str(m["pruned_as_worse"])),
        ("structure that set a complete trial's objective", lambda m: _counts(m["worst_structure"])),
        ("rung order (least biased first)", lambda m: " → ".join(m["rung_order"]) or "—"),
        ("drift law exponents p (drift ∝ λ^p)", exponents),
        ("the paper default (trial 1)", paper),
        ("winners", lambda m: "; ".join(m["winners"])),
    ]
    lines = ["| | " + " | ".join(m["model"] for m in models) + " |", "|---|" + "---|" * len(models)]
    lines += [f"| {title} | " + " | ".join(cell(m) for m in models) + " |" for title, cell in rows]
    return "\n".join([*lines, "", measured_on(data)])


SIGNAL_DESIGNS = {
    "descriptions": "`wikipos-dev`: a summary's short description asks for it",
    "titles": "the article titles as the queries instead",
    "both": "`wikipos-dev+titles`, the default tuning set: descriptions and titles over the same passages",
}


def wikipos_dev_study_layer_tokens(model: str) -> float:
    """The mean layer-tokens of the model's studies on `wikipos-dev` (setup and trials), as `search_cost` recorded
    them in `search-cost-{model}.json`."""
    studies = [
        s
        for s in record.read(record.RESULTS / f"search-cost-{model}.json")["results"]["studies"]
        if s["arm"] == "robust-third"
    ]
    return sum(s["layer_tokens"] + s["setup_layer_tokens"] for s in studies) / len(studies)


def tuning_signal(data: dict[str, Any]) -> str:
    """Per design: queries, the median paired SE between candidates beside `wikipos-dev`'s, and what the design
    costs."""
    r = data["results"]
    designs = r["designs"]
    plain = designs.get("descriptions")
    study = wikipos_dev_study_layer_tokens(r["model"])
    lines = [
        "| tuning design | queries | median paired SE | ÷ `wikipos-dev`'s | setup layer-tokens "
        "| paper default's trial layer-tokens | a study's layer-tokens ÷ on `wikipos-dev` |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, d in designs.items():
        ratio = f"{d['median_paired_se'] / plain['median_paired_se']:.2f}×" if plain else "—"
        cost = f"{(study + d['setup_layer_tokens'] - plain['setup_layer_tokens']) / study:.2f}×" if plain else "—"
        title = SIGNAL_DESIGNS.get(name, f"`{name.removeprefix('squad:')}` (natural questions, with its length halves)")
        lines.append(
            f"| {title} | {d['queries']:,} | {d['median_paired_se']:.4f} | {ratio} | {d['setup_layer_tokens']:,} "
            f"| {d['trial_layer_tokens']['paper default']:,} | {cost} |"
        )
    pairs = [
        "",
        "| candidates | " + " | ".join(f"{n}: gap ± paired SE" for n in designs) + " |",
        "|---|" + "---:|" * len(designs),
    ]
    first = next(iter(designs.values()))
    for index, pair in enumerate(first["pairs"]):
        cells = [f"{d['pairs'][index]['gap']:+.3f} ± {d['pairs'][index]['paired_se']:.3f}" for d in designs.values()]
        pairs.append(f"| {pair['pair'][0]} − {pair['pair'][1]} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, *pairs, "", measured_on(data)])
