"""benchmarks/gpu_check.py in its reduced CPU form, as CI runs it: every figure is there and says what it should."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import torch

from benchmarks.gpu_check import main, plan_for


def test_the_reduced_gpu_check_runs_on_cpu_and_writes_every_figure(tmp_path) -> None:
    out = tmp_path / "check.json"
    printed, threads = io.StringIO(), torch.get_num_threads()
    with redirect_stdout(printed):
        main(["--cpu", "--out", str(out)])
    assert torch.get_num_threads() == threads, "the run's single thread is not left behind"
    result = json.loads(out.read_text())
    assert result["mode"] == "cpu" and not result["skipped"]
    assert [c["title"] for c in result["cases"]] == [c.title for c in plan_for("cpu").cases]
    for case in result["cases"]:
        assert case["time"]["pairs"] == 3 and case["time"]["ratio"] > 0 and case["peak_mib"] is None  # no CUDA here
        assert case["strength_0_is_sdpa_bit_for_bit"] and case["prefix_resume_bit_identical"] == {"plain": True, "calibrated": True}
        assert case["fused_kernel"]
    syncs = {(c["case"]["model"], c["case"]["pooling"]): set() for c in result["cases"]}
    for case in result["cases"]:
        syncs[(case["case"]["model"], case["case"]["pooling"])].add(case["host_syncs_per_forward"]["engine"])
    assert all(len(counts) == 1 for counts in syncs.values()), f"syncs grow with the length (baskets): {syncs}"
    assert {(o["model"], o["pooling"]) for o in result["oracle"]} == set(syncs)
    for entry in result["oracle"]:
        assert entry["float32"]["max_abs"] < 1e-5 and entry["float32"]["min_cosine"] > 1 - 1e-6
    assert "| xlmr mean 128×2 |" in printed.getvalue() and "max abs vs fp32 oracle" in printed.getvalue()


def test_what_does_not_fit_the_time_budget_is_skipped_and_listed() -> None:
    from benchmarks.gpu_check import run, table

    lines: list[str] = []
    result = run(plan_for("cpu"), budget_s=0.0, log=lines.append)
    titles = [c.title for c in plan_for("cpu").cases]
    assert result["cases"] == [] and result["oracle"] == [] and result["skipped"] == titles
    assert len(lines) == len(titles) and "skipped (time budget): " + ", ".join(titles) in table(result)
