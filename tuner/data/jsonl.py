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
judgements are added to those given by `relevant`; a pair judged in both places must have one relevance in
both (a contradiction is refused, naming the query, the document and both lines).

Every file is strict UTF-8; a byte order mark at its start (as Windows editors save) is skipped.

Group order: labels that are all among begin/middle/end are ordered begin, middle, end; other labels keep
the order in which they first appear, unless `group_order=` is passed.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.common.messages import shown
from tuner.data.dataset import FIFTHS, SLOT_THIRDS, THIRDS, PositionalDataset, span_midpoint, third_of

KNOWN_GROUPS: tuple[tuple[str, ...], ...] = (THIRDS, FIFTHS, SLOT_THIRDS)
"""The position vocabularies posfair's loaders use: a file's labels come from one of them or none."""

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


BYTE_ORDER_MARK = "\ufeff"


def read_text(path: Path) -> str:
    """A whole text file as strict UTF-8 (gunzipped if it ends in .gz), with a fix in the error if it is not. A
    leading byte order mark is no text: kept, it would be part of the first id or text."""
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as error:
            raise ValueError(f"{path} is not a readable gzip file ({error}); compress it again with `gzip`") from None
    try:
        return raw.decode("utf-8").removeprefix(BYTE_ORDER_MARK)
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not UTF-8 (invalid byte at offset {error.start}); re-save it as UTF-8, "
            f"e.g. `iconv -f latin1 -t utf-8 {path.name} > fixed-{path.name}` if it is Latin-1"
        ) from error


def lines_of(text: str) -> list[str]:
    """A file's lines, split on "\n" only (a final newline ends the last line): `str.splitlines` would also
    split on form feed, U+0085 and U+2028, which JSON allows raw inside strings and plain text keeps in a line.
    A Windows line end's "\r" is dropped."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


class _NotJsonNumber(ValueError):
    """NaN, Infinity or -Infinity: Python's json reads and writes them, JSON has no such numbers."""


def _refuse_constant(name: str) -> object:
    raise _NotJsonNumber(name)


def parse_json_line(line: str, path: Path, number: int) -> Any:
    """One line of JSON, strictly: NaN and Infinity are refused, and so is a string holding a lone surrogate
    (a `\\ud800` escape, valid JSON but no text a tokenizer can read); errors name file, line and id."""
    try:
        record = json.loads(line, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{number}: not valid JSON ({error.msg}); write one JSON object per line") from error
    except _NotJsonNumber as error:
        raise ValueError(
            f"{path}:{number}: {error} is not a JSON number (Python's json writes it for nan or inf); write a number"
        ) from None
    if "\\ud" in line.lower():  # only an escape can make a lone surrogate: UTF-8 cannot hold one
        _no_lone_surrogates(record, path, number)
    return record


def _no_lone_surrogates(record: Any, path: Path, number: int) -> None:
    identity = record.get("id", record.get("_id")) if isinstance(record, dict) else None
    owner = f"id {shown(str(identity))}: " if isinstance(identity, (str, int)) else ""
    pending: list[tuple[str, Any]] = [("", record)]
    while pending:
        key, value = pending.pop()
        if isinstance(value, dict):
            pending.extend((str(k), v) for k, v in value.items())
        elif isinstance(value, list):
            pending.extend((key, v) for v in value)
        elif isinstance(value, str) and (found := next((c for c in value if "\ud800" <= c <= "\udfff"), None)):
            where = f"'{key}' holds" if key else "a string holds"
            raise ValueError(
                f"{path}:{number}: {owner}{where} a lone surrogate (U+{ord(found):04X}, from a \\u escape "
                "without its pair), which is not text; fix the escape or remove it"
            )


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; a line that is not a JSON object names file and line."""
    for number, line in enumerate(lines_of(read_text(path)), start=1):
        if not line.strip():
            continue
        record = parse_json_line(line, path, number)
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        yield number, record


def field(record: dict[str, Any], key: str, path: Path, line: int) -> Any:
    """A required field of a JSONL record; its absence names the field, file and line."""
    if key not in record or record[key] is None:
        raise ValueError(f"{path}:{line}: missing required field {key!r} (fields present: {sorted(record)})")
    return record[key]


def identifier(record: dict[str, Any], path: Path, line: int, key: str = "id") -> str:
    """A record's id (`key`: BEIR's is `_id`) as text: a string or an integer (1 and "1" are then one id, which
    `unique` reports)."""
    value = field(record, key, path, line)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{path}:{line}: {key!r} must be a string or an integer, got {shown(value)}")
    return str(value)


def text_field(record: dict[str, Any], path: Path, line: int, key: str = "text", *, required: bool = True) -> str:
    """A record's text (`key`) as it is: anything but a string is refused, since its repr would be encoded. An
    optional field (`required=False`) that is absent or null is ""."""
    value = field(record, key, path, line) if required else record.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{path}:{line}: {key!r} must be a string, got {type(value).__name__} {shown(value)}")
    return value


def unique(kind: str, key: str, lines: dict[str, int], path: Path, line: int) -> None:
    """A second record with an id already seen (as text: 1 and "1" are one id) names both lines."""
    if key in lines:
        raise ValueError(
            f'{path}:{line}: {kind} id {shown(key)} appears twice (first on line {lines[key]}; 1 and "1" '
            f"count as one id); {kind} ids must be unique"
        )


def grade(value: Any, where: str) -> int:
    """A relevance grade: a whole number (1.0 is 1); a fraction, a word or a boolean is refused."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value != int(value)
    ):
        raise ValueError(
            f"{where}: relevance {shown(value)} is not a whole number; "
            "grades are integers (0 = not relevant, 1, 2, ...)"
        )
    return int(value)


