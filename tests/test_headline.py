"""`tune --model bge-m3`, the headline command, exactly as a user types it (issue 16).

With bge-m3 and FineWeb-PosQ in the Hugging Face cache (tests/hub.py: tiny random weights under BAAI/bge-m3
with 1,024 positions, FineWeb-PosQ in its card's columns with passages of 500-1,300 words), plain
`tune --model bge-m3 --trials 2` tunes on FineWeb-PosQ, batches by tokens, counts what it truncates, prints
its cost before any trial and exports. Without them it stops before any work, naming every download.
"""

from __future__ import annotations

import re

import pytest
import yaml

from tests.hub import (
    BGE_M3,
    FINEWEB_POSQ,
    FakeHub,
    fineweb_posq_rows,
    passages,
    run_tune,
    tune_here,
    use_in_this_process,
)

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_LENGTH = 1024  # the tiny bge-m3's position table, standing in for the real one's 8,192


@pytest.fixture(scope="module")
def corpus():
    return passages(30, 500, 1300, seed=16), [p.text for p in passages(2, 500, 1300, seed=17)]


@pytest.fixture(scope="module")
def headline_run(tmp_path_factory: pytest.TempPathFactory, corpus) -> dict:
    hub = FakeHub(tmp_path_factory.mktemp("headline"))
    hub.add_model(BGE_M3, "xlmr", max_length=MAX_LENGTH)
    passages_, distractors = corpus
    hub.add_fineweb_posq(fineweb_posq_rows(passages_, distractors))
    work = hub.root / "work"
    result = run_tune(hub, "--model", "bge-m3", "--trials", "2", cwd=work)
    return {"hub": hub, "work": work, "result": result, "output": " ".join((result.stdout + result.stderr).split())}


def test_plain_tune_bge_m3_tunes_on_fineweb_posq_from_the_cache_and_exports(headline_run: dict, corpus) -> None:
    result, output, hub = headline_run["result"], headline_run["output"], headline_run["hub"]
    assert result.returncode == 0, output[-6000:]
    assert "fineweb-posq (default for bge-m3, a long-passage model" in output, "the settings say what and why"
    exported = yaml.safe_load((headline_run["work"] / "mlruns/exports/bge-m3--fineweb-posq--seed0.yaml").read_text())
    assert exported["model"]["source"] == BGE_M3 and exported["model"]["revision"] == hub.revisions[BGE_M3]
    assert exported["model"]["max_length"] == MAX_LENGTH
    assert exported["provenance"]["dataset"] == "fineweb-posq-tune"
    # The authors' sampling keeps all 30 × 3 questions here (fewer than 1,000 per group); passages split in halves.
    for part in ("tuning", "heldout/fineweb-posq-heldout"):
        assert {k: exported["metrics"][part][k] for k in ("n_begin", "n_middle", "n_end", "n_queries")} == {
            "n_begin": 15,
            "n_middle": 15,
            "n_end": 15,
            "n_queries": 45,
        }


