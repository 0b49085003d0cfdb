"""Paper-style result tables: calibration configs against the uncalibrated model and SEA.

`run_evaluation` scores every indexing method on one positional benchmark (the shape of the paper's
Table 1, plus paired-bootstrap intervals for the changes, so a reader can tell an effect from noise)
and optionally on a general-retrieval set with original and sentence-shuffled documents (Table 3).
Retrieval and metrics are `Evaluator`'s and `objectives`'; this module only orchestrates and formats.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, Self, TypeVar

from rich.console import Console
from rich.table import Table

from objectives import PairedBootstrap, PositionReport, paired_bootstrap
from objectives.bootstrap import Interval
from tuner.calibration import CalibrationConfig
from tuner.data import PositionalDataset
from tuner.engine.models import LoadedModel
from tuner.engine.prefix import starting_layers
from tuner.evaluation.evaluator import Evaluation, Evaluator
from tuner.report.baselines import segment_embed_average, shuffle_corpus

log = logging.getLogger(__name__)

BASELINE = "No calibration"
SEA = "Segment Embed Average"


@dataclass(frozen=True)
class PositionalRow:
    """One indexing method on the positional benchmark; `deltas` is None for the baseline itself."""

    name: str
    report: PositionReport
    deltas: PairedBootstrap | None
    truncated: int
    encode_seconds: float


@dataclass(frozen=True)
class GeneralRow:
    """One method on the general set; `shuffled` is None when the shuffle check was not run."""

    name: str
    original: PositionReport
    shuffled: PositionReport | None


@dataclass(frozen=True)
class GeneralTable:
    """Table 3: does calibration keep general effectiveness, and how much does content order matter?"""

    dataset: str
    rows: tuple[GeneralRow, ...]
    shuffle_seed: int


@dataclass(frozen=True)
class MethodTable:
    """What `tune evaluate` measured, whichever the scoring: `pooling`, `padding_side` and `query_prompt` say how the
    model was loaded and what its queries were prefixed with; `general` is Table 3, where it was run."""

    model: str
    pooling: str
    padding_side: str
    query_prompt: str
    dataset: str
    general: GeneralTable | None
    n_resamples: int
    seed: int

    @classmethod
    def measured(
        cls,
        model: LoadedModel,
        dataset: str,
        general: GeneralTable | None,
        options: ScoringOptions,
        **own: Any,
    ) -> Self:
        """The table of `model` as loaded (its pooling, padding side and query prompt) on `dataset`, scored with
        `options`; `own`: the scoring's own fields."""
        loaded = (model.spec.alias, model.spec.pooling, model.spec.padding_side, model.query_prompt)
        return cls(*loaded, dataset, general, options.n_resamples, options.seed, **own)

    def as_dict(self, scoring: str, rows: list[dict[str, Any]], **own: Any) -> dict[str, Any]:
        """The JSON form every scoring shares, around its `rows` (`method_dict`) and its `own` fields."""
        shared = {"model": self.model, "pooling": self.pooling, "padding_side": self.padding_side}
        shared |= {"query_prompt": self.query_prompt, "dataset": self.dataset}
        bootstrap = {"n_resamples": self.n_resamples, "seed": self.seed}
        return {"scoring": scoring, **shared, **own, **bootstrap, "rows": rows, "general": general_dict(self.general)}


@dataclass(frozen=True)
class EvaluationTable(MethodTable):
    """Everything `run_evaluation` measured: one row per method (the first always the uncalibrated baseline) over
    the set's position groups."""

    group_order: tuple[str, ...]
    rows: tuple[PositionalRow, ...]


def methods_evaluator(
    model: LoadedModel,
    dataset: PositionalDataset,
    configs: Sequence[tuple[str, CalibrationConfig]],
    options: ScoringOptions,
) -> Evaluator:
    """An evaluator for scoring the baseline, `configs` and (if `options.sea`) SEA on `dataset` (layer inputs cached
    once)."""
    names = [BASELINE, *(name for name, _ in configs), *([SEA] if options.sea else [])]
    if len(set(names)) != len(names):
        raise ValueError(f"row names must be unique and differ from {BASELINE!r} and {SEA!r}; got {names}")
    prefix_layers = starting_layers((c for _, c in configs), model.num_layers)
    return Evaluator(model, dataset, options.batch_size, prefix_layers=prefix_layers)


