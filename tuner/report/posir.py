"""`tune evaluate --scoring posir`: PosIR's own figures (`objectives.posir`) for the baseline, each config and SEA.

PosIR's evaluation retrieves each `<language>/<domain>` folder over its own corpus (its eval.sh runs one
domain at a time) and its analysis then pools the per-query nDCG@10 of a language's domains before binning
them. This module does the same: one evaluator per domain folder, the queries of all of them pooled into one
set of figures, with paired-bootstrap intervals for each config's change against the uncalibrated model.
Every query counts, whether or not its answer lies past the tokens the model reads (PosIR's protocol
drops none; the table counts the truncated documents).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from rich.console import Console

from objectives.posir import BUCKETS, Placement, PosIRDeltas, PosIRFigures, posir_bootstrap, posir_figures
from tuner.calibration import CalibrationConfig
from tuner.data.posir import QUERY_INSTRUCTION, PosIRFolder, PosIRSpan
from tuner.engine.models import LoadedModel
from tuner.report.tables import (
    BASELINE,
    Grid,
    MethodTable,
    ScoringOptions,
    change,
    general_grid,
    general_table,
    grids_markdown,
    method_dict,
    method_grid,
    methods_evaluator,
    points,
    psi_cell,
    render_grids,
    score_methods,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PosIRRow:
    """One indexing method over every domain; `deltas` is None for the baseline itself."""

    name: str
    figures: PosIRFigures
    deltas: PosIRDeltas | None
    truncated: int


@dataclass(frozen=True)
class PosIRTable(MethodTable):
    """What `run_posir_evaluation` measured over its `domains`; the first row is the uncalibrated baseline."""

    domains: tuple[str, ...]
    rows: tuple[PosIRRow, ...]


def with_query_prompt(model: LoadedModel, prompt: str) -> LoadedModel:
    """The same loaded model whose queries are prefixed with `prompt` instead of its own query prompt."""
    pipeline = replace(model.pipeline, query_prompt=prompt)
    return replace(model, spec=replace(model.spec, query_prompt=prompt), pipeline=pipeline)


def run_posir_evaluation(
    model: LoadedModel,
    folders: Sequence[PosIRFolder],
    configs: Sequence[tuple[str, CalibrationConfig]],
    options: ScoringOptions,
    *,
    name: str,
    instruction: bool = True,
) -> PosIRTable:
    """Score the baseline, each named config and (with `options.sea`) SEA on every domain folder, each over its own
    corpus, and PosIR's figures over their pooled queries (`name`: what the table calls them). With `instruction`,
    every query is prefixed with PosIR's instruction (`QUERY_INSTRUCTION`), as its evaluation prefixes every
    model's. `options.general` (and `shuffled`) add posfair's Table 3, with the model's own query prompt."""
    scoring_model = with_query_prompt(model, QUERY_INSTRUCTION) if instruction else model
    scores: dict[str, list[np.ndarray]] = {}
    truncated: dict[str, int] = {}
    spans: list[PosIRSpan] = []
    for folder in folders:
        evaluator = methods_evaluator(scoring_model, folder.dataset, configs, options)
        for method, evaluation in score_methods(evaluator, configs, options):
            scores.setdefault(method, []).append(evaluation.per_query.ndcg10)
            truncated[method] = truncated.get(method, 0) + evaluation.truncated
            log.info("%s on %s: nDCG@10 %.4f", method, folder.dataset.name, evaluation.report.ndcg10)
        spans.extend(folder.spans[qid] for qid in evaluator.query_ids)
    placement = Placement.of([s.span for s in spans], [s.char_length for s in spans], [s.token_length for s in spans])
    pooled = {method: np.concatenate(parts) for method, parts in scores.items()}
    resampled = (options.n_resamples, options.seed)
    rows = tuple(
        PosIRRow(
            method,
            posir_figures(values, placement),
            None if method == BASELINE else posir_bootstrap(pooled[BASELINE], values, placement, *resampled),
            truncated[method],
        )
        for method, values in pooled.items()
    )
    domains = tuple(folder.dataset.name for folder in folders)
    general_result = general_table(model, configs, options)
    return PosIRTable.measured(scoring_model, name, general_result, options, domains=domains, rows=rows)


def _prompt_words(table: PosIRTable) -> str:
    if table.query_prompt == QUERY_INSTRUCTION:
        return "queries prefixed with PosIR's instruction"
    return "queries with the model's own prompt" if table.query_prompt else "queries without a prompt"


def posir_grid(table: PosIRTable) -> Grid:
    """PosIR's figures, one row per indexing method, with the baseline's per-bucket query counts in the title."""
    base = table.rows[0].figures
    counts = ", ".join(f"{b.name} {b.n_queries}" for b in base.buckets)
    domains = f"{len(table.domains)} domain" + ("s" if len(table.domains) != 1 else "")
    title = (
        f"PosIR's figures on {table.dataset} ({domains}; {base.n_queries} queries, {base.n_placed} placed: {counts}) — "
        f"{table.model}, {_prompt_words(table)} (nDCG@10 ×100; PSI raw over 20 position bins; Δ vs {BASELINE} with 95% "
        f"paired-bootstrap CI over {table.n_resamples} resamples; — undefined)"
    )
    columns: list[tuple[str, Callable[[PosIRRow], str]]] = [
        ("nDCG@10", lambda row: points(row.figures.ndcg10)),
        ("PSI ↓", lambda row: psi_cell(row.figures.psi)),
        *((f"nDCG@10 {b}", lambda row, i=i: points(row.figures.buckets[i].ndcg10)) for i, b in enumerate(BUCKETS)),
        *((f"PSI {b}", lambda row, i=i: psi_cell(row.figures.buckets[i].psi)) for i, b in enumerate(BUCKETS)),
        ("ΔnDCG@10", lambda row: change(row.deltas.ndcg10 if row.deltas else None)),
        ("ΔPSI", lambda row: change(row.deltas.psi if row.deltas else None, scale=1, digits=3)),
    ]
    return method_grid(title, columns, table.rows)


def _grids(table: PosIRTable) -> list[Grid]:
    return [posir_grid(table), *([general_grid(table.model, table.general)] if table.general is not None else [])]


def render(table: PosIRTable, console: Console) -> None:
    """Print the tables to a terminal."""
    render_grids(_grids(table), console)


def to_markdown(table: PosIRTable) -> str:
    """The tables as GitHub markdown."""
    return grids_markdown(_grids(table))


def to_dict(table: PosIRTable) -> dict[str, Any]:
    """JSON-ready figures (0–1 scale; None where undefined), named as in `objectives.posir.PosIRFigures.as_dict`."""
    rows = [method_dict(row, row.figures.as_dict()) for row in table.rows]
    return table.as_dict("posir", rows, domains=list(table.domains))
