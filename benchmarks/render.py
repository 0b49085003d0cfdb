"""Fill the documentation's figures from the benchmarks' JSON records (docs/results/), so none is typed by hand.

A figure is a marked block in README.md or a page under docs/:

    <!-- figure: results -->
    (rendered here from docs/results/first-tune.json)
    <!-- /figure -->

`python -m benchmarks.render` rewrites every block from its record; `--check` rewrites nothing and fails, naming
the block, where a block differs from what its record renders (tests/test_docs.py runs it). Re-run a benchmark,
then this, and the docs follow.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import record

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- figure: (?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /figure -->)", re.DOTALL)
HELD_OUT_NAMES = {
    "wikipos-test": "WikiPos-test",
    "wikipos-sentences": "`sentences`",
    "wikipos-mixed": "`mixed`",
    "wikipos-lengths": "`lengths`",
}


def documents() -> list[Path]:
    """Every file whose figures are rendered: the README and the documentation's pages."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Figure:
    """A block's renderer: which record it reads (docs/results/NAME.json) and how it turns it into Markdown."""

    source: str
    render: Callable[[dict[str, Any]], str]


# ---------------------------------------------------------------- the first `make tune` (benchmarks.first_tune)


def _gb(size: float) -> str:
    return f"{size / 1e9:.1f} GB"


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


def _measured_on(data: dict[str, Any]) -> str:
    device = data["device"]
    where = device["gpu"] or f"{device['cores']} CPU cores ({device['cpu']}), {device['memory_gib']:g} GiB of memory"
    load = device["load_average"][0]
    busy = ": other jobs shared the machine" if load > device["cores"] else ""
    return (
        f"Measured by `{data['command'].removeprefix('.venv/bin/')}` at commit `{data['commit'][:10]}` on {where}, "
        f"load average {load:g}{busy}."
    )


def prerequisites(data: dict[str, Any]) -> str:
    r = data["results"]
    return "\n".join(
        [
            "| the first run, on a fresh clone | measured |",
            "|---|---:|",
            f"| `make setup` (creates `.venv`, downloads packages) | {_minutes(r['setup_seconds'])} |",
            f"| `make tune` | {_minutes(r['tune_seconds'])} |",
            f"| peak memory of `make tune` (all its processes) | {_gb(r['tune_peak_rss_bytes'])} |",
            f"| disk: `.venv/` | {_gb(r['venv_bytes'])} |",
            f"| disk: `mlruns/` after the run (stores, cache, export) | {_gb(r['mlruns_bytes'])} |",
            "",
            _measured_on(data),
        ]
    )


def _interval(values: Sequence[float] | None, scale: float, digits: int) -> str:
    if values is None:
        return "—"
    estimate, low, high = (v * scale for v in values)
    return f"{estimate:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def _config(row: dict[str, Any]) -> str:
    config = row["config"]
    if config is None:
        return "—"
    variant = {"uniform": "Uniform", "cls_soft": "CLS-Soft", "cls_hard": "CLS-Hard"}[config["variant"]]
    weight = f" w {config['weight']:g}" if config["variant"] == "cls_hard" else ""
    return f"{variant}{weight}, λ {config['strength']:g}, layers {config['layers']}, basket {config['basket_size']}"


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
            f"| {row['label']} | {_config(row)} | {100 * metrics['hm']:.2f} | {metrics['psi']:.3f} | {100 * metrics['ndcg10']:.2f} "
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
            f"{HELD_OUT_NAMES.get(first, first)}, never seen by the tuner; nDCG@10 and HM ×100; Δ against no calibration with "
            "95% paired-bootstrap intervals. " + _measured_on(data),
        ]
    )


def heldout_all(data: dict[str, Any]) -> str:
    sets = list(data["results"]["summary"][0]["heldout"])
    parts = []
    for name in sets:
        parts += [f"**{HELD_OUT_NAMES.get(name, name)}**", "", heldout_table(data, name), ""]
    return "\n".join([*parts, _measured_on(data)])


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
        f"{ran}, then stopped: trial {end['trial']} would have needed up to {int(end['needed']) / 1e6:.2f} M layer-tokens "
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