def score_methods(
    evaluator: Evaluator, configs: Sequence[tuple[str, CalibrationConfig]], options: ScoringOptions
) -> Iterator[tuple[str, Evaluation]]:
    """Each indexing method's evaluation as it completes: the baseline, each named config, then (if `options.sea`)
    SEA."""
    yield BASELINE, evaluator.run(None)
    for name, config in configs:
        yield name, evaluator.run(config)
    if options.sea:
        start = time.perf_counter()
        texts = [evaluator.dataset.corpus[d] for d in evaluator.doc_ids]
        vectors, truncated = segment_embed_average(evaluator.model, texts, batch_size=options.batch_size)
        yield SEA, evaluator.score(vectors, seconds=time.perf_counter() - start, truncated=truncated)


def general_table(
    model: LoadedModel,
    configs: Sequence[tuple[str, CalibrationConfig]],
    options: ScoringOptions,
) -> GeneralTable | None:
    """Table 3: the baseline and `configs` on the general set, and (with `shuffled`) on its sentence-shuffled copy;
    None without a general set."""
    if options.general is None:
        return None
    methods: list[tuple[str, CalibrationConfig | None]] = [(BASELINE, None), *configs]
    evaluator = Evaluator(model, options.general, options.batch_size)
    originals = {name: evaluator.run(config).report for name, config in methods}
    return _general_table(evaluator, originals, methods, options.shuffled, options.seed)


@dataclass(frozen=True)
class ScoringOptions:
    """How `tune evaluate` scores, whichever the scoring: Segment Embed Average beside the configs (`sea`), Table 3
    on a `general` set and its sentence-shuffled check (`shuffled`), the paired bootstrap's `n_resamples` and
    `seed` (which also shuffles), and the batch size (None: chosen from the device's free memory)."""

    sea: bool = True
    general: PositionalDataset | None = None
    shuffled: bool = True
    n_resamples: int = 1000
    seed: int = 0
    batch_size: int | None = None


def run_evaluation(
    model: LoadedModel,
    dataset: PositionalDataset,
    configs: Sequence[tuple[str, CalibrationConfig]],
    options: ScoringOptions,
) -> EvaluationTable:
    """Score the baseline, each named config and (with `options.sea`) Segment Embed Average on `dataset`.

    Non-baseline rows carry paired-bootstrap intervals of their change against the baseline. With
    `options.general`, the baseline and configs are also scored there, and with `options.shuffled` on
    sentence-shuffled copies of its documents; without `general`, `shuffled` runs that check on `dataset`
    itself, reusing the original scores already computed.
    """
    n_resamples, seed = options.n_resamples, options.seed
    evaluator = methods_evaluator(model, dataset, configs, options)
    rows: list[PositionalRow] = []
    baseline: Evaluation | None = None
    for name, evaluation in score_methods(evaluator, configs, options):
        baseline = baseline or evaluation
        deltas = None if not rows else paired_bootstrap(baseline.per_query, evaluation.per_query, n_resamples, seed)
        rows.append(PositionalRow(name, evaluation.report, deltas, evaluation.truncated, evaluation.encode_seconds))
        _log_row(rows[-1])

    general_result = general_table(model, configs, options)
    if general_result is None and options.shuffled:
        originals = {row.name: row.report for row in rows}
        general_result = _general_table(evaluator, originals, [(BASELINE, None), *configs], options.shuffled, seed)
    return EvaluationTable.measured(
        model,
        dataset.name,
        general_result,
        options,
        group_order=dataset.group_order,
        rows=tuple(rows),
    )


def _general_table(
    original: Evaluator,
    reports: dict[str, PositionReport],
    methods: Sequence[tuple[str, CalibrationConfig | None]],
    shuffled: bool,
    seed: int,
) -> GeneralTable:
    """Pair each method's original report with one on sentence-shuffled documents (same query vectors)."""
    shuffled_reports: dict[str, PositionReport] = {}
    if shuffled:
        evaluator = Evaluator(original.model, shuffle_corpus(original.dataset, seed), original.batch_size)
        queries = original.query_vectors()
        for name, config in methods:
            documents, truncated = evaluator.document_vectors(config)
            shuffled_reports[name] = evaluator.score(documents, queries, truncated=truncated).report
            log.info("%s on %s: nDCG@10 %.4f", name, evaluator.dataset.name, shuffled_reports[name].ndcg10)
    rows = tuple(GeneralRow(name, reports[name], shuffled_reports.get(name)) for name, _ in methods)
    return GeneralTable(original.dataset.name, rows, seed)


