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
from benchmarks.figures import costs, first_tune, natural, plots, rules, studies

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- figure: (?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /figure -->)", re.DOTALL)


def documents() -> list[Path]:
    """Every file whose figures are rendered: the README and the documentation's pages."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Figure:
    """A block's renderer: which record it reads (docs/results/NAME.json) and how it turns it into Markdown."""

    source: str
    render: Callable[[dict[str, Any]], str]


FIGURES: dict[str, Figure] = {
    "prerequisites": Figure("first-tune", first_tune.prerequisites),
    "results": Figure("first-tune", first_tune.results),
    "heldout-all": Figure("first-tune", first_tune.heldout_all),
    "trials": Figure("first-tune", first_tune.trials),
    "example-output": Figure("first-tune", first_tune.example_output),
    "overhead": Figure("overhead", costs.overhead),
    "footprint": Figure("footprint", costs.footprint),
    "trial-cost": Figure("trial-cost", costs.trial_cost),
    "baseline-direction": Figure("baseline-direction", studies.baseline_direction),
    "baseline-direction-embeddinggemma": Figure("baseline-direction-embeddinggemma", studies.baseline_direction),
    "mpnet-studies": Figure("search-cost-mpnet-titles", studies.studies),
    "mpnet-studies-wikipos-dev": Figure("search-cost-mpnet", studies.studies),
    "minilm-studies": Figure("search-cost-minilm-titles", studies.studies),
    "embeddinggemma-studies": Figure("search-cost-embeddinggemma", studies.studies),
    "samplers": Figure("search-cost-minilm", studies.samplers),
    "rules-transfer": Figure("rules-transfer", studies.rules_transfer),
    "rules-transfer-titles": Figure("rules-transfer-titles", studies.rules_transfer),
    "squad-card": Figure("squad-card", natural.squad_card),
    "squad-probe-card": Figure("squad-card", natural.squad_probe_card),
    "natural-minilm": Figure("natural-minilm", natural.natural),
    "natural-minilm-reverse": Figure("natural-minilm", natural.natural_reverse),
    "natural-mpnet": Figure("natural-mpnet", natural.natural),
    "natural-mpnet-reverse": Figure("natural-mpnet", natural.natural_reverse),
    "study-noise-minilm": Figure("selection-rules-minilm", rules.study_noise),
    "selection-rules-minilm": Figure("selection-rules-minilm", rules.rules_held_out),
    "study-noise-mpnet": Figure("selection-rules-mpnet", rules.study_noise),
    "selection-rules-mpnet": Figure("selection-rules-mpnet", rules.rules_held_out),
    "study-noise-embeddinggemma": Figure("selection-rules-embeddinggemma", rules.study_noise),
    "selection-rules-embeddinggemma": Figure("selection-rules-embeddinggemma", rules.rules_held_out),
    "gaps-embeddinggemma": Figure("selection-rules-embeddinggemma", rules.gaps_held_out),
    "tuning-signal-minilm": Figure("tuning-signal-minilm", studies.tuning_signal),
    "tuning-signal-squad": Figure("tuning-signal-squad", studies.tuning_signal),
    **{name: Figure(plot.source, plots.plot_block(name)) for name, plot in plots.PLOTS.items()},
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
                module = figure.source.replace("-", "_")
                writer = (
                    f"`python -m benchmarks.{module}`"
                    if (ROOT / "benchmarks" / f"{module}.py").is_file()
                    else "the benchmark that writes it (benchmarks/README.md gives each one's command)"
                )
                raise FileNotFoundError(f"{path} is missing: run {writer}, then render again")
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
    for name, plot in plots.PLOTS.items():
        if plots.drawn_digest(plots.plot_path(name)) != plots.data_digest(
            plot.data(record.read(results / f"{plot.source}.json"))
        ):
            out.append(
                f"{plots.plot_path(name).relative_to(ROOT)}: drawn from other data than {plot.source}.json holds"
            )
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 naming every block that differs from its record"
    )
    args = parser.parse_args(argv)
    if args.check:
        differ = stale(documents()) + stale_plots()
        if differ:
            sys.exit(
                "figures that differ from their JSON record (run python -m benchmarks.render):\n" + "\n".join(differ)
            )
        return
    for name, plot in plots.PLOTS.items():
        data = record.read(record.RESULTS / f"{plot.source}.json")
        if plots.drawn_digest(plots.plot_path(name)) != plots.data_digest(plot.data(data)):
            print(f"drew {plots.draw_plot(name, data).relative_to(ROOT)}")
    for path in documents():
        text = path.read_text(encoding="utf-8")
        new = rendered(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"rendered {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