def test_batches_are_sized_by_tokens_and_truncation_is_counted_per_trial(headline_run: dict, corpus) -> None:
    output = headline_run["output"]
    assert headline_run["result"].returncode == 0, output[-6000:]
    texts = [p.text for p in corpus[0]] + corpus[1]
    lengths = sorted((min(len(t.split()) + 2, MAX_LENGTH) for t in texts), reverse=True)  # one token a word, <s> </s>
    budget = 16 * MAX_LENGTH  # 16 passages of the maximum length: the CPU cap, memory being ample for a tiny model
    batches, start = [], 0
    while start < len(lengths):
        rows = max(1, budget // lengths[start])
        batches.append(lengths[start : start + rows])
        start += rows
    assert len(batches) > 1 and all(len(b) * b[0] <= budget for b in batches)
    sizes = [len(b) for b in batches]
    assert (
        f"fineweb-posq-tune: {len(texts)} passages in {len(batches)} batch(es) of <= {budget} padded tokens "
        f"({min(sizes)}-{max(sizes)} passages each)"
    ) in output
    truncated = sum(len(t.split()) + 2 > MAX_LENGTH for t in texts)
    assert truncated > 0
    assert len(re.findall(rf"trial \d: (?:worst-case )?PSI .*? {truncated} passages truncated", output)) == 2


def test_the_cost_is_estimated_before_the_study_starts(headline_run: dict) -> None:
    output = headline_run["output"]
    assert headline_run["result"].returncode == 0, output[-6000:]
    estimate = output.index("cost estimate on cpu, encoding only")
    assert estimate < output.index("baseline: encoding") < output.index("trial 0:")
    assert re.search(r"a probe of 4 passages × 1,024 tokens took [\d.]+ s", output), "the longest, truncated at 1,024"
    assert re.search(
        r"corpus: 32 passages, [\d,]+ padded tokens \(\d+ truncated at 1,024 tokens\); one encode ≈", output
    )
    assert re.search(
        r"one calibrated trial ≈ [\d.]+ s \(it runs [\d.]+ of 3 layers on average\); "
        r"this study \(at most 2 trials within "
        r"its budget, with the baseline and the held-out scoring\) ≈ [\d.]+ s; the default 16 trials ≈",
        output,
    )
    # plain `tune --model bge-m3` spends at most a third of the paper grid's layer-tokens here, and says so first
    said = re.search(
        r"budget: 1/3 of the paper grid's layer-tokens, ([\d,]+) layer-tokens for the study "
        r"\(the paper grid's study here: ([\d,]+),",
        output,
    )
    assert said and abs(int(said[1].replace(",", "")) - int(said[2].replace(",", "")) / 3) <= 1, output[:3000]
    assert said.start() < output.index("trial 0:")


def test_without_the_model_or_the_data_it_fails_at_once_naming_both_downloads(tmp_path) -> None:
    hub = FakeHub(tmp_path)  # an empty cache
    work = tmp_path / "work"
    result = run_tune(hub, "--model", "bge-m3", "--trials", "2", cwd=work)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, output
    assert f"hf download {BGE_M3}" in output
    assert f"hf download {FINEWEB_POSQ} --repo-type dataset" in output
    assert "add --dataset wikipos-dev+titles" in output
    assert list(work.iterdir()) == [], "nothing loaded, nothing written: no mlruns/, no study"


def test_with_one_of_them_missing_the_error_names_only_that_one(tmp_path, monkeypatch, corpus) -> None:
    model_only = FakeHub(tmp_path / "model-only")
    model_only.add_model(BGE_M3, "xlmr", max_length=MAX_LENGTH)
    monkeypatch.chdir(tmp_path)
    use_in_this_process(model_only, monkeypatch)
    output = tune_here("--model", "bge-m3", "--trials", "2", expect=2)
    assert f"hf download {FINEWEB_POSQ} --repo-type dataset" in output and f"hf download {BGE_M3}" not in output
    assert "add --dataset wikipos-dev+titles" in output

    data_only = FakeHub(tmp_path / "data-only")
    data_only.add_fineweb_posq(fineweb_posq_rows(corpus[0][:2]))
    use_in_this_process(data_only, monkeypatch)
    output = tune_here("--model", "bge-m3", "--trials", "2", expect=2)
    assert f"hf download {BGE_M3}" in output and "FineWeb-PosQ --repo-type dataset" not in output
    assert not (tmp_path / "mlruns").exists()


def test_every_trial_runs_the_rungs_of_fineweb_posq_its_tuning_part_and_its_length_halves(headline_run: dict) -> None:
    """FineWeb-PosQ has no known segments: its structures are the tuning part's two length halves (scored from
    the trial's own vectors). The exported winner records each rung's PSI and direction; the estimate says
    the study's layer-tokens before any trial."""
    output = headline_run["output"]
    assert headline_run["result"].returncode == 0, output[-6000:]
    exported = yaml.safe_load((headline_run["work"] / "mlruns/exports/bge-m3--fineweb-posq--seed0.yaml").read_text())
    structures = exported["provenance"]["structures"]
    assert set(structures) == {"fineweb-posq-tune", "fineweb-posq-tune-shorter", "fineweb-posq-tune-longer"}
    assert all(0 <= s["psi"] <= 1 and "tilt" in s for s in structures.values())
    # a reversal where the uncalibrated model has a direction there: the tilt measured against it
    assert all(abs(s["reversal"]) == pytest.approx(abs(s["tilt"])) for s in structures.values() if "reversal" in s)
    assert re.search(
        r"layer-tokens \(padded tokens × layers run\): ≈ [\d,]+, of which ≈ [\d,]+ are the baselines and queries "
        r"\(none that the disk cache holds\); held-out scoring ≈ [\d,]+ more",
        output,
    )
    assert output.index("layer-tokens (padded tokens") < output.index("trial 0:")
    assert re.search(r"no pooled screen: a pool of 45 queries would hold \d+% of fineweb-posq-tune's passages", output)
