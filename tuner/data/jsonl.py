"""Your own benchmark as JSON Lines, plus the strict UTF-8 JSONL/TSV readers the file-based loaders share.

A folder with up to three files (`.gz` versions are read too):

`corpus.jsonl`, one document per line:

    {"id": "d1", "text": "The full passage text ..."}

`queries.jsonl`, one query per line:

    {"id": "q1", "text": "who built the bridge?", "relevant": ["d1"]}
    {"id": "q2", "text": "...", "relevant": {"d1": 2, "d7": 1}, "group": "end"}
    {"id": "q3", "text": "...", "relevant": ["d1"], "span": [1840, 1910]}
    {"id": "q4", "text": "...", "group": ["middle", "end"], "stratum": "long"}

- `relevant` (optional): the relevant doc ids (relevance 1), or doc id -> graded relevance.
- `group` (optional): the position group(s) of the query, a label or a list of labels.
- `span` (optional): [start, end) character span of the answer in its one relevant document. A query with a
  span and no group is put in "begin", "middle" or "end" by the third of the document holding the span's
  midpoint, the rule every loader uses (`tuner.data.dataset.span_third`).
- `stratum` (optional): a stratum label (e.g. a length bucket); PSI is then computed within each stratum.

`qrels.tsv` (optional): `query-id<TAB>doc-id<TAB>relevance` per line, with or without a header line. Its
judgements are added to those given by `relevant` (the TSV wins where both judge the same pair).

Group order: labels that are all among begin/middle/end are ordered begin, middle, end; other labels keep
the order in which they first appear, unless `group_order=` is passed.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tuner.data.dataset import THIRDS, PositionalDataset, span_third

CORPUS_FILE = "corpus.jsonl"
QUERIES_FILE = "queries.jsonl"
QRELS_FILE = "qrels.tsv"


def find_file(folder: Path, name: str) -> Path | None:
    """`folder/name`, or its gzipped twin `folder/name.gz`; None when neither exists."""
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def require_file(folder: Path, name: str, layout: str) -> Path:
    """`find_file`, or a FileNotFoundError naming the missing file and the layout the folder should have."""
    found = find_file(folder, name)
    if found is None:
        raise FileNotFoundError(f"{folder} has no {name} (or {name}.gz); {layout}")
    return found


def read_text(path: Path) -> str:
    """A whole text file as strict UTF-8 (gunzipped if it ends in .gz), with a fix in the error if it is not."""
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not UTF-8 (invalid byte at offset {error.start}); re-save it as UTF-8, "
            f"e.g. `iconv -f latin1 -t utf-8 {path.name} > fixed-{path.name}` if it is Latin-1"
        ) from error


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; a line that is not a JSON object names file and line."""
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            message = f"{path}:{number}: not valid JSON ({error.msg}); write one JSON object per line"
            raise ValueError(message) from error
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        yield number, record


def field(record: dict[str, Any], key: str, path: Path, line: int) -> Any:
    """A required field of a JSONL record; its absence names the field, file and line."""
    if key not in record or record[key] is None:
        raise ValueError(f"{path}:{line}: missing required field {key!r} (fields present: {sorted(record)})")
    return record[key]


def read_qrels_tsv(path: Path) -> dict[str, dict[str, int]]:
    """TREC-style `query-id<TAB>doc-id<TAB>relevance` lines, header optional (BEIR writes one)."""
    qrels: dict[str, dict[str, int]] = {}
    first = True
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        parts = [part.strip() for part in line.split("\t")]
        if len(parts) != 3:
            raise ValueError(
                f"{path}:{number}: expected 3 tab-separated columns query-id, doc-id, relevance; got {len(parts)}"
            )
        qid, doc_id, rel = parts
        try:
            relevance = int(float(rel))
        except ValueError:
            if first:  # a header line such as "query-id<TAB>corpus-id<TAB>score"
                first = False
                continue
            raise ValueError(f"{path}:{number}: relevance {rel!r} is not a number") from None
        first = False
        qrels.setdefault(qid, {})[doc_id] = relevance
    return qrels


