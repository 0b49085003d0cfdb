"""PosIR (Zeng et al., 2026): position-aware retrieval with length buckets, one language/domain folder at a time.

Why the buckets: PosIR separates position bias from length-induced degradation by comparing positions only
among documents of similar length. Each query is put in a length quartile by its positive document's token
length, Q1 <= 512 < Q2 <= 1024 < Q3 <= 1536 < Q4, and in a third by where its reference span sits: the
span's character midpoint over the document's character length (`tuner.data.dataset.span_third`), the same
relative position PosIR's own analysis (ndcg_PSI_analysis.py) uses. The third is the query's group
("begin" / "middle" / "end") and the quartile its stratum (`strata[qid]`), so HM and PSI compare the thirds
within each quartile and are then averaged over quartiles (`objectives.metrics`).

A quartile whose queries do not cover all three thirds has no defined HM or PSI; its queries are left out
of the position statistics (no group, no stratum; a warning names the quartile) and still count for
aggregate nDCG@10 and Recall@10.

Expected layout of one dataset folder (the benchmark's `<language>/<domain>/`), all parquet:

    queries.parquet       _id, text, pos_char_span ([start, end]), pos_char_length, pos_token_length
    corpus.parquet        _id, text
    qrels/test.parquet    query-id, corpus-id, score

Every file and column name is a field of `PosIRLayout` and can be overridden by keyword, e.g.
`load_posir(path, token_length="len_tokens")` or `load_benchmark("posir:PATH", qrels_file="qrels.parquet")`.
- Without a qrels file, a queries column naming the relevant doc (`relevant_doc`, default "corpus-id") is used.
- `char_length=None` measures the relevant document's text instead of reading a column.
- `qrels_file` may also be a TSV (`.tsv`) in BEIR's layout.
- Cross-lingual runs (x -> en): point `corpus_file` at the English corpus, e.g.
  `corpus_file="/data/PosIR/eng-Latn/arxiv/corpus.parquet"` (an absolute path replaces the folder).

Queries whose span or lengths are missing or invalid (length <= 0, negative span) stay in the dataset for
aggregate nDCG but get no group and no stratum, as PosIR's analysis drops them from position statistics.
Queries without a relevant document are dropped with a warning.

`read_posir` reads a folder for PosIR's own figures instead (`objectives.posir`: 20 position bins within the
length buckets, as its analysis script computes them): the dataset without groups, and each query's span and
lengths as the files give them; `posir_domains` lists the domain folders of a `<language>` folder, whose
queries that analysis pools.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.data.dataset import THIRDS, PositionalDataset, span_third
from tuner.data.jsonl import read_qrels_tsv

QUARTILE_LIMITS: tuple[tuple[int, str], ...] = ((512, "Q1"), (1024, "Q2"), (1536, "Q3"))
QUARTILES: tuple[str, ...] = ("Q1", "Q2", "Q3", "Q4")


@dataclass(frozen=True)
class PosIRLayout:
    """File names (relative to the dataset folder, or absolute) and column names of a PosIR dataset."""

    queries_file: str = "queries.parquet"
    corpus_file: str = "corpus.parquet"
    qrels_file: str = "qrels/test.parquet"
    query_id: str = "_id"
    query_text: str = "text"
    span: str = "pos_char_span"
    char_length: str | None = "pos_char_length"
    token_length: str = "pos_token_length"
    relevant_doc: str = "corpus-id"
    doc_id: str = "_id"
    doc_text: str = "text"
    qrels_query: str = "query-id"
    qrels_doc: str = "corpus-id"
    qrels_score: str = "score"


def length_quartile(token_length: int) -> str:
    """PosIR's length bucket of a positive document: Q1 <= 512 < Q2 <= 1024 < Q3 <= 1536 < Q4 tokens."""
    for limit, label in QUARTILE_LIMITS:
        if token_length <= limit:
            return label
    return QUARTILES[-1]


