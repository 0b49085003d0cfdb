"""BEIR / NanoBEIR folders: general retrieval (short documents, no position groups).

Why: calibration should leave ordinary retrieval intact; the paper checks this on NanoBEIR. Layout, as BEIR
distributes it (`.gz` versions are read too):

    corpus.jsonl      {"_id": "d1", "title": "...", "text": "..."}
    queries.jsonl     {"_id": "q1", "text": "..."}
    qrels/test.tsv    query-id<TAB>corpus-id<TAB>score, with a header line

A document's text is its title and body joined by a space, as BEIR's dense-retrieval evaluation encodes it
(`include_title=False` keeps the body only). Only queries with at least one judgement of score > 0 in the
chosen qrels split are kept: `queries.jsonl` holds the queries of every split. The files are read as strictly
as `tuner.data.jsonl` reads its own: an id given twice, or a text or title that is not a string, is refused.
"""

from __future__ import annotations

from pathlib import Path

from tuner.data.dataset import PositionalDataset
from tuner.data.jsonl import identifier, read_jsonl, read_qrels_tsv, require_file, text_field, unique


def load_beir(
    path: str | Path, *, split: str = "test", include_title: bool = True, name: str | None = None
) -> PositionalDataset:
    """Load a BEIR-format folder as a general-retrieval dataset named `beir:<folder name>`."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder; give the BEIR dataset folder holding corpus.jsonl")
    layout = f"a BEIR folder holds corpus.jsonl, queries.jsonl and qrels/{split}.tsv"
    corpus_path = require_file(folder, "corpus.jsonl", layout)
    queries_path = require_file(folder, "queries.jsonl", layout)
    qrels_path = require_file(folder / "qrels", f"{split}.tsv", layout)

    corpus: dict[str, str] = {}
    corpus_lines: dict[str, int] = {}
    for line, record in read_jsonl(corpus_path):
        doc_id = identifier(record, corpus_path, line, "_id")
        unique("document", doc_id, corpus_lines, corpus_path, line)
        body = text_field(record, corpus_path, line)
        title = text_field(record, corpus_path, line, "title", required=False).strip()
        corpus[doc_id], corpus_lines[doc_id] = f"{title} {body}" if include_title and title else body, line

    qrels = {qid: judged for qid, judged in read_qrels_tsv(qrels_path).items() if any(r > 0 for r in judged.values())}
    all_queries: dict[str, str] = {}
    query_lines: dict[str, int] = {}
    for line, record in read_jsonl(queries_path):
        qid = identifier(record, queries_path, line, "_id")
        unique("query", qid, query_lines, queries_path, line)
        all_queries[qid], query_lines[qid] = text_field(record, queries_path, line), line
    missing = [qid for qid in qrels if qid not in all_queries]
    if missing:
        raise ValueError(f"{qrels_path} judges queries missing from {queries_path}: {missing[:5]!r}")
    return PositionalDataset(
        name=name or f"beir:{folder.resolve().name}",
        corpus=corpus,
        queries={qid: text for qid, text in all_queries.items() if qid in qrels},
        qrels=qrels,
    )
