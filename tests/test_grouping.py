"""The suite's own precondition: under `make test` (`--dist loadgroup`), tests that share a `tune` study run on one
worker, so each study runs once (`SHARED_RUNS` in tests/conftest.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import SHARED_RUNS


@pytest.mark.xdist_group("grouping-check")
def test_loadgroup_really_groups(request: pytest.FixtureRequest) -> None:
    # pytest-xdist 3.8 marks a grouped test by renaming its node id (`…@group`); pytest 9.2's structured node ids
    # ignore the rename (pytest-dev/pytest-xdist#1386), so every worker that drew one test of a shared study ran the
    # whole study again, silently. Hence `pytest<9.2` in pyproject.toml, and this check.
    if not getattr(request.config.option, "loadgroup", False):  # set on xdist's workers under --dist loadgroup
        pytest.skip("not run under --dist loadgroup")
    assert request.node.nodeid.endswith("@grouping-check"), (
        f"--dist loadgroup does not group ({request.node.nodeid} has no @group suffix): each shared tune study runs "
        "on every worker that draws one of its tests; "
        "pytest-xdist 3.8 needs pytest < 9.2 (pytest-dev/pytest-xdist#1386)"
    )


# `tune(settings)`, `run_tune(hub, ...)`, `forkserver.run/popen([tune ...])`
STUDY_CALLS = {
    "tune",
    "run_tune",
    "run",
    "popen",
}


def _module_fixtures_that_run_a_study() -> dict[str, str]:
    """Module-scoped fixtures of the suite whose body runs `tune` (in this process or as a command), by name."""
    found: dict[str, str] = {}
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef) or not any(_module_scoped(d) for d in node.decorator_list):
                continue
            calls = {_name(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}
            if calls & STUDY_CALLS and any("tune" in ast.unparse(c) for c in ast.walk(node) if isinstance(c, ast.Call)):
                found[node.name] = path.name
    return found


def _module_scoped(decorator: ast.expr) -> bool:
    return isinstance(decorator, ast.Call) and any(
        k.arg == "scope" and ast.literal_eval(k.value) == "module" for k in decorator.keywords
    )


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def test_every_module_fixture_that_runs_a_study_is_a_shared_run() -> None:
    """A module-scoped study fixture left out of `SHARED_RUNS` runs once per worker that draws one of its tests
    (test_budget's `budgeted`, ~50 s, ran twice in the suite before it was listed)."""
    studies = _module_fixtures_that_run_a_study()
    assert {"default_run", "workspace", "budgeted"} <= set(studies)  # the scan sees them (in-process and commands)
    missing = {name: module for name, module in studies.items() if name not in SHARED_RUNS}
    assert not missing, f"add these to SHARED_RUNS in tests/conftest.py: {missing}"
