"""`tune diagnose`: the verdict follows the end − begin interval it prints, on constructed scores and end to end.

The intervals are recomputed here from the per-query scores with numpy (the same multinomial query resamples,
group means, percentiles), not through posfair's aggregation; the end-to-end runs use a tiny model on sets built
so that the answer is known: one whose first words are the whole of what the model reads (the beginning is found
exactly, the rest never), and one whose every group asks the same question of each passage (level by construction).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest

from objectives import PerQuery, position_profile
from objectives.bootstrap import Interval
from tests.hub import tune_here
from tests.tiny import WORDS, save_tiny
from tuner.report.diagnose import verdict

pytestmark = pytest.mark.usefixtures("one_thread")

THIRDS = ("begin", "middle", "end")
RESAMPLES = 400


def per_query(scores: dict[str, list[float]]) -> PerQuery:
    """Queries in groups begin, middle, end with the nDCG@10 given, unstratified, placed at their third's centre."""
    labels = [group for group in THIRDS for _ in scores[group]]
    values = np.array([value for group in THIRDS for value in scores[group]])
    membership = np.array([[float(label == group) for group in THIRDS] for label in labels])
    centres = np.array([{"begin": 1 / 6, "middle": 1 / 2, "end": 5 / 6}[label] for label in labels])
    return PerQuery(
        query_ids=tuple(f"q{i}" for i in range(len(labels))),
        ndcg10=values,
        recall10=values,
        group_order=THIRDS,
        membership=membership,
        strata_order=(),
        stratum_membership=np.ones((len(labels), 1)),
        positions=centres,
        placed=np.zeros(len(labels), dtype=bool),
    )


def gap_by_hand(scores: dict[str, list[float]], n_resamples: int, seed: int) -> Interval:
    """End − begin: the point estimate and the 2.5th and 97.5th percentiles over query resamples (with replacement,
    every query equally likely, as `numpy.random.Generator.multinomial` draws the counts)."""
    values = np.array([value for group in THIRDS for value in scores[group]])
    begin = np.array([g == "begin" for g in THIRDS for _ in scores[g]])
    end = np.array([g == "end" for g in THIRDS for _ in scores[g]])
    n = len(values)
    counts = np.random.default_rng(seed).multinomial(n, np.full(n, 1 / n), size=n_resamples)
    resampled = (counts * end) @ values / (counts @ end) - (counts * begin) @ values / (counts @ begin)
    low, high = np.percentile(resampled, [2.5, 97.5])
    return Interval(float(values[end].mean() - values[begin].mean()), float(low), float(high))


def ranks(rng: random.Random, count: int, best: int, worst: int) -> list[float]:
    """nDCG@10 of `count` queries whose one relevant passage is found at a rank from `best` to `worst` (0 past 10)."""
    return [1 / np.log2(r + 1) if r <= 10 else 0.0 for r in (rng.randint(best, worst) for _ in range(count))]


def constructed(kind: str) -> dict[str, list[float]]:
    rng = random.Random(7)
    if kind == "beginning":
        return {"begin": ranks(rng, 60, 1, 2), "middle": ranks(rng, 60, 1, 8), "end": ranks(rng, 60, 3, 14)}
    if kind == "end":
        return {"begin": ranks(rng, 60, 3, 14), "middle": ranks(rng, 60, 1, 8), "end": ranks(rng, 60, 1, 2)}
    same = ranks(rng, 60, 1, 12)
    return {"begin": same, "middle": ranks(rng, 60, 1, 12), "end": list(reversed(same))}


