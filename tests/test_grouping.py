"""The suite's own precondition: under `make test` (`--dist loadgroup`), tests that share a `tune` study run on one
worker, so each study runs once (`SHARED_RUNS` in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("grouping-check")
def test_loadgroup_really_groups(request: pytest.FixtureRequest) -> None:
    # pytest-xdist 3.8 marks a grouped test by renaming its node id (`…@group`); pytest 9.2's structured node ids
    # ignore the rename (pytest-dev/pytest-xdist#1386), so every worker that drew one test of a shared study ran the
    # whole study again, silently. Hence `pytest<9.2` in pyproject.toml, and this check.
    if not getattr(request.config.option, "loadgroup", False):  # set on xdist's workers under --dist loadgroup
        pytest.skip("not run under --dist loadgroup")
    assert request.node.nodeid.endswith("@grouping-check"), (
        f"--dist loadgroup does not group ({request.node.nodeid} has no @group suffix): each shared tune study runs "
        "on every worker that draws one of its tests; pytest-xdist 3.8 needs pytest < 9.2 (pytest-dev/pytest-xdist#1386)"
    )