@dataclass(frozen=True)
class Judgement:
    """One line of a qrels file: a query, a document, and the document's relevance to it."""

    line: int
    query: str
    document: str
    relevance: int


def read_qrels_tsv(path: Path) -> dict[str, dict[str, int]]:
    """TREC-style `query-id<TAB>doc-id<TAB>relevance` lines, header optional (BEIR writes one); a pair judged
    twice must be judged alike."""
    qrels: dict[str, dict[str, int]] = {}
    lines: dict[tuple[str, str], int] = {}
    for judged in read_judgements(path):
        known = qrels.setdefault(judged.query, {}).get(judged.document)
        if known is not None and known != judged.relevance:
            raise ValueError(
                f"{path}:{judged.line}: query {shown(judged.query)}, document {shown(judged.document)}: "
                f"relevance {judged.relevance} here, but {known} on line {lines[judged.query, judged.document]}; "
                "judge each pair once"
            )
        qrels[judged.query][judged.document], lines[judged.query, judged.document] = judged.relevance, judged.line
    return qrels


def read_judgements(path: Path) -> Iterator[Judgement]:
    """The judgements of a TREC-style qrels file in order (`read_qrels_tsv`), each with its line."""
    first = True
    for number, line in enumerate(lines_of(read_text(path)), start=1):
        if not line.strip():
            continue
        parts = [part.strip() for part in line.split("\t")]
        if len(parts) != 3:
            raise ValueError(
                f"{path}:{number}: expected 3 tab-separated columns query-id, doc-id, relevance; got {len(parts)}"
            )
        qid, doc_id, rel = parts
        try:
            number_read = float(rel)
        except ValueError:
            if first:  # a header line such as "query-id<TAB>corpus-id<TAB>score"
                first = False
                continue
            raise ValueError(f"{path}:{number}: relevance {shown(rel)} is not a number") from None
        first = False
        yield Judgement(number, qid, doc_id, grade(number_read, f"{path}:{number}"))


