"""Smoke test of benchmarks/overhead.py on a tiny random XLM-R, in this process (no timing assertions)."""

from __future__ import annotations

import io
import json
import math
import re
from contextlib import redirect_stdout

import pytest

from benchmarks.overhead import parse, plan, plan_noop
from benchmarks.overhead_cases import METHODS, Case, Column
from benchmarks.overhead_process import child_main, measure, measure_noop
from benchmarks.overhead_report import AGREEMENT, RAW, agreement_diffs, noop_report, report, summarised


def tiny_case(method: str, pooling: str, **overrides: object) -> Case:
    values = {"length": 40, "batch": 2, "layers": 2, "repeats": 1, "basket": 8, "call_repeats": 1, "pad_one": True}
    return Case(model="tiny", method=method, pooling=pooling, **{**values, **overrides})


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_measure_and_report_on_a_tiny_model(pooling: str) -> None:
    column = Column("tiny", pooling, 40, 2, 2, 1, pad_one=True)
    for method in METHODS:
        column.results[method] = measure(tiny_case(method, pooling))
    column.results["sdpa#2"] = measure(tiny_case("sdpa", pooling, run=2))

    for method, result in column.results.items():
        assert result["time_s"] > 0 and (len(result["times_s"]) == 1 if method != "engine" else True)
        assert isinstance(result["extra_kib"], int)
        assert result["calibrated_layers"] == [1]
    engine = column.results["engine"]
    assert engine["paired_ratio"] > 0 and engine["call_engine_s"] > 0 and engine["plain_time_s"] > 0
    # a fast forward gets more ABBA pairs than `repeats` (up to 16), plain and calibrated alike
    assert 1 < len(engine["times_s"]) == len(engine["plain_times_s"]) <= 16

    def pooled(key: str, name: str = "embedding"):
        import torch

        return torch.tensor(column.results[key][name][pooling])

    # the processes compute what they claim: the engine agrees with the oracle, eager with SDPA,
    # and the engine outside a calibration is SDPA (basket 8 < 40 tokens, so calibration does act)
    assert (pooled("engine") - pooled("oracle")).abs().max() < 1e-4
    assert (pooled("sdpa") - pooled("eager")).abs().max() < 1e-4
    assert (pooled("engine", "plain_embedding") - pooled("sdpa")).abs().max() < 1e-5
    assert (pooled("engine") - pooled("sdpa")).abs().max() > 1e-6

    kept = summarised(column)  # the record keeps the comparison, not the vectors
    assert (
        kept["agreement"] == agreement_diffs(column.results, pooling)
        and kept["agreement"]["engine vs oracle (calibrated)"] < 1e-4
    )
    assert not any(key in result for result in kept["results"].values() for key in RAW)
    assert kept["results"]["engine"]["paired_ratio"] == engine["paired_ratio"]

    text = report([column], "python -m benchmarks.overhead --test")
    assert f"| method | tiny XLM-R {pooling} 40×2 |" in text
    assert "== Targets ==" in text and "engine vs oracle (calibrated)" in text
    assert "failed" not in text


def test_child_entry_prints_one_result_line() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        child_main(json.dumps(tiny_case("engine", "cls").__dict__))
    lines = [line for line in out.getvalue().splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1
    assert json.loads(lines[0][len("RESULT ") :])["case"]["method"] == "engine"


def test_plan_reuses_plain_processes_for_the_mean_column() -> None:
    columns = plan(parse([]))
    titles = [c.title for c in columns]
    assert titles == [
        "XLM-R cls 512×8",
        "XLM-R cls 1024×8",
        "XLM-R cls 2048×8",
        "XLM-R mean 512×8",
        "MiniLM mean 512×16",
    ]
    assert columns[3].plain_from is columns[0]
    assert [c.title for c in plan(parse(["--quick"]))] == ["XLM-R cls 512×8", "MiniLM mean 512×16"]


def test_profile_table_is_of_one_calibrated_engine_call() -> None:
    """Mean pooling calls SDPA's kernel once per content basket: 40 tokens less [CLS] and [SEP] in baskets of 8 is 5."""
    from benchmarks.overhead_process import profile_call

    case = tiny_case("engine", "mean")
    text = profile_call(case, rows=100)
    header = re.search(r"SDPA call ([0-9.]+) ms, engine call ([0-9.]+) ms", text)
    assert header and float(header[2]) > 0
    kernel_calls = [
        int(row[1]) for row in re.finditer(r"^\s*aten::_scaled_dot_product\S*\s.*?\s(\d+)\s+\[\[", text, re.M)
    ]
    assert sum(kernel_calls) == math.ceil((case.length - 2) / case.basket) == 5


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_nothing_to_calibrate_is_timed_against_sdpa_and_gives_sdpas_embeddings(pooling: str) -> None:
    """--noop: λ = 0 and passages shorter than a basket, interleaved with the uncalibrated forward; both take
    SDPA's own path, so their embeddings are SDPA's to the bit (basket 8 < 40 tokens would calibrate at λ > 0)."""
    result = measure_noop(tiny_case("noop", pooling, call_repeats=2))
    assert set(result["paired_ratio"]) == set(result["calls"]) == {"strength 0", "short passages"}
    assert all(ratio > 0 for ratio in result["paired_ratio"].values())
    # two timed pairs of a sub-millisecond call: the estimate is measured, its sign is noise on a loaded machine
    assert all(
        math.isfinite(call["estimated_ratio"]) and call["call_repeats"] == 2 for call in result["calls"].values()
    )
    assert result["max_abs_diff"] == {"strength 0": 0.0, "short passages": 0.0}
    assert 1 <= result["rounds"] <= 16 and all(len(t) == result["rounds"] for t in result["times_s"].values())
    text = noop_report([f"tiny XLM-R {pooling} 40×2"], [result], "python -m benchmarks.overhead --noop")
    assert f"tiny XLM-R {pooling} 40×2, strength 0: paired " in text
    assert f"tiny XLM-R {pooling} 40×2, short passages: paired " in text and "from the attention call" in text
    # the line states the estimate it has: a ratio when positive, never a negative one printed as a ratio
    result["calls"]["strength 0"]["estimated_ratio"], result["calls"]["short passages"]["estimated_ratio"] = 1.25, -0.5
    lines = noop_report(["t"], [result], "cmd").splitlines()
    assert "from the attention call 1.250× [FAIL]" in next(line for line in lines if "t, strength 0:" in line)
    assert "from the attention call no ratio (the difference is noise)" in next(
        line for line in lines if "t, short passages:" in line
    )


def test_noop_plan_covers_pooled_and_mean_columns() -> None:
    assert [c.title for c in plan_noop(parse(["--noop"]))] == [
        "XLM-R cls 512×8",
        "XLM-R mean 512×8",
        "MiniLM mean 512×16",
    ]


def test_the_committed_record_keeps_summaries_not_raw_samples() -> None:
    """docs/results/overhead.json holds every figure the docs render and each column's agreement, not the pooled vectors
    each process returned (they made it 7.8 MB)."""
    from benchmarks import record

    path = record.RESULTS / "overhead.json"
    data = record.read(path)
    assert path.stat().st_size < 100_000
    for column in data["results"]["columns"]:
        assert set(column["agreement"]) == set(AGREEMENT)
        assert not any(key in result for result in column["results"].values() for key in RAW)
