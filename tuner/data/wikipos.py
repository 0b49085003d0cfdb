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
import re
from collections.abc import Callable, Iterator
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, TypeVar

from tuner.data.dataset import FIFTHS, SLOT_THIRDS, THIRDS, PositionalDataset, span_midpoint, span_third

SPLITS: tuple[str, ...] = ("dev", "test", "general", "sentences", "mixed", "lengths")
TRANSFER_SPLITS: tuple[str, ...] = ("sentences", "mixed", "lengths")
GROUP_ORDER: dict[str, tuple[str, ...]] = {
    "dev": THIRDS,
    "test": THIRDS,
    "general": (),
    "sentences": FIFTHS,
    "mixed": SLOT_THIRDS,
    "lengths": THIRDS,
}
SEGMENT_SEPARATOR = "\n\n"
"""Between a passage's summaries, as the builder joins them (a crop joins its window the same way)."""
MIN_SENTENCE_WORDS = 6
# A period after one of these (or after a single letter, an initial) does not end a sentence.
ABBREVIATIONS = frozenset(
    "c ca cf st mt dr mr mrs ms jr sr vs no nos gen col lt ft fr rev prof approx est fl b d u.s e.g i.e etc".split()
)
OPENINGS_CHARACTERS = 1800
"""A re-packed passage of opening sentences holds at most this many characters (~450 MiniLM tokens)."""
OPENINGS_MIN_SEGMENTS = 6
PACKED_CHARACTERS = (450, 2200)
"""A re-packed passage of whole summaries is filled up to a length drawn from this range of characters: on dev,
94-506 MiniLM tokens (quartiles 234 / 292 / 358), none past the window; the `lengths` transfer set's range is
96-510 tokens."""
Item = TypeVar("Item")
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
    name: str, records: Iterator[dict[str, Any]], group_order: tuple[str, ...] = THIRDS, *, titles: bool = False
) -> PositionalDataset:
    """Assemble a dataset from WikiPos records: each query is relevant to the document holding its segment.

    With `titles` (passages grouped by thirds), every segment's article title is a query too, id
    `<passage>/t<slot>`: a second human-written handle on the same summary, so more position-labelled queries
    over the same passages (queries are encoded once per study, passages once per trial)."""
    if titles and group_order != THIRDS:
        raise ValueError(f"{name}: title queries are grouped by thirds, but this set is grouped by {group_order}")
    corpus: dict[str, str] = {}
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    groups: dict[str, tuple[str, ...]] = {}
    positions: dict[str, float] = {}
    for record in records:
        corpus[record["id"]] = record["text"]
        for slot, segment in enumerate(record["segments"]):
            if titles and segment.get("title"):
                start, end = segment["span"]
                qid = f"{record['id']}/t{slot}"
                queries[qid], qrels[qid] = segment["title"], {record["id"]: 1}
                groups[qid] = (span_third(start, end, len(record["text"])),)
                positions[qid] = span_midpoint(start, end, len(record["text"]))
            query = segment.get("query")
            if query is None:
                continue
            queries[query["id"]] = query["text"]
            qrels[query["id"]] = {record["id"]: 1}
            if "group" in query:
                groups[query["id"]] = (query["group"],)
                start, end = segment["span"]
                positions[query["id"]] = span_midpoint(start, end, len(record["text"]))
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
        window = segments[start : start + size]
        texts = [record["text"][a:b] for a, b in (segment["span"] for segment in window)]
        text = SEGMENT_SEPARATOR.join(texts)
        cropped, offset = [], 0
        for segment, piece in zip(window, texts):
            span = [offset, offset + len(piece)]
            query = segment.get("query")
            if query is not None and "group" in query:
                query = {**query, "id": f"{query['id']}-crop", "group": span_third(span[0], span[1], len(text))}
            cropped.append({**segment, "span": span, "query": query})
            offset += len(piece) + len(SEGMENT_SEPARATOR)
        if any(segment["query"] for segment in cropped):
            yield {**record, "id": f"{record['id']}-crop", "text": text, "segments": cropped}