def read_columns(path: Path, columns: Mapping[str, str | None]) -> dict[str, list[Any]]:
    """Layout field -> column values of a parquet file; a missing column names the file and the override."""
    import pyarrow.parquet as pq

    if not path.is_file():
        raise FileNotFoundError(f"PosIR file {path} not found; see tuner.data.posir for the expected layout")
    present = set(pq.read_schema(path).names)
    for layout_field, column in columns.items():
        if column is not None and column not in present:
            raise ValueError(
                f"{path} has no column {column!r} (columns: {sorted(present)}); "
                f"pass {layout_field}='<column name>' to load_posir / load_benchmark to use another column"
            )
    wanted = {f: c for f, c in columns.items() if c is not None}
    table = pq.read_table(path, columns=list(dict.fromkeys(wanted.values())))
    return {f: table.column(c).to_pylist() for f, c in wanted.items()}


def position_group(span: Any, char_length: Any, token_length: Any) -> tuple[str, str] | None:
    """(quartile, third) of one query, or None when its span or lengths cannot place it."""
    if span is None or char_length is None or token_length is None or len(span) != 2:
        return None
    start, end = span
    if start is None or end is None or char_length <= 0 or token_length <= 0 or start < 0 or end < start:
        return None
    return length_quartile(int(token_length)), span_third(int(start), int(end), int(char_length))


def _read_qrels(path: Path, layout: PosIRLayout) -> dict[str, dict[str, int]]:
    if path.suffix == ".tsv":
        return read_qrels_tsv(path)
    columns = {"qrels_query": layout.qrels_query, "qrels_doc": layout.qrels_doc, "qrels_score": layout.qrels_score}
    rows = read_columns(path, columns)
    qrels: dict[str, dict[str, int]] = {}
    for qid, doc_id, score in zip(rows["qrels_query"], rows["qrels_doc"], rows["qrels_score"], strict=True):
        qrels.setdefault(str(qid), {})[str(doc_id)] = int(score)
    return qrels


QUERY_INSTRUCTION = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: "
"""What PosIR's evaluation (its eval.py) puts before every query, for every model it evaluates."""


@dataclass(frozen=True)
class PosIRSpan:
    """What PosIR's own analysis reads of one query: its reference span and its relevant document's length in
    characters and in tokens, as the files give them (None where they give nothing)."""

    span: tuple[int, int] | None
    char_length: int | None
    token_length: int | None


@dataclass(frozen=True)
class PosIRFolder:
    """One `<language>/<domain>` folder read whole: its dataset (without position groups: PosIR's analysis places
    the queries itself, `objectives.posir`) and each kept query's span and lengths."""

    dataset: PositionalDataset
    spans: dict[str, PosIRSpan]


