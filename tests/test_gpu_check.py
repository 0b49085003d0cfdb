"""benchmarks/gpu_check.py in its reduced CPU form, as CI runs it: every figure is there and says what it should."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import torch
import transformers

from benchmarks.gpu_cases import plan_for
from benchmarks.gpu_check import main


def test_the_reduced_gpu_check_runs_on_cpu_and_writes_every_figure(tmp_path) -> None:
    out = tmp_path / "check.json"
    printed, threads = io.StringIO(), torch.get_num_threads()
    with redirect_stdout(printed):
        main(["--cpu", "--out", str(out)])
    assert torch.get_num_threads() == threads, "the run's single thread is not left behind"
    result = json.loads(out.read_text())
    assert result["mode"] == "cpu" and not result["skipped"]
    assert result["versions"] == {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": None,  # what a CUDA run names: the CUDA runtime, cuDNN, the driver, the SDPA backends torch may pick
        "cudnn": None,
        "driver": None,
        "sdpa_backends_enabled": None,
    }
    assert [c["title"] for c in result["cases"]] == [c.title for c in plan_for("cpu").cases]
    for case in result["cases"]:
        for path in ("pinned", "default"):
            assert case["time"][path]["pairs"] == 3 and case["time"][path]["ratio"] > 0
            assert case["strength_0_is_sdpa_bit_for_bit"][path]
        assert case["peak_mib"] is None  # no CUDA here
        assert case["prefix_resume_bit_identical"] == {"plain": True, "calibrated": True} and case["fused_kernel"]
        assert (
            case["pinned_backend"] == "FLASH_ATTENTION"
            and case["kernels_alike"]
            and case["figures_kernels"] == "pinned"
        )
        # the tiny models have 4 layers, 2 of them calibrated: SDPA runs in every layer of the plain forward; the
        # engine's mean path runs the fused kernel itself once per basket of 16 of the 2 + (length - 2) tokens
        length, layers, calibrated = case["case"]["length"], 4, 2
        per_layer = -(-(length - 2) // 16)
        expected = (
            {"sdpa": {"FLASH_ATTENTION": layers - calibrated}, "direct": {"FLASH_ATTENTION": calibrated * per_layer}}
            if case["case"]["pooling"] == "mean"
            else {"sdpa": {"FLASH_ATTENTION": layers}, "direct": {}}
        )
        assert case["kernels"]["pinned"] == {
            "sdpa": {"sdpa": {"FLASH_ATTENTION": layers}, "direct": {}},
            "engine": expected,
        }
    syncs = {(c["case"]["model"], c["case"]["pooling"]): set() for c in result["cases"]}
    for case in result["cases"]:
        syncs[(case["case"]["model"], case["case"]["pooling"])].add(case["host_syncs_per_forward"]["engine"])
    assert all(len(counts) == 1 for counts in syncs.values()), f"syncs grow with the length (baskets): {syncs}"
    assert {(o["model"], o["pooling"]) for o in result["oracle"]} == set(syncs)
    for entry in result["oracle"]:
        assert entry["float32"]["max_abs"] < 1e-5 and entry["float32"]["min_cosine"] > 1 - 1e-6
    assert "| xlmr mean 128×2 |" in printed.getvalue() and "max abs vs fp32 oracle" in printed.getvalue()
    assert "pinned: SDPA as sdpa_kernel(FLASH_ATTENTION), default: as torch picks" in printed.getvalue()


def test_the_kernels_of_sdpa_calls_and_of_the_engines_own_calls_are_counted_by_backend() -> None:
    """SDPA's backend is chosen inside the call, so what it runs is asked of torch's chooser with the call's
    arguments (which honours `sdpa_kernel`); a fused kernel called directly is counted by its op."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from benchmarks.gpu_counters import AttentionKernels

    q = torch.randn(1, 2, 16, 8)
    with AttentionKernels() as counted:  # outside inference mode, where SDPA's own kernel call is an op too
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
        with sdpa_kernel(SDPBackend.MATH):
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q)
    assert counted.as_dict() == {"sdpa": {"FLASH_ATTENTION": 1, "MATH": 1}, "direct": {"FLASH_ATTENTION": 1}}


def test_what_does_not_fit_the_time_budget_is_skipped_and_listed() -> None:
    from benchmarks.gpu_check import run, table

    lines: list[str] = []
    result = run(plan_for("cpu"), budget_s=0.0, log=lines.append)
    titles = [c.title for c in plan_for("cpu").cases]
    assert result["cases"] == [] and result["oracle"] == [] and result["skipped"] == titles
    assert len(lines) == len(titles) and "skipped (time budget): " + ", ".join(titles) in table(result)