def infer_group_order(groups: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """begin/middle/end when the labels are thirds, otherwise labels in order of first appearance."""
    seen = tuple(dict.fromkeys(label for labels in groups.values() for label in labels))
    if set(seen) <= set(THIRDS):
        return THIRDS if seen else ()
    return seen


def check_labels(groups: dict[str, tuple[str, ...]], lines: dict[str, int], path: Path) -> None:
    """Labels that use a known vocabulary (begin/middle/end, fifth-1..5, early/central/late) use only it, and no
    two labels differ only in case or spaces: a typo such as "Begin" would otherwise be a group of its own."""
    seen = dict.fromkeys(label for labels in groups.values() for label in labels)
    where = {label: lines[qid] for qid, labels in reversed(list(groups.items())) for label in labels}
    for vocabulary in KNOWN_GROUPS:
        if set(seen) & set(vocabulary):
            stray = [label for label in seen if label not in vocabulary]
            if stray:
                raise ValueError(
                    f"{path}:{where[stray[0]]}: group {shown(stray[0])} is not one of {', '.join(vocabulary)}, "
                    "the labels the other queries use; fix the label (or, with labels of your own, use none of "
                    "these names)"
                )
            return
    folded: dict[str, str] = {}
    for label in seen:
        key = " ".join(label.split()).casefold()
        if key in folded:
            raise ValueError(
                f"{path}:{where[label]}: group {shown(label)} differs from {shown(folded[key])} only in case "
                "or spaces; write one label the same way everywhere"
            )
        folded[key] = label


def _relevance(value: Any, path: Path, line: int) -> dict[str, int]:
    if isinstance(value, dict):
        return {str(doc): grade(rel, f"{path}:{line}: document {shown(doc)}") for doc, rel in value.items()}
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
    raise ValueError(f"{path}:{line}: 'group' must be a label or a list of labels, got {shown(value)}")


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

    corpus: dict[str, str] = {}
    corpus_lines: dict[str, int] = {}
    for n, record in read_jsonl(corpus_path):
        doc_id = identifier(record, corpus_path, n)
        unique("document", doc_id, corpus_lines, corpus_path, n)
        corpus[doc_id], corpus_lines[doc_id] = text_field(record, corpus_path, n), n
    query_lines: dict[str, int] = {}
    positions: dict[str, float] = {}
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    groups: dict[str, tuple[str, ...]] = {}
    strata: dict[str, str] = {}
    spans: dict[str, tuple[int, int, int]] = {}
    for line, record in read_jsonl(queries_path):
        qid = identifier(record, queries_path, line)
        unique("query", qid, query_lines, queries_path, line)
        queries[qid], query_lines[qid] = text_field(record, queries_path, line), line
        if record.get("relevant") is not None:
            qrels[qid] = _relevance(record["relevant"], queries_path, line)
        if record.get("group") is not None:
            groups[qid] = _labels(record["group"], queries_path, line)
        if record.get("stratum") is not None:
            strata[qid] = str(record["stratum"])
        if record.get("span") is not None:
            span = record["span"]
            if not (isinstance(span, list) and len(span) == 2 and all(isinstance(x, int) for x in span)):
                raise ValueError(
                    f"{queries_path}:{line}: 'span' must be [start, end] character offsets, got {shown(span)}"
                )
            if span[1] < span[0]:
                raise ValueError(
                    f"{queries_path}:{line}: span {span} ends before it starts; "
                    "write it as [start, end] with start <= end"
                )
            spans[qid] = (span[0], span[1], line)

    qrels_path = find_file(folder, qrels_file)
    if qrels_path is not None:
        for qid, judged in read_qrels_tsv(qrels_path).items():
            for doc, relevance in judged.items():  # `qrels` holds the `relevant` fields' judgements so far
                inline = qrels.get(qid, {}).get(doc)
                if inline is not None and inline != relevance:
                    line = next(j.line for j in read_judgements(qrels_path) if (j.query, j.document) == (qid, doc))
                    raise ValueError(
                        f"{qrels_path}:{line}: query {shown(qid)}, document {shown(doc)}: relevance {relevance} "
                        f"here, but {inline} in {queries_path}:{query_lines[qid]} ('relevant'); "
                        "make the two agree, or judge the pair in one place only"
                    )
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
        if document == "":
            raise ValueError(
                f"{queries_path}:{line}: query {qid!r} has a span in document {relevant[0]!r}, which is empty; "
                "give the document its text, or the query a 'group' instead of a span"
            )
        if document is not None:  # a missing document is reported by the dataset itself
            if not 0 <= start <= end <= len(document):
                raise ValueError(
                    f"{queries_path}:{line}: span [{start}, {end}] of query {qid!r} lies outside its document "
                    f"{relevant[0]!r} of {len(document)} characters; spans are character offsets into that text"
                )
            positions[qid] = span_midpoint(start, end, len(document))
            groups[qid] = (third_of(positions[qid]),)

    check_labels(groups, query_lines, queries_path)

    return PositionalDataset(
        name=name or f"jsonl:{folder.resolve().name}",
        corpus=corpus,
        queries=queries,
        qrels=qrels,
        groups=groups,
        group_order=tuple(group_order) if group_order is not None else infer_group_order(groups),
        strata=strata,
        positions=positions,
    )
