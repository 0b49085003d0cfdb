"""The plots drawn from the records into docs/plots/, each PNG stamped with the digest of the data it shows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import record
from benchmarks.figures.common import HELD_OUT_NAMES


@dataclass(frozen=True)
class Plot:
    """A picture drawn from a record: `data` takes from it what is drawn, `draw` draws that into a PNG. The PNG
    carries the digest of its data (`data_digest`, in its `Description` text chunk) and its block on the page names it,
    so a record that changes changes the block (`--check` names it) and a PNG drawn from other data is told apart."""

    source: str
    data: Callable[[dict[str, Any]], dict[str, Any]]
    draw: Callable[[dict[str, Any], Any], None]
    caption: str


PLOTS_DIR = record.ROOT / "docs" / "plots"


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
            [
                s["arm"],
                s["seed"],
                round((s["layer_tokens"] + setup) / grid, 4),
                round(s["heldout"]["wikipos-test"]["psi_ratio"], 4),
            ]
            for s in studies
            if "wikipos-test" in s["heldout"]
        ]
    }


def draw_search(data: dict[str, Any], figure: Any) -> None:
    axis = figure.subplots()
    arms = list(dict.fromkeys(arm for arm, *_ in data["studies"]))
    for arm in arms:
        points = [(cost, psi) for name, _, cost, psi in data["studies"] if name == arm]
        axis.scatter(
            [c for c, _ in points], [p for _, p in points], label=arm, marker="*" if arm == "grid" else "o", s=80
        )
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
    return {
        "columns": [[c["title"], c["results"]["engine"]["paired_ratio"]] for c in columns if c["results"].get("engine")]
    }


def draw_overhead(data: dict[str, Any], figure: Any) -> None:
    axis = figure.subplots()
    titles = [title for title, _ in data["columns"]]
    axis.barh(range(len(titles)), [ratio for _, ratio in data["columns"]], color="tab:blue")
    axis.axvline(1.0, color="gray", linewidth=1)
    axis.set(
        yticks=range(len(titles)),
        yticklabels=titles,
        xlabel="engine ÷ uncalibrated forward (same process, interleaved)",
    )


PLOTS: dict[str, Plot] = {
    "plot-heldout": Plot(
        "first-tune",
        heldout_plot_data,
        draw_heldout,
        "The default run's winner and the paper default against no calibration, held out",
    ),
    "plot-search-cost": Plot(
        "search-cost-minilm",
        search_plot_data,
        draw_search,
        "What each MiniLM study spent, and how fair its winner was held out",
    ),
    "plot-overhead": Plot(
        "overhead", overhead_plot_data, draw_overhead, "The engine's time over the uncalibrated forward"
    ),
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
        link = path.relative_to(record.ROOT / "docs").as_posix()
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