def infer_group_order(groups: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """begin/middle/end when the labels are thirds, otherwise labels in order of first appearance."""
    seen = tuple(dict.fromkeys(label for labels in groups.values() for label in labels))
    if set(seen) <= set(THIRDS):
        return THIRDS if seen else ()
    return seen


def _relevance(value: Any, path: Path, line: int) -> dict[str, int]:
    if isinstance(value, dict):
        return {str(doc): int(rel) for doc, rel in value.items()}
    if isinstance(value, list):
        return {str(doc): 1 for doc in value}
    if isinstance(value, (str, int)):
        return {str(value): 1}
    raise ValueError(f"{path}:{line}: 'relevant' must be a list of doc ids or an object doc id -> relevance")


def _labels(value: Any, path: Path, line: int) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(label, str) for label in value):
        return tuple(value)
    raise ValueError(f"{path}:{line}: 'group' must be a label or a list of labels, got {value!r}")


def load_jsonl(
    path: str | Path,
    *,
    corpus_file: str = CORPUS_FILE,
    queries_file: str = QUERIES_FILE,
    qrels_file: str = QRELS_FILE,
    group_order: Sequence[str] | None = None,
    name: str | None = None,
) -> PositionalDataset:
    """Load a benchmark folder in the format of the module docstring."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder; give the folder holding {corpus_file} and {queries_file}")
    layout = "see tuner.data.jsonl for the format"
    corpus_path = require_file(folder, corpus_file, layout)
    queries_path = require_file(folder, queries_file, layout)

    corpus = {
        str(field(r, "id", corpus_path, n)): str(field(r, "text", corpus_path, n)) for n, r in read_jsonl(corpus_path)
    }
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    groups: dict[str, tuple[str, ...]] = {}
    strata: dict[str, str] = {}
    spans: dict[str, tuple[int, int, int]] = {}
    for line, record in read_jsonl(queries_path):
        qid = str(field(record, "id", queries_path, line))
        if qid in queries:
            raise ValueError(f"{queries_path}:{line}: query id {qid!r} appears twice; query ids must be unique")
        queries[qid] = str(field(record, "text", queries_path, line))
        if record.get("relevant") is not None:
            qrels[qid] = _relevance(record["relevant"], queries_path, line)
        if record.get("group") is not None:
            groups[qid] = _labels(record["group"], queries_path, line)
        if record.get("stratum") is not None:
            strata[qid] = str(record["stratum"])
        if record.get("span") is not None:
            span = record["span"]
            if not (isinstance(span, list) and len(span) == 2 and all(isinstance(x, int) for x in span)):
                raise ValueError(f"{queries_path}:{line}: 'span' must be [start, end] character offsets, got {span!r}")
            spans[qid] = (span[0], span[1], line)

    qrels_path = find_file(folder, qrels_file)
    if qrels_path is not None:
        for qid, judged in read_qrels_tsv(qrels_path).items():
            qrels.setdefault(qid, {}).update(judged)

    for qid, (start, end, line) in spans.items():
        if qid in groups:
            continue
        relevant = [doc for doc, rel in qrels.get(qid, {}).items() if rel > 0]
        if len(relevant) != 1:
            raise ValueError(
                f"{queries_path}:{line}: query {qid!r} has a span but {len(relevant)} relevant documents; "
                "a span is placed in its one relevant document, so give the query's 'group' explicitly instead"
            )
        document = corpus.get(relevant[0])
        if document is not None:  # a missing document is reported by the dataset itself
            if not 0 <= start <= end <= len(document):
                raise ValueError(
                    f"{queries_path}:{line}: span [{start}, {end}] of query {qid!r} lies outside its document "
                    f"{relevant[0]!r} of {len(document)} characters; spans are character offsets into that text"
                )
            groups[qid] = (span_third(start, end, len(document)),)

    return PositionalDataset(
        name=name or f"jsonl:{folder.resolve().name}",
        corpus=corpus,
        queries=queries,
        qrels=qrels,
        groups=groups,
        group_order=tuple(group_order) if group_order is not None else infer_group_order(groups),
        strata=strata,
    )
