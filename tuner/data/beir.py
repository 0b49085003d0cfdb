"""BEIR / NanoBEIR folders: general retrieval (short documents, no position groups).

Why: calibration should leave ordinary retrieval intact; the paper checks this on NanoBEIR. Layout, as BEIR
distributes it (`.gz` versions are read too):

    corpus.jsonl      {"_id": "d1", "title": "...", "text": "..."}
    queries.jsonl     {"_id": "q1", "text": "..."}
    qrels/test.tsv    query-id<TAB>corpus-id<TAB>score, with a header line

A document's text is its title and body joined by a space, as BEIR's dense-retrieval evaluation encodes it
(`include_title=False` keeps the body only). Only queries with at least one judgement of score > 0 in the
chosen qrels split are kept: `queries.jsonl` holds the queries of every split.
"""

from __future__ import annotations

from pathlib import Path

from tuner.data.dataset import PositionalDataset
from tuner.data.jsonl import field, read_jsonl, read_qrels_tsv, require_file


def load_beir(path: str | Path, *, split: str = "test", include_title: bool = True, name: str | None = None) -> PositionalDataset:
    """Load a BEIR-format folder as a general-retrieval dataset named `beir:<folder name>`."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder; give the BEIR dataset folder holding corpus.jsonl")
    layout = f"a BEIR folder holds corpus.jsonl, queries.jsonl and qrels/{split}.tsv"
    corpus_path = require_file(folder, "corpus.jsonl", layout)
    queries_path = require_file(folder, "queries.jsonl", layout)
    qrels_path = require_file(folder / "qrels", f"{split}.tsv", layout)

    corpus: dict[str, str] = {}
    for line, record in read_jsonl(corpus_path):
        body = str(field(record, "text", corpus_path, line))
        title = str(record.get("title") or "").strip()
        doc_id = str(field(record, "_id", corpus_path, line))
        if doc_id in corpus:
            raise ValueError(f"{corpus_path}:{line}: document id {doc_id[:80]!r} appears twice; document ids must be unique")
        corpus[doc_id] = f"{title} {body}" if include_title and title else body

    qrels = {qid: judged for qid, judged in read_qrels_tsv(qrels_path).items() if any(r > 0 for r in judged.values())}
    all_queries = {str(field(r, "_id", queries_path, n)): str(field(r, "text", queries_path, n)) for n, r in read_jsonl(queries_path)}
    missing = [qid for qid in qrels if qid not in all_queries]
    if missing:
        raise ValueError(f"{qrels_path} judges queries missing from {queries_path}: {missing[:5]!r}")
    return PositionalDataset(
        name=name or f"beir:{folder.resolve().name}",
        corpus=corpus,
        queries={qid: text for qid, text in all_queries.items() if qid in qrels},
        qrels=qrels,
    )