# ---------------------------------------------------------------- engine overhead (benchmarks.overhead)


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
            cells.append("—" if result is None or sdpa is None else f"{result['time_s']:.2f} s · {result['time_s'] / sdpa['time_s']:.2f}×")
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
        have = engine is not None and sdpa is not None and engine.get("extra_kib") is not None and sdpa.get("extra_kib") is not None
        extra.append(f"{(engine['extra_kib'] - sdpa['extra_kib']) / 1024:+.2f} MiB" if have else "—")  # type: ignore[index]
    lines.append("| extra peak memory, engine − SDPA | " + " | ".join(extra) + " |")
    return "\n".join([*lines, "", _measured_on(data)])


# ---------------------------------------------------------------- trial cost (benchmarks.trial_cost)


def trial_cost(data: dict[str, Any]) -> str:
    trial = data["results"]["trial"]
    lines = ["| encode | seconds | × full encode | × same trial from scratch |", "|---|---:|---:|---:|"]
    for key, seconds in trial["times"].items():
        vs = trial["vs_scratch"].get(key)
        against_scratch = "1.00" if vs is None and "scratch" in key else ("" if vs is None else f"{vs:.2f}")
        lines.append(f"| {key} | {seconds:.1f} | {trial['ratios'][key]:.2f} | {against_scratch} |")
    return "\n".join([*lines, "", _measured_on(data)])


# ---------------------------------------------------------------- where each model's bias points (benchmarks.baseline_direction)


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
            lines.append(f"| {model} | {row['structure']} | {row['psi']:.3f} ± {row['psi_se']:.3f} | {tilt} | {_direction(row)} |")
    summary = []
    for model, rows in r["models"].items():
        kinds = [_direction(row).split(" (")[0] for row in rows]
        counted = ", ".join(f"{kind} on {kinds.count(kind)}" for kind in dict.fromkeys(kinds))
        summary.append(f"**{model}**, uncalibrated, of {len(rows)} structures: {counted}.")
    note = (
        "Tilt: the fitted change of nDCG@10 from a passage's first to its last character, as a fraction of its mean; "
        f"a direction is beyond noise at {r['direction_z']:g} standard errors. {_measured_on(data)}"
    )
    return "\n".join([*lines, "", " ".join(summary), "", note])


# ---------------------------------------------------------------- RAM or memory-mapped layer inputs (benchmarks.footprint)


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
            f"| {label} | {_minutes(v['seconds'])} | {v['seconds'] / both['seconds']:.2f}× | {_gb(v['peak_rss_bytes'])} | "
            f"{_gb(v['mlruns_bytes'])} | {config} |"
        )
    return "\n".join([*lines, "", _measured_on(data)])


# ---------------------------------------------------------------- studies of one model (benchmarks.search_cost)


def studies(data: dict[str, Any]) -> str:
    """The default studies (plain `tune`) and the grid; the other samplers' are the `samplers` figure's."""
    from benchmarks.search_cost import table

    default = [r for r in data["results"]["studies"] if r["arm"] in ("robust-third", "grid")]
    return "\n".join([table(default), "", _measured_on(data)])


def samplers(data: dict[str, Any]) -> str:
    from benchmarks.search_cost import sampler_table

    return "\n".join([sampler_table(data["results"]["studies"]), "", _measured_on(data)])


