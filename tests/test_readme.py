"""Every command and snippet of the README and the Getting-started page, run as written.

The snippets use the default run's export, `mlruns/exports/minilm--wikipos-dev_titles--seed0.yaml`, and its
registered model `posfair-minilm@champion`. `make tune` itself takes minutes, so a tiny study stands in for it: a
tiny model saved in a folder named `minilm`, tuned under the default study's name, leaves the same paths and the
same model name; the snippets then run unchanged in that folder, with the venv on PATH as `source
.venv/bin/activate` puts it. `make tune` is checked for what it would run and for the path it prints; `make setup`
and `make test` are this very run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import typer
from typer.testing import CliRunner

from tests import forkserver
from tests.test_study import write_dataset
from tests.tiny import save_tiny, tiny_tune_options

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = (ROOT / "README.md", ROOT / "docs" / "index.md")
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.DOTALL | re.MULTILINE)
INLINE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
EXPORT = "mlruns/exports/minilm--wikipos-dev_titles--seed0.yaml"
VENV_BIN = str(Path(sys.executable).parent)


def blocks(language: str) -> list[str]:
    """The fenced blocks of one language in the README and the Getting-started page, in order."""
    return [
        match.group(2)
        for path in DOCUMENTS
        for match in FENCE.finditer(path.read_text(encoding="utf-8"))
        if match.group(1) == language
    ]


def command_lines() -> list[str]:
    """The shell lines of those blocks, comments and blank lines dropped."""
    lines = (line.split(" #")[0].strip() for block in blocks("bash") for line in block.splitlines())
    return list(dict.fromkeys(line for line in lines if line and not line.startswith("#")))


def inline_commands() -> list[str]:
    """The commands quoted in the prose of those pages: `tune …`, `make …`, `optuna-dashboard …` and lone `--option
    …`."""
    spans = (
        " ".join(match.group(1).split())
        for path in DOCUMENTS
        for match in INLINE.finditer(path.read_text(encoding="utf-8"))
    )
    return list(
        dict.fromkeys(
            span
            for span in spans
            if span.split(" ")[0] in ("tune", "make", "optuna-dashboard") or span.startswith("--")
        )
    )


def activated() -> dict[str, str]:
    """The environment `source .venv/bin/activate` leaves: the venv's programs first on PATH."""
    return {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": str(Path(VENV_BIN).parent),
    }