def _log_row(row: PositionalRow) -> None:
    summary = row.deltas.summary() if row.deltas is not None else f"nDCG@10 {row.report.ndcg10:.4f}"
    log.info("%s: %s (%.1f s encoding, %d truncated)", row.name, summary, row.encode_seconds, row.truncated)


# Formatting: one grid of strings per table, shared by the rich and the markdown renderers.

Grid = tuple[str, list[str], list[list[str]]]  # title, headers, rows


def points(value: float | None) -> str:
    """A 0–1 score in points (×100, two decimals); — where undefined."""
    return "—" if value is None else f"{value * 100:.2f}"


def psi_cell(value: float | None) -> str:
    """A PSI as it is (three decimals); — where undefined."""
    return "—" if value is None else f"{value:.3f}"


def change(interval: Interval | None, scale: float = 100.0, digits: int = 2) -> str:
    """A change against the baseline with its interval (`Interval.format`); — where undefined and for the baseline."""
    return "—" if interval is None else interval.format(scale, digits)


class MethodRow(Protocol):
    """A row of a table of indexing methods: Table 1's (`PositionalRow`) or PosIR's."""

    @property
    def name(self) -> str: ...

    @property
    def deltas(self) -> Any: ...  # its changes against the baseline (a dataclass), None for the baseline itself

    @property
    def truncated(self) -> int: ...  # documents cut at the model's maximum length


Row = TypeVar("Row", bound=MethodRow)


def method_grid(title: str, columns: Sequence[tuple[str, Callable[[Row], str]]], rows: Sequence[Row]) -> Grid:
    """A table of indexing methods, as Table 1 lays it out: the method, one cell per column, the documents truncated."""
    headers = ["Indexing method", *(header for header, _ in columns), "truncated"]
    return title, headers, [[row.name, *(cell(row) for _, cell in columns), str(row.truncated)] for row in rows]


def _main_grid(table: EvaluationTable) -> Grid:
    title = (
        f"nDCG@10 on {table.dataset} by answer position — {table.model} (×100; PSI raw; Δ vs {BASELINE} "
        f"with 95% paired-bootstrap CI over {table.n_resamples} resamples)"
    )
    columns: list[tuple[str, Callable[[PositionalRow], str]]] = [
        *((group, lambda row, group=group: points(row.report.group_ndcg10[group])) for group in table.group_order),
        ("HM", lambda row: points(row.report.hm)),
        ("PSI ↓", lambda row: psi_cell(row.report.psi)),
        ("nDCG@10", lambda row: points(row.report.ndcg10)),
        ("Recall@10", lambda row: points(row.report.recall10)),
        ("ΔHM", lambda row: change(row.deltas.hm if row.deltas else None)),
        ("ΔPSI", lambda row: change(row.deltas.psi if row.deltas else None, scale=1, digits=3)),
        ("ΔnDCG@10", lambda row: change(row.deltas.ndcg10 if row.deltas else None)),
    ]
    return method_grid(title, columns, table.rows)


def general_grid(model: str, general: GeneralTable) -> Grid:
    """Table 3's grid: nDCG@10 and Recall@10 on the general set, original (and shuffled), against the baseline."""
    with_shuffle = all(row.shuffled is not None for row in general.rows)
    title = f"{general.dataset}: nDCG@10 and Recall@10 — {model} (×100; (±) vs {BASELINE})"
    if with_shuffle:
        title += f"; Shuffled: every document's sentences shuffled, seed {general.shuffle_seed}"
    headers = ["Indexing method", "nDCG@10 Original", "Recall@10 Original"]
    if with_shuffle:
        headers = [
            "Indexing method",
            "nDCG@10 Original",
            "nDCG@10 Shuffled",
            "Recall@10 Original",
            "Recall@10 Shuffled",
            "nDCG@10 Shuffled − Original",
        ]
    base = general.rows[0]

    def cell(value: float, reference: float, is_base: bool) -> str:
        return points(value) if is_base else f"{points(value)} ({(value - reference) * 100:+.2f})"

    rows = []
    for row in general.rows:
        is_base = row is base
        original = [
            cell(row.original.ndcg10, base.original.ndcg10, is_base),
            cell(row.original.recall10, base.original.recall10, is_base),
        ]
        if row.shuffled is None or base.shuffled is None:
            rows.append([row.name, *original])
            continue
        rows.append(
            [
                row.name,
                original[0],
                cell(row.shuffled.ndcg10, base.shuffled.ndcg10, is_base),
                original[1],
                cell(row.shuffled.recall10, base.shuffled.recall10, is_base),
                f"{(row.shuffled.ndcg10 - row.original.ndcg10) * 100:+.2f}",
            ]
        )
    return title, headers, rows


