"""The sentence under every figure: how a record was measured, and whether others shared the machine."""

from __future__ import annotations

from benchmarks.figures.common import measured_on


def record_at(load: float, cores: int = 2) -> dict:
    device = {"cpu": "AMD EPYC", "cores": cores, "memory_gib": 23.5, "gpu": None, "load_average": [load, load, load]}
    return {"command": ".venv/bin/python -m benchmarks.x", "commit": "0123456789abcdef", "device": device}


def test_a_benchmark_that_fills_the_cores_itself_is_not_said_to_share_them() -> None:
    assert measured_on(record_at(2.19)) == (
        "Measured by `python -m benchmarks.x` at commit `0123456789` on 2 CPU cores (AMD EPYC), 23.5 GiB of memory, "
        "load average 2.19."
    )


def test_a_whole_runnable_job_beyond_the_cores_is_said_to_be_another_process() -> None:
    assert measured_on(record_at(3.0)).endswith("load average 3: other jobs shared the machine.")
    assert measured_on(record_at(9.5, cores=8)).endswith("load average 9.5: other jobs shared the machine.")
    assert not measured_on(record_at(8.9, cores=8)).endswith("shared the machine.")


def test_a_missing_record_names_where_its_command_is_not_a_module_guessed_from_its_name(tmp_path) -> None:
    import pytest

    from benchmarks.render import rendered

    with pytest.raises(FileNotFoundError) as refused:
        rendered("<!-- figure: minilm-studies -->\n<!-- /figure -->\n", results=tmp_path)
    assert "search-cost-minilm-titles.json is missing" in str(refused.value)
    assert "benchmarks/README.md" in str(refused.value) and "search_cost_minilm_titles" not in str(refused.value)