def opening_sentence(text: str) -> str:
    """The first sentence of a summary (at least MIN_SENTENCE_WORDS words), without a sentence-splitting model.

    A sentence ends at '.', '!' or '?' followed by a space and a capital or digit, unless the word before the
    period is an initial or a listed abbreviation ("c. 1500", "J. R. R. Tolkien", "St. Louis").
    """
    for match in re.finditer(r"[.!?](?=\s+[A-Z0-9\"'(])", text):
        head = text[: match.end()]
        word = head[:-1].rsplit(" ", 1)[-1].strip("(\"'").lower()
        if len(word) <= 1 or word in ABBREVIATIONS or len(head.split()) < MIN_SENTENCE_WORDS:
            continue
        return head
    return text


def openings_records(records: Iterator[dict[str, Any]], seed: int = 0) -> Iterator[dict[str, Any]]:
    """The split's summaries cut to their opening sentence and re-packed: more and shorter segments per passage.

    Why: a calibration tuned on passages of 3-5 whole summaries can over-correct on passages built of many
    short segments (the bias then reverses). The openings keep the split's own articles and queries (each
    query asks for its article's opening sentence), so they are tuning data, passage-disjoint from every
    held-out set like the split itself. Per topic, in a seeded order, as many openings as fit
    `OPENINGS_CHARACTERS` form a passage (at least `OPENINGS_MIN_SEGMENTS`, else the rest is dropped), in a
    seeded slot order; a query's group is the third of the new passage holding its sentence's midpoint.
    """
    rng = random.Random(seed)
    by_topic = segments_by_topic(records, opening_sentence)
    number = 0
    for topic in sorted(by_topic):
        pool = by_topic[topic]
        rng.shuffle(pool)
        while pool:
            members: list[dict[str, Any]] = []
            used = 0
            while pool and used + len(pool[0]["text"]) + len(SEGMENT_SEPARATOR) * bool(members) <= OPENINGS_CHARACTERS:
                used += len(pool[0]["text"]) + len(SEGMENT_SEPARATOR) * bool(members)
                members.append(pool.pop(0))
            if not members:  # one opening longer than the budget: it stands alone, and is too few to keep
                pool.pop(0)
                continue
            if len(members) < OPENINGS_MIN_SEGMENTS or not any(m.get("query") for m in members):
                continue
            rng.shuffle(members)
            yield packed_record(f"{members[0]['source']}-open{number}", topic, members, "-open")
            number += 1


def pack_to_length(
    items: list[Item],
    rng: random.Random,
    minimum: int,
    *,
    size: Callable[[Item], int],
    asked: Callable[[Item], bool],
    lengths: tuple[int, int],
    limit: int,
) -> list[list[Item]]:
    """Passages of whole items (summaries) in a seeded order, each filled up to a length drawn per passage from
    `lengths`; a passage gets `minimum` items even if that overshoots the drawn length (never `limit`), and one
    with no asked item is dropped. The builder's `lengths` split counts tokens, the packed structure characters."""
    pool = list(items)
    rng.shuffle(pool)
    passages: list[list[Item]] = []
    while len(pool) >= minimum:
        target = rng.randint(*lengths)
        members = [pool.pop(0)]
        used = size(members[0])
        for candidate in list(pool):
            room = (target if len(members) >= minimum else limit) - used
            if size(candidate) <= room:
                members.append(candidate)
                pool.remove(candidate)
                used += size(candidate)
            if len(members) >= minimum and used >= target:
                break
        if len(members) >= minimum and any(asked(m) for m in members):
            rng.shuffle(members)
            passages.append(members)
    return passages


def packed_records(records: Iterator[dict[str, Any]], seed: int = 0) -> Iterator[dict[str, Any]]:
    """The split's whole summaries re-packed per topic into passages of 2 or more, each filled up to a length drawn
    from `PACKED_CHARACTERS` (`pack_to_length`): passages of every length up to the model's window.

    Why: a calibration tuned on dev's full 512-token passages can lose retrieval on passages of other lengths, where
    the last basket is filled to a different degree, in a way dev's crops (windows of those passages) do not show
    beyond noise. The summaries and queries are the split's own, so this is tuning data, passage-disjoint
    from every held-out set; a query's group is the third of the new passage holding its summary's midpoint.
    """
    rng = random.Random(seed)
    by_topic = segments_by_topic(records, lambda summary: summary)
    number = 0
    for topic in sorted(by_topic):
        passages = pack_to_length(
            by_topic[topic],
            rng,
            2,
            size=lambda m: len(m["text"]) + len(SEGMENT_SEPARATOR),
            asked=lambda m: bool(m.get("query")),
            lengths=PACKED_CHARACTERS,
            limit=PACKED_CHARACTERS[1],
        )
        for members in passages:
            yield packed_record(f"{members[0]['source']}-packed{number}", topic, members, "-packed")
            number += 1