# ---------------------------------------------------------------- the rules on each model's studies (benchmarks.rules_transfer)


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
        return (
            f"{e['pairs']} pairs: {e['low']:.2f} to {e['high']:.2f}, median {e['median']:.2f}; {e['outside']} outside [{low:g}, {high:g}]"
        )

    def paper(m: dict[str, Any]) -> str:
        ratios = ", ".join(f"{x:.2f}×" for x in m["paper_default_psi_ratio"])
        return f"feasible in {m['paper_default_feasible']} of {len(m['paper_default_psi_ratio'])} studies; worst-case PSI {ratios} the uncalibrated"

    rows = [
        ("studies · calibrated trials (complete, pruned)", lambda m: f"{m['studies']} · {m['trials']} ({m['complete']}, {m['pruned']})"),
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
    return "\n".join([*lines, "", _measured_on(data)])


# ---------------------------------------------------------------- plots drawn from the records


@dataclass(frozen=True)
class Plot:
    """A picture drawn from a record: `data` takes from it what is drawn, `draw` draws that into a PNG. The PNG
    carries the digest of its data (`data_digest`, in its `Description` text chunk) and its block on the page names it,
    so a record that changes changes the block (`--check` names it) and a PNG drawn from other data is told apart."""

    source: str
    data: Callable[[dict[str, Any]], dict[str, Any]]
    draw: Callable[[dict[str, Any], Any], None]
    caption: str


PLOTS_DIR = ROOT / "docs" / "plots"


def data_digest(data: dict[str, Any]) -> str:
    """The first 16 hex digits of the SHA-256 of `data` as canonical JSON."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def heldout_plot_data(data: dict[str, Any]) -> dict[str, Any]:
    """Per held-out set and calibrated config: ΔPSI and ΔHM against no calibration (estimate, low, high)."""
    rows = [row for row in data["results"]["summary"] if row["config"] is not None]
    sets = list(data["results"]["summary"][0]["heldout"])
    return {
        "sets": [HELD_OUT_NAMES.get(name, name).strip("`") for name in sets],
        "configs": {
            row["label"]: {
                "psi": [row["heldout"][name]["intervals"]["psi"] for name in sets],
                "hm": [[100 * v for v in row["heldout"][name]["intervals"]["hm"]] for name in sets],
            }
            for row in rows
        },
    }


def draw_heldout(data: dict[str, Any], figure: Any) -> None:
    axes = figure.subplots(1, 2, sharey=True)
    for axis, (key, title) in zip(axes, (("psi", "ΔPSI (lower is fairer)"), ("hm", "ΔHM (points)"))):
        for offset, (label, values) in enumerate(data["configs"].items()):
            ys = [i + 0.15 * (offset - 0.5) for i in range(len(data["sets"]))]
            estimates = [v[0] for v in values[key]]
            errors = [[v[0] - v[1] for v in values[key]], [v[2] - v[0] for v in values[key]]]
            axis.errorbar(estimates, ys, xerr=errors, fmt="o", capsize=3, label=label)
        axis.axvline(0, color="gray", linewidth=1)
        axis.set(title=title, yticks=range(len(data["sets"])), yticklabels=data["sets"])
    axes[0].legend(fontsize=8)


def search_plot_data(data: dict[str, Any]) -> dict[str, Any]:
    """Each study: its arm and seed, what it spent on a fresh machine as a share of the grid, and its winner's PSI on
    WikiPos-test as a share of no calibration's (as the Models and Search tables give them)."""
    from benchmarks.search_cost import fresh_setup, grid_as_run

    studies = data["results"]["studies"]
    setup = fresh_setup(studies)
    grid = grid_as_run(studies, setup) or studies[0]["grid_layer_tokens"]
    return {
        "studies": [
            [s["arm"], s["seed"], round((s["layer_tokens"] + setup) / grid, 4), round(s["heldout"]["wikipos-test"]["psi_ratio"], 4)]
            for s in studies
            if "wikipos-test" in s["heldout"]
        ]
    }


def draw_search(data: dict[str, Any], figure: Any) -> None:
    axis = figure.subplots()
    arms = list(dict.fromkeys(arm for arm, *_ in data["studies"]))
    for arm in arms:
        points = [(cost, psi) for name, _, cost, psi in data["studies"] if name == arm]
        axis.scatter([c for c, _ in points], [p for _, p in points], label=arm, marker="*" if arm == "grid" else "o", s=80)
    axis.axhline(1.0, color="gray", linewidth=1)
    axis.set(
        xlabel="layer-tokens on a fresh machine, × the paper grid's",
        ylabel="winner's PSI on WikiPos-test, × no calibration's",
        title="all-MiniLM-L6-v2: what each study spent and what its winner did held out",
    )
    axis.legend(fontsize=8)


def overhead_plot_data(data: dict[str, Any]) -> dict[str, Any]:
    """Each column: the engine's time over the uncalibrated forward in the same process, interleaved."""
    columns = data["results"]["columns"]
    return {"columns": [[c["title"], c["results"]["engine"]["paired_ratio"]] for c in columns if c["results"].get("engine")]}


def draw_overhead(data: dict[str, Any], figure: Any) -> None:
    axis = figure.subplots()
    titles = [title for title, _ in data["columns"]]
    axis.barh(range(len(titles)), [ratio for _, ratio in data["columns"]], color="tab:blue")
    axis.axvline(1.0, color="gray", linewidth=1)
    axis.set(yticks=range(len(titles)), yticklabels=titles, xlabel="engine ÷ uncalibrated forward (same process, interleaved)")


PLOTS: dict[str, Plot] = {
    "plot-heldout": Plot(
        "first-tune", heldout_plot_data, draw_heldout, "The default run's winner and the paper default against no calibration, held out"
    ),
    "plot-search-cost": Plot(
        "search-cost-minilm", search_plot_data, draw_search, "What each MiniLM study spent, and how fair its winner was held out"
    ),
    "plot-overhead": Plot("overhead", overhead_plot_data, draw_overhead, "The engine's time over the uncalibrated forward"),
}


def plot_path(name: str) -> Path:
    return PLOTS_DIR / f"{name.removeprefix('plot-')}.png"


def draw_plot(name: str, data: dict[str, Any]) -> Path:
    """Draw plot `name` from its record's `data` into docs/plots/, with the digest of what it drew."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot, path = PLOTS[name], plot_path(name)
    drawn = plot.data(data)
    figure = plt.figure(figsize=(8, 3.6))
    plot.draw(drawn, figure)
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"Software": None, "Source": f"docs/results/{plot.source}.json", "Description": data_digest(drawn)}
    figure.savefig(path, dpi=110, bbox_inches="tight", metadata=metadata)
    plt.close(figure)
    return path


def plot_block(name: str) -> Callable[[dict[str, Any]], str]:
    """The Markdown of plot `name`'s block: the picture, linked to itself, and its caption with the data's digest."""

    def render(data: dict[str, Any]) -> str:
        plot, path = PLOTS[name], plot_path(name)
        link = path.relative_to(ROOT / "docs").as_posix()
        digest = data_digest(plot.data(data))
        return "\n".join(
            [
                '<figure markdown="span">',
                f"  [![{plot.caption}]({link})]({link})",
                f"  <figcaption>{plot.caption}. Drawn by <code>python -m benchmarks.render</code> from "
                f"<code>docs/results/{plot.source}.json</code> (data digest <code>{digest}</code>).</figcaption>",
                "</figure>",
            ]
        )

    return render


def drawn_digest(path: Path) -> str | None:
    """The data digest a PNG of docs/plots/ was drawn from (None: no such PNG, or one without it)."""
    from PIL import Image

    if not path.exists():
        return None
    with Image.open(path) as image:
        return getattr(image, "text", {}).get("Description")  # a PNG's text chunks


# ---------------------------------------------------------------- natural SQuAD and its probe (benchmarks.squad_card)


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


# ---------------------------------------------------------------- natural questions (benchmarks.natural)

NATURAL_SETS = {"squad-test": "the natural SQuAD held-out split (`squad-test`)"}


def _points(values: Sequence[float]) -> str:
    estimate, low, high = values
    return f"{estimate:+.2f} [{low:+.2f}, {high:+.2f}]"


def _set_title(name: str) -> str:
    if name.startswith("probe:"):
        return f"the probe built from `{Path(name.removeprefix('probe:')).name}`"
    return NATURAL_SETS.get(name, HELD_OUT_NAMES.get(name, f"`{name}`"))


def _knob_text(knobs: dict[str, Any] | None) -> str:
    return "no calibration" if not knobs or not knobs.get("strength") else _config({"config": {**knobs, "weight": 0}})


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
            versus = "—" if label == "paper default" else f"{c['psi_minus_reference']:+.3f} ± {c['psi_minus_reference_se']:.3f}"
            change = "—" if label == "no calibration" else None
            lines.append(
                f"| {title} | {c['ndcg10']:.2f} | {c['hm']:.2f} | {c['psi']:.3f} | {versus} "
                f"| {change or _points(c['hm_delta'])} | {change or _points(c['ndcg_delta'])} | {_points(c['end_minus_begin'])} |"
            )
        parts += [*lines, "", natural_reading(r, name), ""]
    return "\n".join(
        [
            *parts,
            "nDCG@10 and HM ×100; Δ against no calibration and end − begin (points; < 0: the beginning favoured) with 95% "
            "paired-bootstrap intervals; PSI − paper default with the bootstrap SE of the difference. " + _measured_on(data),
        ]
    )


def natural_reading(r: dict[str, Any], name: str) -> str:
    """Which winners are fairer than the paper default beyond noise (by more than one SE of the difference) on `name`."""
    cells = r["scores"][name]

    def seeds(labels: list[str]) -> str:
        numbers = [label.removeprefix("winner, seed ") for label in labels]
        if len(numbers) == 1:
            return f"the winner of seed {numbers[0]} is"
        return f"the winners of seeds {', '.join(numbers[:-1])} and {numbers[-1]} are"

    fairer = [label for label in r["winners"] if cells[label]["psi_minus_reference"] < -cells[label]["psi_minus_reference_se"]]
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
        "| held-out set | winner: PSI ÷ uncalibrated · ΔHM · ΔnDCG@10 · end − begin |" + (" paper default: the same |" if default else ""),
        "|---|---|" + ("---|" if default else ""),
    ]
    for name, w in study["heldout"].items():
        lines.append(f"| {HELD_OUT_NAMES.get(name, name)} | {cell(w)} |" + (f" {cell(default[name])} |" if default else ""))
    return "\n".join([*lines, "", _measured_on(data)])


# ---------------------------------------------------------------- the tuning signal (benchmarks.tuning_signal)

SIGNAL_DESIGNS = {
    "descriptions": "WikiPos-dev, the default tuning set: a summary's short description asks for it",
    "titles": "the article titles as the queries instead",
    "both": "descriptions and titles over the same passages",
}


def default_study_layer_tokens(model: str) -> float:
    """The mean layer-tokens of the model's default studies (setup and trials), as `search_cost` recorded them."""
    studies = [s for s in record.read(record.RESULTS / f"search-cost-{model}.json")["results"]["studies"] if s["arm"] == "robust-third"]
    return sum(s["layer_tokens"] + s["setup_layer_tokens"] for s in studies) / len(studies)


def tuning_signal(data: dict[str, Any]) -> str:
    """Per design: queries, the median paired SE between candidates beside today's, and what the design costs."""
    r = data["results"]
    designs = r["designs"]
    today = designs.get("descriptions")
    study = default_study_layer_tokens(r["model"])
    lines = [
        "| tuning design | queries | median paired SE | ÷ the default set's | setup layer-tokens "
        "| paper default's trial layer-tokens | a default study's layer-tokens ÷ the default set's |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, d in designs.items():
        ratio = f"{d['median_paired_se'] / today['median_paired_se']:.2f}×" if today else "—"
        cost = f"{(study + d['setup_layer_tokens'] - today['setup_layer_tokens']) / study:.2f}×" if today else "—"
        title = SIGNAL_DESIGNS.get(name, f"`{name.removeprefix('squad:')}` (natural questions, with its length halves)")
        lines.append(
            f"| {title} | {d['queries']:,} | {d['median_paired_se']:.4f} | {ratio} | {d['setup_layer_tokens']:,} "
            f"| {d['trial_layer_tokens']['paper default']:,} | {cost} |"
        )
    pairs = ["", "| candidates | " + " | ".join(f"{n}: gap ± paired SE" for n in designs) + " |", "|---|" + "---:|" * len(designs)]
    first = next(iter(designs.values()))
    for index, pair in enumerate(first["pairs"]):
        cells = [f"{d['pairs'][index]['gap']:+.3f} ± {d['pairs'][index]['paired_se']:.3f}" for d in designs.values()]
        pairs.append(f"| {pair['pair'][0]} − {pair['pair'][1]} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, *pairs, "", _measured_on(data)])


FIGURES: dict[str, Figure] = {
    "prerequisites": Figure("first-tune", prerequisites),
    "results": Figure("first-tune", results),
    "heldout-all": Figure("first-tune", heldout_all),
    "trials": Figure("first-tune", trials),
    "example-output": Figure("first-tune", example_output),
    "overhead": Figure("overhead", overhead),
    "footprint": Figure("footprint", footprint),
    "trial-cost": Figure("trial-cost", trial_cost),
    "baseline-direction": Figure("baseline-direction", baseline_direction),
    "mpnet-studies": Figure("search-cost-mpnet", studies),
    "minilm-studies": Figure("search-cost-minilm", studies),
    "samplers": Figure("search-cost-minilm", samplers),
    "rules-transfer": Figure("rules-transfer", rules_transfer),
    "squad-card": Figure("squad-card", squad_card),
    "squad-probe-card": Figure("squad-card", squad_probe_card),
    "natural-minilm": Figure("natural-minilm", natural),
    "natural-minilm-reverse": Figure("natural-minilm", natural_reverse),
    "tuning-signal-minilm": Figure("tuning-signal-minilm", tuning_signal),
    "tuning-signal-squad": Figure("tuning-signal-squad", tuning_signal),
    **{name: Figure(plot.source, plot_block(name)) for name, plot in PLOTS.items()},
}


def rendered(text: str, results: Path = record.RESULTS) -> str:
    """`text` with every figure block filled from its record."""
    loaded: dict[str, dict[str, Any]] = {}

    def fill(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in FIGURES:
            raise KeyError(f"figure {name!r} has no renderer; known: {', '.join(FIGURES)}")
        figure = FIGURES[name]
        if figure.source not in loaded:
            path = results / f"{figure.source}.json"
            if not path.exists():
                raise FileNotFoundError(f"{path} is missing: run `python -m benchmarks.{figure.source.replace('-', '_')}` to measure it")
            loaded[figure.source] = record.read(path)
        return f"{match.group(1)}{figure.render(loaded[figure.source]).rstrip()}\n{match.group(4)}"

    return BLOCK.sub(fill, text)


def stale(paths: Sequence[Path], results: Path = record.RESULTS) -> list[str]:
    """The blocks whose text differs from what their record renders, as `file: figure` lines."""
    out = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        fresh = {m["name"]: m["body"] for m in BLOCK.finditer(rendered(text, results))}
        for match in BLOCK.finditer(text):
            if match["body"] != fresh[match["name"]]:
                out.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {match['name']}")
    return out


def stale_plots(results: Path = record.RESULTS) -> list[str]:
    """The plots whose PNG was not drawn from what their record holds now."""
    out = []
    for name, plot in PLOTS.items():
        if drawn_digest(plot_path(name)) != data_digest(plot.data(record.read(results / f"{plot.source}.json"))):
            out.append(f"{plot_path(name).relative_to(ROOT)}: drawn from other data than {plot.source}.json holds")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming every block that differs from its record")
    args = parser.parse_args(argv)
    if args.check:
        differ = stale(documents()) + stale_plots()
        if differ:
            sys.exit("figures that differ from their JSON record (run python -m benchmarks.render):\n" + "\n".join(differ))
        return
    for name, plot in PLOTS.items():
        data = record.read(record.RESULTS / f"{plot.source}.json")
        if drawn_digest(plot_path(name)) != data_digest(plot.data(data)):
            print(f"drew {draw_plot(name, data).relative_to(ROOT)}")
    for path in documents():
        text = path.read_text(encoding="utf-8")
        new = rendered(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"rendered {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