@pytest.mark.parametrize("kind", ["beginning", "end", "level"])
def test_the_verdict_of_constructed_scores_follows_their_end_minus_begin_interval(kind: str) -> None:
    scores = constructed(kind)
    expected = gap_by_hand(scores, RESAMPLES, seed=3)
    profile = position_profile(per_query(scores), RESAMPLES, seed=3)
    gap = profile.end_minus_begin
    assert gap is not None
    assert (gap.estimate, gap.low, gap.high) == pytest.approx((expected.estimate, expected.low, expected.high))
    lean = "beginning" if expected.high < 0 else "end" if expected.low > 0 else "level"
    assert lean == kind, f"the constructed {kind} scores gave {expected}"  # the construction does what it says
    said = verdict("m", "d", gap)
    assert (said.lean, said.calibration_indicated) == (kind, kind == "beginning")


def test_hm_and_psi_come_with_their_intervals_over_the_same_resamples() -> None:
    scores = constructed("beginning")
    profile = position_profile(per_query(scores), RESAMPLES, seed=3)
    means = [float(np.mean(scores[g])) for g in THIRDS]
    assert profile.hm is not None and profile.psi is not None
    assert profile.hm.estimate == pytest.approx(3 / sum(1 / m for m in means))
    assert profile.psi.estimate == pytest.approx(1 - min(means) / max(means))
    assert profile.hm.low < profile.hm.estimate < profile.hm.high and profile.psi.low < profile.psi.high


@pytest.mark.parametrize(
    ("gap", "lean", "words"),
    [
        (Interval(-0.1889, -0.2210, -0.1560), "beginning", "the beginning of a passage by 18.89 points [15.60, 22.10]"),
        (Interval(0.0412, 0.0101, 0.0733), "end", "m favours the end of a passage by 4.12 points [1.01, 7.33]"),
        (Interval(-0.0150, -0.0390, 0.0080), "level", "end − begin -1.50 points [-3.90, +0.80]"),
        # as printed, to two decimals of a point: an interval whose end shows as 0.00 holds 0
        (Interval(-0.0500, -0.0900, -0.00004), "level", "[-9.00, -0.00]"),
        (Interval(-0.0500, -0.0900, -0.00006), "beginning", "by 5.00 points [0.01, 9.00]"),
        (Interval(0.0, 0.0, 0.0), "level", "end − begin +0.00 points [+0.00, +0.00]"),
    ],
)
def test_the_verdict_is_decided_on_the_interval_as_printed(gap: Interval, lean: str, words: str) -> None:
    said = verdict("m", "d", gap)
    assert said.lean == lean and words in said.sentence
    assert said.calibration_indicated == (lean == "beginning")
    assert ("calibration is indicated" in said.sentence) == said.calibration_indicated
    assert "unlikely to help" in said.sentence or said.calibration_indicated


# ------------------------------------------------------------------------------------------ the command line

VISIBLE = 14  # words a 16-token tiny model reads of a passage, between its [CLS] and [SEP]


def write_set(folder: Path, kind: str, passages: int = 24, seed: int = 3) -> None:
    """A JSONL set of 42-word passages, one query per third, labelled by group.

    biased: each query is its third's first 14 words; the model reads only the passage's first 14, so the begin
    query is exactly the text it encodes for the passage (found first) while the others ask for words it never reads.
    level: the three queries of a passage are one text (its words 3-8), so every group scores the same."""
    folder.mkdir()
    rng = random.Random(seed)
    corpus, queries = {}, []
    for d in range(passages):
        words = [rng.choice(WORDS) for _ in range(3 * VISIBLE)]
        corpus[f"p{d}"] = " ".join(words)
        for g, label in enumerate(THIRDS):
            asked = words[VISIBLE * g : VISIBLE * (g + 1)] if kind == "biased" else words[2:8]
            queries.append({"id": f"p{d}-{label}", "text": " ".join(asked), "relevant": [f"p{d}"], "group": label})
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in corpus.items()))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))