def segments_by_topic(records: Iterator[dict[str, Any]], cut: Callable[[str], str]) -> dict[str, list[dict[str, Any]]]:
    """Every segment of the records, its text `cut` from its summary and its record's id as `source`, by topic
    in record order: what the re-packed structures (openings, packed) draw their passages from."""
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        for segment in record["segments"]:
            a, b = segment["span"]
            by_topic.setdefault(record.get("topic", ""), []).append(
                {**segment, "text": cut(record["text"][a:b]), "source": record["id"]}
            )
    return by_topic


def packed_record(record_id: str, topic: str, members: list[dict[str, Any]], suffix: str) -> dict[str, Any]:
    """One passage of re-packed segments, in the given order: spans in the new text, each query's id marked
    with `suffix` and its group the third of the new passage holding the segment's midpoint."""
    text = SEGMENT_SEPARATOR.join(m["text"] for m in members)
    segments, offset = [], 0
    for member in members:
        span = [offset, offset + len(member["text"])]
        query = member.get("query")
        if query is not None and "group" in query:
            query = {**query, "id": f"{query['id']}{suffix}", "group": span_third(span[0], span[1], len(text))}
        segments.append({"title": member["title"], "span": span, "query": query})
        offset = span[1] + len(SEGMENT_SEPARATOR)
    return {"id": record_id, "topic": topic, "text": text, "segments": segments}


STRUCTURE_RECORDS: dict[str, Callable[[Iterator[dict[str, Any]], int], Iterator[dict[str, Any]]]] = {
    "crops": crop_records,
    "openings": openings_records,
    "packed": packed_records,
}
"""The other structures a split's own passages are re-built in (`load_wikipos_structure`), by name."""


def load_wikipos_structure(split: str, kind: str, seed: int = 0, *, titles: bool = False) -> PositionalDataset:
    """A WikiPos split re-built as the structure `kind` (`STRUCTURE_RECORDS`: crops, openings, packed), as
    `wikipos-{split}-{kind}` (with `titles`, the article titles as queries too: `dataset_from_records`)."""
    if GROUP_ORDER.get(split) != THIRDS:
        raise ValueError(
            f"the {kind} structure is defined for the splits grouped by thirds (dev, test, lengths), not {split!r}"
        )
    records = STRUCTURE_RECORDS[kind](_split_records(split), seed)
    return dataset_from_records(f"{wikipos_name(split, titles)}-{kind}", records, THIRDS, titles=titles)


def wikipos_folder() -> Traversable:
    """The folder of the embedded WikiPos files, inside the installed package."""
    return resources.files(DATA_PACKAGE).joinpath(DATA_FOLDER)


def _split_records(split: str) -> Iterator[dict[str, Any]]:
    if split not in SPLITS:
        raise ValueError(f"unknown WikiPos split {split!r}; valid splits: {', '.join(SPLITS)}")
    resource = wikipos_folder().joinpath(split_filename(split))
    if not resource.is_file():
        raise FileNotFoundError(
            f"WikiPos file {split_filename(split)} is missing from {DATA_PACKAGE}/{DATA_FOLDER}; "
            "rebuild it with `python -m tuner.data.build_wikipos` or reinstall posfair"
        )
    return read_records(resource.read_bytes())


def load_wikipos(split: str, *, titles: bool = False) -> PositionalDataset:
    """Load a packaged WikiPos split ("dev", "test" or "general") as `wikipos-{split}` (with `titles`, the
    article titles as queries too: `dataset_from_records`)."""
    return dataset_from_records(wikipos_name(split, titles), _split_records(split), GROUP_ORDER[split], titles=titles)


TITLES_SUFFIX = "+titles"


def wikipos_name(split: str, titles: bool = False) -> str:
    """A split's name: `wikipos-dev`, or `wikipos-dev+titles` with the article titles as queries too."""
    return f"wikipos-{split}{TITLES_SUFFIX if titles else ''}"