def read_posir(
    path: str | Path, *, layout: PosIRLayout | None = None, name: str | None = None, **overrides: Any
) -> PosIRFolder:
    """Read one PosIR dataset folder; `overrides` replace `PosIRLayout` fields (file and column names)."""
    known = {f.name for f in dataclasses.fields(PosIRLayout)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown PosIR option(s) {unknown}; valid: {sorted(known)} plus layout, name")
    layout = dataclasses.replace(layout or PosIRLayout(), **overrides)
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder; give one PosIR <language>/<domain> folder")

    qrels_path = folder / layout.qrels_file
    query_columns: dict[str, str | None] = {
        "query_id": layout.query_id,
        "query_text": layout.query_text,
        "span": layout.span,
        "char_length": layout.char_length,
        "token_length": layout.token_length,
        "relevant_doc": None if qrels_path.is_file() else layout.relevant_doc,
    }
    rows = read_columns(folder / layout.queries_file, query_columns)
    docs = read_columns(folder / layout.corpus_file, {"doc_id": layout.doc_id, "doc_text": layout.doc_text})
    corpus = {str(doc_id): str(text) for doc_id, text in zip(docs["doc_id"], docs["doc_text"], strict=True)}

    qids = [str(qid) for qid in rows["query_id"]]
    if qrels_path.is_file():
        judged = _read_qrels(qrels_path, layout)
    else:
        judged = {qid: {str(doc): 1} for qid, doc in zip(qids, rows["relevant_doc"], strict=True) if doc is not None}
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    spans: dict[str, PosIRSpan] = {}
    dropped = 0
    for index, qid in enumerate(qids):
        relevant = judged.get(qid, {})
        if not any(rel > 0 for rel in relevant.values()):
            dropped += 1
            continue
        queries[qid] = str(rows["query_text"][index])
        qrels[qid] = relevant
        span = rows["span"][index]
        spans[qid] = PosIRSpan(
            span=(span[0], span[1]) if span is not None and len(span) == 2 else None,
            char_length=rows["char_length"][index] if layout.char_length else _relevant_length(relevant, corpus),
            token_length=rows["token_length"][index],
        )
    if dropped:
        warnings.warn(f"PosIR {folder}: dropped {dropped} queries without a relevant document in qrels", stacklevel=2)
    dataset = PositionalDataset(
        name=name or f"posir:{folder.resolve().parent.name}/{folder.resolve().name}",
        corpus=corpus,
        queries=queries,
        qrels=qrels,
    )
    return PosIRFolder(dataset, spans)


def load_posir(
    path: str | Path, *, layout: PosIRLayout | None = None, name: str | None = None, **overrides: Any
) -> PositionalDataset:
    """Load one PosIR dataset folder, its queries in thirds within length quartiles; `overrides` replace
    `PosIRLayout` fields (file and column names)."""
    folder = read_posir(path, layout=layout, name=name, **overrides)
    placed = {
        qid: position
        for qid, query in folder.spans.items()
        if (position := position_group(query.span, query.char_length, query.token_length)) is not None
    }
    groups, strata = comparable_positions(placed, path)
    return dataclasses.replace(
        folder.dataset, groups=groups, group_order=THIRDS if groups else (), strata=strata
    )  # a kept quartile holds all three thirds


def posir_domains(path: str | Path) -> list[Path]:
    """The `<language>/<domain>` folders under `path`: itself when it holds a queries file, else its subfolders
    that do (a `<language>` folder), sorted by name."""
    folder = Path(path)
    if (folder / PosIRLayout.queries_file).is_file():
        return [folder]
    domains = (
        sorted(sub for sub in folder.iterdir() if (sub / PosIRLayout.queries_file).is_file()) if folder.is_dir() else []
    )
    if not domains:
        raise ValueError(
            f"{folder} is neither a PosIR <language>/<domain> folder (with {PosIRLayout.queries_file}) "
            "nor a <language> folder of them"
        )
    return domains


def comparable_positions(
    placed: dict[str, tuple[str, str]], where: Path | str
) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """Groups (thirds) and strata (quartiles) of the placed queries whose quartile covers all three thirds."""
    thirds_of: dict[str, set[str]] = {}
    for quartile, third in placed.values():
        thirds_of.setdefault(quartile, set()).add(third)
    incomplete = {
        q: sorted(set(THIRDS) - found, key=THIRDS.index) for q, found in thirds_of.items() if found != set(THIRDS)
    }
    if incomplete:
        counts = {q: sum(1 for quartile, _ in placed.values() if quartile == q) for q in incomplete}
        detail = "; ".join(
            f"{q}: {counts[q]} queries, none in {'/'.join(missing)}" for q, missing in sorted(incomplete.items())
        )
        left = sorted(set(thirds_of) - set(incomplete))
        warnings.warn(
            f"PosIR {where}: length quartile(s) without a query in every third ({detail}) are left out of HM and PSI; "
            + (
                f"position metrics use {', '.join(left)}"
                if left
                else "no quartile is complete, so HM and PSI are undefined"
            ),
            stacklevel=3,
        )
    kept = {qid: position for qid, position in placed.items() if position[0] not in incomplete}
    return {qid: (third,) for qid, (_, third) in kept.items()}, {qid: quartile for qid, (quartile, _) in kept.items()}


def _relevant_length(relevant: dict[str, int], corpus: dict[str, str]) -> int | None:
    """Character length of the query's first relevant document, when `char_length=None` asks to measure it."""
    for doc_id, rel in relevant.items():
        if rel > 0 and doc_id in corpus:
            return len(corpus[doc_id])
    return None
