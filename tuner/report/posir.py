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
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from rich.console import Console

from objectives.posir import BUCKETS, Placement, PosIRDeltas, PosIRFigures, posir_bootstrap, posir_figures
from tuner.calibration import CalibrationConfig
from tuner.data import PositionalDataset
from tuner.data.posir import QUERY_INSTRUCTION, PosIRFolder, PosIRSpan
from tuner.engine.models import LoadedModel
from tuner.report.tables import (
    BASELINE,
    GeneralTable,
    Grid,
    general_dict,
    general_grid,
    general_table,
    grids_markdown,
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
class PosIRTable:
    """What `run_posir_evaluation` measured; the first row is the uncalibrated baseline."""

    model: str
    pooling: str
    padding_side: str
    query_prompt: str
    dataset: str
    domains: tuple[str, ...]
    rows: tuple[PosIRRow, ...]
    general: GeneralTable | None
    n_resamples: int
    seed: int


def with_query_prompt(model: LoadedModel, prompt: str) -> LoadedModel:
    """The same loaded model whose queries are prefixed with `prompt` instead of its own query prompt."""
    return replace(model, spec=replace(model.spec, query_prompt=prompt))


def run_posir_evaluation(
    model: LoadedModel,
    folders: Sequence[PosIRFolder],
    configs: Sequence[tuple[str, CalibrationConfig]],
    *,
    name: str,
    instruction: bool = True,
    sea: bool = True,
    general: PositionalDataset | None = None,
    shuffled: bool = True,
    n_resamples: int = 1000,
    seed: int = 0,
    batch_size: int | None = None,
) -> PosIRTable:
    """Score the baseline, each named config and (if `sea`) SEA on every domain folder, each over its own corpus,
    and PosIR's figures over their pooled queries (`name`: what the table calls them). With `instruction`, every
    query is prefixed with PosIR's instruction (`QUERY_INSTRUCTION`), as its evaluation prefixes every model's.
    `general` (and `shuffled`) add posfair's Table 3, with the model's own query prompt."""
    scoring_model = with_query_prompt(model, QUERY_INSTRUCTION) if instruction else model
    scores: dict[str, list[np.ndarray]] = {}
    truncated: dict[str, int] = {}
    spans: list[PosIRSpan] = []
    for folder in folders:
        evaluator = methods_evaluator(scoring_model, folder.dataset, configs, sea=sea, batch_size=batch_size)
        for method, evaluation in score_methods(evaluator, configs, sea=sea, batch_size=batch_size):
            scores.setdefault(method, []).append(evaluation.per_query.ndcg10)
            truncated[method] = truncated.get(method, 0) + evaluation.truncated
            log.info("%s on %s: nDCG@10 %.4f", method, folder.dataset.name, evaluation.report.ndcg10)
        spans.extend(folder.spans[qid] for qid in evaluator.query_ids)
    placement = Placement.of([s.span for s in spans], [s.char_length for s in spans], [s.token_length for s in spans])
    pooled = {method: np.concatenate(parts) for method, parts in scores.items()}
    rows = tuple(
        PosIRRow(
            method,
            posir_figures(values, placement),
            None if method == BASELINE else posir_bootstrap(pooled[BASELINE], values, placement, n_resamples, seed),
            truncated[method],
        )
        for method, values in pooled.items()
    )
    general_result = (
        general_table(model, general, configs, shuffled=shuffled, seed=seed, batch_size=batch_size) if general is not None else None
    )
    return PosIRTable(
        model.spec.alias,
        model.spec.pooling,
        model.spec.padding_side,
        scoring_model.spec.query_prompt,
        name,
        tuple(folder.dataset.name for folder in folders),
        rows,
        general_result,
        n_resamples,
        seed,
    )


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
    headers = [
        "Indexing method",
        "nDCG@10",
        "PSI ↓",
        *(f"nDCG@10 {b}" for b in BUCKETS),
        *(f"PSI {b}" for b in BUCKETS),
        "ΔnDCG@10",
        "ΔPSI",
        "truncated",
    ]
    rows = []
    for row in table.rows:
        figures, deltas = row.figures, row.deltas
        rows.append(
            [
                row.name,
                points(figures.ndcg10),
                psi_cell(figures.psi),
                *(points(b.ndcg10) for b in figures.buckets),
                *(psi_cell(b.psi) for b in figures.buckets),
                "—" if deltas is None else deltas.ndcg10.format(),
                "—" if deltas is None or deltas.psi is None else deltas.psi.format(scale=1, digits=3),
                str(row.truncated),
            ]
        )
    return title, headers, rows


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
    return {
        "scoring": "posir",
        "model": table.model,
        "pooling": table.pooling,
        "padding_side": table.padding_side,
        "query_prompt": table.query_prompt,
        "dataset": table.dataset,
        "domains": list(table.domains),
        "n_resamples": table.n_resamples,
        "seed": table.seed,
        "rows": [
            {
                "name": row.name,
                "metrics": row.figures.as_dict(),
                "deltas": None if row.deltas is None else asdict(row.deltas),
                "truncated": row.truncated,
            }
            for row in table.rows
        ],
        "general": general_dict(table.general),
    }