NUMBER = r"([+-]?\d+\.\d\d)"
INTERVAL = rf"{NUMBER} \[{NUMBER}, {NUMBER}\]"  # '-76.16 [-85.59, -66.74]'
TABLE_GAP = re.compile(rf"end − begin [│|] {INTERVAL}")
POINTS = rf"{NUMBER} points \[{NUMBER}, {NUMBER}\]"  # the verdict's: '76.16 points [66.74, 85.59]'
BEGINNING = re.compile(rf"favours the beginning of a passage by {POINTS} of nDCG@10 on (\S+): ")
LEVEL = re.compile(rf"is level along the passage within noise on (\S+) \(end − begin {POINTS}")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("diagnose") / "tiny-bert"
    return save_tiny("bert", folder, max_length=VISIBLE + 2, initializer_range=0.5)  # spread: see tests/tiny.py


@pytest.fixture()
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("POSFAIR_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def diagnose(model: Path, data: Path, *extra: str, expect: int = 0) -> str:
    """`tune diagnose` on the tiny model, in this process; its output, whitespace-folded."""
    options = ("--model", str(model), "--pooling", "cls", "--dataset", f"jsonl:{data}", "--bootstrap", "300")
    return tune_here("diagnose", *options, *extra, expect=expect)


def test_diagnose_indicates_calibration_where_the_beginning_wins_beyond_noise(tiny_model: Path, here: Path) -> None:
    write_set(here / "biased", "biased")
    output = diagnose(tiny_model, here / "biased", "--json", str(here / "diagnosis.json"))
    table, sentence = TABLE_GAP.search(output), BEGINNING.search(output)
    assert table and sentence, output
    estimate, low, high = (float(x) for x in table.groups())
    assert high < 0, "the interval the table prints is wholly below 0"
    assert [float(x) for x in sentence.groups()[:3]] == [-estimate, -high, -low], "the table's figures, turned round"
    assert "calibration is indicated" in output
    begin = re.search(rf"nDCG@10 begin [│|] {INTERVAL}", output)
    assert begin and begin.groups() == ("100.00",) * 3, "each begin query is the whole text the model reads"
    written = json.loads((here / "diagnosis.json").read_text(encoding="utf-8"))
    assert written["verdict"]["lean"] == "beginning" and written["verdict"]["calibration_indicated"] is True
    assert written["verdict"]["sentence"] in output
    gap = written["end_minus_begin"]
    assert [round(100 * gap[k], 2) for k in ("estimate", "low", "high")] == [estimate, low, high]
    ndcg = written["ndcg10"]
    assert ndcg["end"]["estimate"] - ndcg["begin"]["estimate"] == pytest.approx(gap["estimate"])

    again = diagnose(tiny_model, here / "biased", "--json", str(here / "diagnosis.json"))  # replaces its own file
    repeated = TABLE_GAP.search(again)
    assert "read from the cache" in again and repeated and repeated.groups() == table.groups()


def test_diagnose_says_level_within_noise_where_the_interval_holds_zero(tiny_model: Path, here: Path) -> None:
    write_set(here / "level", "level")
    output = diagnose(tiny_model, here / "level")
    table, sentence = TABLE_GAP.search(output), LEVEL.search(output)
    assert table and sentence, output
    estimate, low, high = (float(x) for x in table.groups())
    assert estimate == 0 and low <= 0 <= high, "every group asks the same questions"
    assert [float(x) for x in sentence.groups()[1:]] == [estimate, low, high]
    assert "calibration is unlikely to help" in output and "calibration is indicated" not in output


def test_diagnose_writes_its_json_over_no_input_and_no_file_of_another_kind(tiny_model: Path, here: Path) -> None:
    write_set(here / "level", "level")
    output = diagnose(tiny_model, here / "level", "--json", str(here / "level" / "queries.jsonl"), "--force", expect=2)
    assert "an input of this command" in output and "end − begin" not in output, "refused before any work"
    (here / "notes.json").write_text('{"model": "mine"}', encoding="utf-8")
    output = diagnose(tiny_model, here / "level", "--json", str(here / "notes.json"), expect=2)
    assert "is not a `tune diagnose --json` file posfair wrote" in output and "--force" in output
    assert (here / "notes.json").read_text(encoding="utf-8") == '{"model": "mine"}'
