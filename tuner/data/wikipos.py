"""WikiPos, the benchmark that ships inside posfair: position-labelled retrieval over Wikipedia summaries.

Why it exists: FineWeb-PosQ and PosIR must be downloaded, while a tuner should be tryable offline on a laptop.
WikiPos concatenates 3-5 Wikipedia lead summaries of one topic into a passage of at most 512 all-MiniLM-L6-v2
tokens and asks for one summary by its human-written short description. Which slot a summary lands in is
random, so every position holds the same kind of content and a drop from first to last slot is position bias.
`tuner/data/build_wikipos.py` builds the files; this module only reads them.

Splits: `dev` (tune on it), `test` (report on it; passage-disjoint from dev), `general` (one summary per
document, the NanoBEIR role: short documents, no position groups), and two transfer sets built from
summaries in no other split, each with a structure and a group definition of its own, to check that a
calibration chosen on dev holds up on passages built differently: `sentences` (as many opening sentences as
fit 512 tokens, grouped by fifths), `mixed` (as many segments as fit, each a whole summary or its opening
sentence, grouped by thirds of the slot order: early / central / late) and `lengths` (whole summaries in
passages of 96-510 tokens, so baskets are often partly filled; dev's thirds).

File layout (`tuner/data/wikipos/{split}.jsonl.gz`, UTF-8 JSON Lines, one document per line):

    {"id": "dev-p000", "topic": "Arts", "text": "<summary>\\n\\n<summary>...",
     "segments": [{"title": "Protostar", "span": [0, 412],
                   "query": {"id": "dev-q0000", "text": "Early stage in ...", "group": "begin"}},
                  {"title": "...", "span": [414, 871], "query": null}, ...]}

`segments` lists the summaries in passage order; `span` is the summary's [start, end) character span in
`text`; `query` is null for a distractor summary (its description is not a usable query); `group` is absent
in the general split. Every query's relative position is its span's character midpoint over the text length
(`PositionalDataset.positions`). Text is Wikipedia's (CC BY-SA 4.0), see `wikipos/ATTRIBUTION.md`.
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Iterator
from importlib import resources
from typing import Any

from tuner.data.dataset import FIFTHS, SLOT_THIRDS, THIRDS, PositionalDataset, span_midpoint, span_third

SPLITS: tuple[str, ...] = ("dev", "test", "general", "sentences", "mixed", "lengths")
TRANSFER_SPLITS: tuple[str, ...] = ("sentences", "mixed", "lengths")
GROUP_ORDER: dict[str, tuple[str, ...]] = {
    "dev": THIRDS, "test": THIRDS, "general": (), "sentences": FIFTHS, "mixed": SLOT_THIRDS, "lengths": THIRDS,
}
SEGMENT_SEPARATOR = "\n\n"
"""Between a passage's summaries, as the builder joins them (a crop joins its window the same way)."""
DATA_PACKAGE = "tuner.data"
DATA_FOLDER = "wikipos"
"""The split files live in tuner/data/wikipos/ beside this module (a data folder, not a package)."""


def split_filename(split: str) -> str:
    """The packaged file name of a split; the builder writes the same names."""
    return f"{split}.jsonl.gz"


def read_records(data: bytes) -> Iterator[dict[str, Any]]:
    """The document records of one gzipped split file."""
    for line in gzip.decompress(data).decode("utf-8").splitlines():
        if line.strip():
            yield json.loads(line)


def dataset_from_records(
    name: str, records: Iterator[dict[str, Any]], group_order: tuple[str, ...] = THIRDS
) -> PositionalDataset:
    """Assemble a dataset from WikiPos records: each query is relevant to the document holding its segment."""
    corpus: dict[str, str] = {}
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    groups: dict[str, tuple[str, ...]] = {}
    positions: dict[str, float] = {}
    for record in records:
        corpus[record["id"]] = record["text"]
        for segment in record["segments"]:
            query = segment.get("query")
            if query is None:
                continue
            queries[query["id"]] = query["text"]
            qrels[query["id"]] = {record["id"]: 1}
            if "group" in query:
                groups[query["id"]] = (query["group"],)
                positions[query["id"]] = span_midpoint(*segment["span"], len(record["text"]))
    return PositionalDataset(
        name=name,
        corpus=corpus,
        queries=queries,
        qrels=qrels,
        groups=groups,
        group_order=group_order if groups else (),
        positions=positions,
    )


def crop_records(records: Iterator[dict[str, Any]], seed: int = 0) -> Iterator[dict[str, Any]]:
    """Each passage of three or more segments cut to a random window of 2..n-1 consecutive segments.

    Why: a calibration tuned on full 512-token passages can over-correct on shorter ones (the last basket
    is then partly filled, so each remaining token gets a larger share), which is how a dev winner reverses
    the bias on passages built differently. The crops hold the same summaries and queries as the passages
    they come from, so they are tuning data, never held-out data; each query's group is re-labelled by the
    thirds of its new position. Deterministic for a given `seed`.
    """
    rng = random.Random(seed)
    for record in records:
        segments = record["segments"]
        if len(segments) < 3:
            continue
        size = rng.randint(2, len(segments) - 1)
        start = rng.randint(0, len(segments) - size)
        window = segments[start:start + size]
        texts = [record["text"][a:b] for a, b in (segment["span"] for segment in window)]
        text = SEGMENT_SEPARATOR.join(texts)
        cropped, offset = [], 0
        for segment, piece in zip(window, texts):
            span = [offset, offset + len(piece)]
            query = segment.get("query")
            if query is not None and "group" in query:
                query = {**query, "id": f"{query['id']}-crop", "group": span_third(*span, len(text))}
            cropped.append({**segment, "span": span, "query": query})
            offset += len(piece) + len(SEGMENT_SEPARATOR)
        if any(segment["query"] for segment in cropped):
            yield {**record, "id": f"{record['id']}-crop", "text": text, "segments": cropped}


def load_wikipos_crops(split: str, seed: int = 0) -> PositionalDataset:
    """A WikiPos split with every passage cut short (`crop_records`), as `wikipos-{split}-crops`."""
    if GROUP_ORDER.get(split) != THIRDS:
        raise ValueError(f"crops are defined for the splits grouped by thirds (dev, test, lengths), not {split!r}")
    return dataset_from_records(f"wikipos-{split}-crops", crop_records(_split_records(split), seed), THIRDS)


def _split_records(split: str) -> Iterator[dict[str, Any]]:
    if split not in SPLITS:
        raise ValueError(f"unknown WikiPos split {split!r}; valid splits: {', '.join(SPLITS)}")
    resource = resources.files(DATA_PACKAGE).joinpath(DATA_FOLDER).joinpath(split_filename(split))
    if not resource.is_file():
        raise FileNotFoundError(
            f"WikiPos file {split_filename(split)} is missing from {DATA_PACKAGE}/{DATA_FOLDER}; "
            "rebuild it with `python -m tuner.data.build_wikipos` or reinstall posfair"
        )
    return read_records(resource.read_bytes())


def load_wikipos(split: str) -> PositionalDataset:
    """Load a packaged WikiPos split ("dev", "test" or "general") as `wikipos-{split}`."""
    return dataset_from_records(f"wikipos-{split}", _split_records(split), GROUP_ORDER[split])