@pytest.fixture(scope="module")
def readme_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding what `make tune` leaves, from a tiny study: the export at the README's path,
    `posfair-minilm`."""
    root = tmp_path_factory.mktemp("readme")
    model = save_tiny("bert", root / "minilm")
    data = write_dataset(root / "data")
    project = root / "project"
    project.mkdir()
    options = [*tiny_tune_options(model, data, trials=2, hm_floor="-50%"), "--selection", "lowest"]
    done = forkserver.run(
        [*forkserver.TUNE_COMMAND, *options, "--study-name", "minilm--wikipos-dev_titles--seed0"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (project / EXPORT).exists(), done.stderr[-3000:]
    return project


def test_every_shell_line_is_one_this_file_runs() -> None:
    """A command added to the README or Getting started must be added here, so that it is run too."""
    known = (
        "make setup",
        "source .venv/bin/activate",
        "make tune",
        "make test",
        "MLFLOW_TRACKING_URI=sqlite:///mlruns/mlflow.db mlflow models serve",
        "curl ",
    )
    unknown = [line for line in command_lines() if not line.startswith(known)]
    assert not unknown, f"no test runs these lines: {unknown}"


def test_the_venv_the_readme_activates_is_the_one_make_setup_makes() -> None:
    assert (ROOT / ".venv" / "bin" / "activate").exists() or "make setup" not in command_lines()
    dry = subprocess.run(
        ["make", "-n", "setup", "tune", "test"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert re.search(r"^\.venv/bin/tune\s*$", dry, re.MULTILINE), dry  # `make tune` is `tune` with no arguments
    assert ".venv/bin/pytest" in dry and "mkdocs build --strict" in dry


def test_every_command_quoted_in_the_prose_parses_as_written() -> None:
    """A renamed option, subcommand or make target fails here rather than for a reader who types it."""
    from tuner.cli.app import app

    group = typer.main.get_group(app)
    run_options = {name for param in group.commands["run"].params for name in param.opts}
    commands = inline_commands()
    assert any(span.startswith("tune ") for span in commands) and any(span.startswith("--") for span in commands), (
        commands
    )
    for span in commands:
        words = shlex.split(span)
        if words[0] == "make":
            assignments = dict(word.split("=", 1) for word in words[1:] if "=" in word)
            dry = subprocess.run(["make", "-n", "-B", *words[1:]], cwd=ROOT, capture_output=True, text=True)
            assert dry.returncode == 0, f"{span}: {dry.stderr}"
            assert all(value in dry.stdout for value in assignments.values()), (
                f"{span}: its variables reach no command\n{dry.stdout}"
            )
            if "ARGS" in assignments:
                words = ["tune", *shlex.split(assignments["ARGS"])]
            else:
                continue
        if words[0] == "optuna-dashboard":
            assert (Path(VENV_BIN) / "optuna-dashboard").exists(), span
        elif words[0].startswith("--"):
            assert words[0] in run_options, f"{span}: `tune run` has no option {words[0]}"
        elif len(words) == 2 and words[1] in group.commands:  # a command named, not run: `tune ui`
            continue
        else:
            args = (
                words[1:] if words[1:2] and words[1] in group.commands else ["run", *words[1:]]
            )  # `tune` is `tune run`
            group.commands[args[0]].make_context(args[0], args[1:])  # raises on an unknown option or a bad value


def test_make_tune_parses_and_prints_the_path_the_readme_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    """`make tune` runs `tune` with no arguments: they parse, and the settings it prints name the README's export."""
    from tuner.cli.app import app

    called = []
    monkeypatch.setattr("tuner.tuning.run.tune", lambda settings: called.append(settings))
    before = signal.getsignal(signal.SIGTERM)
    try:
        result = CliRunner().invoke(app, [], env={"COLUMNS": "200"})
    finally:
        signal.signal(signal.SIGTERM, before)
    assert result.exit_code == 0 and len(called) == 1, result.output
    said = " ".join(result.output.split())
    assert f"output {EXPORT}" in said
    # the default design: WikiPos-dev asked by descriptions and titles, with half a point of nDCG@10 as the margin
    assert "dataset wikipos-dev+titles (default: WikiPos-dev, embedded in posfair" in said
    assert "max-ndcg-drop 0.005" in said
    for path in DOCUMENTS:
        assert EXPORT in path.read_text(encoding="utf-8")


def test_every_python_snippet_runs_as_written(readme_project: Path) -> None:
    """Each snippet in a fresh namespace, in the project folder, in one interpreter (one start-up for all)."""
    snippets = blocks("python")
    assert len(snippets) >= 4, "the three README snippets and Getting started's"
    driver = (
        "import json, sys, numpy\n"
        "out = []\n"
        "for code in json.loads(sys.argv[1]):\n"
        "    names = {}\n"
        "    exec(compile(code, 'snippet', 'exec'), names)\n"
        "    out.append({k: numpy.asarray(v).shape for k, v in names.items() if k.endswith('_vectors')})\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", driver, json.dumps(snippets)],
        cwd=readme_project,
        env=activated(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    shapes = json.loads(done.stdout.splitlines()[-1])
    for snippet, vectors in zip(snippets, shapes):
        assert vectors, f"a snippet that encodes nothing:\n{snippet}"
        assert all(len(shape) == 2 and shape[0] >= 1 for shape in vectors.values()), vectors


@pytest.fixture
def served(readme_project: Path) -> Iterator[str]:
    """The README's `mlflow models serve` line, run as written with the venv on PATH, until it answers."""
    line = next(line for line in command_lines() if "mlflow models serve" in line)
    port = int(re.search(r"-p (\d+)", line).group(1))  # type: ignore[union-attr]
    log = (readme_project.parent / "serve.log").open("w")
    server = subprocess.Popen(
        ["bash", "-c", line],
        cwd=readme_project,
        env=activated(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/ping", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            assert server.poll() is None and time.monotonic() < deadline, (
                readme_project.parent / "serve.log"
            ).read_text()[-3000:]
            time.sleep(1)
        yield line
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        log.close()


def test_the_serving_lines_run_as_written(served: str, readme_project: Path) -> None:
    for line in command_lines():
        if line.startswith("curl "):
            done = subprocess.run(
                ["bash", "-c", line], cwd=readme_project, env=activated(), capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, done.stderr
            predictions = json.loads(done.stdout)["predictions"]
            assert len(predictions) == 1 and len(predictions[0]) > 1