def _grids(table: EvaluationTable) -> list[Grid]:
    grids = [_main_grid(table)]
    if table.general is not None:
        grids.append(general_grid(table.model, table.general))
    return grids


def render(table: EvaluationTable, console: Console) -> None:
    """Print the tables to a terminal (numbers right-aligned, method names left)."""
    render_grids(_grids(table), console)


def render_grids(grids: Sequence[Grid], console: Console) -> None:
    """Print grids as rich tables (numbers right-aligned, method names left). Nothing is cut: a grid wider than the
    terminal is printed in parts, each repeating the method names (`_column_parts`)."""
    for title, headers, rows in grids:
        for part, columns in enumerate(_column_parts(headers, rows, console.width)):
            grid = Table(title=title if part == 0 else None, title_justify="left")
            for i in columns:
                grid.add_column(headers[i], justify="left" if i == 0 else "right", no_wrap=True)
            for row in rows:
                grid.add_row(*(row[i] for i in columns))
            console.print(grid)


def _column_parts(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> list[list[int]]:
    """The column indices of each part of a table `width` characters wide at most: the first column (the method) in
    every part, then as many of the others, in order, as fit beside it with the borders (3 characters a column, 1 more
    for the edge). A column too wide for any part gets one of its own."""
    sizes = [
        max(len(str(cell)) for cell in [header, *(row[i] for row in rows)]) + 3 for i, header in enumerate(headers)
    ]
    parts: list[list[int]] = []
    for i in range(1, len(headers)):
        if parts and 1 + sum(sizes[c] for c in parts[-1]) + sizes[i] <= width:
            parts[-1].append(i)
        else:
            parts.append([0, i])
    return parts or [[0]]


def to_markdown(table: EvaluationTable) -> str:
    """The same tables as GitHub markdown, each under its title in bold (`--markdown`)."""
    return grids_markdown(_grids(table))


def grids_markdown(grids: Sequence[Grid]) -> str:
    """Grids as GitHub markdown, each under its title in bold."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    blocks = []
    for title, headers, rows in grids:
        lines = [f"**{title}**", "", line(headers), line(["---"] + ["---:"] * (len(headers) - 1))]
        lines += [line(row) for row in rows]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def to_dict(table: EvaluationTable) -> dict[str, Any]:
    """JSON-ready nested dict (scores on the 0–1 scale, as in `PositionReport`), e.g. for `mlflow.log_dict`."""
    rows = [method_dict(row, row.report.as_dict(), encode_seconds=row.encode_seconds) for row in table.rows]
    return table.as_dict("posfair", rows, group_order=list(table.group_order))


def method_dict(row: MethodRow, metrics: Mapping[str, Any], **more: Any) -> dict[str, Any]:
    """One method's row as JSON: its figures (`metrics`), its changes against the baseline, what was truncated."""
    deltas = None if row.deltas is None else asdict(row.deltas)
    return {"name": row.name, "metrics": dict(metrics), "deltas": deltas, "truncated": row.truncated, **more}


def general_dict(general: GeneralTable | None) -> dict[str, Any] | None:
    """Table 3 as a JSON-ready dict (None without it)."""
    if general is None:
        return None
    return {
        "dataset": general.dataset,
        "shuffle_seed": general.shuffle_seed,
        "rows": [
            {
                "name": row.name,
                "original": _retrieval(row.original),
                "shuffled": None if row.shuffled is None else _retrieval(row.shuffled),
            }
            for row in general.rows
        ],
    }


def _retrieval(report: PositionReport) -> dict[str, float]:
    return {"ndcg10": report.ndcg10, "recall10": report.recall10}
