"""The code's layering, read from its imports: packages stacked in the order data flows, no cycle, no
module that knows everything.

LAYERS lists tuner's packages bottom to top: a module may import its own package and the ones below it,
never one above, not even inside a function body (the graph reader sees lazy imports too). `objectives`
imports nothing of tuner; the root `tuner` module holds only the version and may be read by everyone.

Run as a script (`python -m tests.test_layering`) to print the figures: modules, edges, the widest importers.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tuner", "objectives")
LAYERS = (
    "tuner.common",  # files, YAML, messages, trial readers: nothing of posfair
    "tuner.calibration",  # the paper's §3 as code
    "tuner.data",  # benchmarks → PositionalDataset
    "tuner.engine",  # models, the forward loop, the exported YAML
    "objectives",  # metrics, bootstrap, constraints, selection (imports nothing of tuner)
    "tuner.evaluation",  # one config on one dataset, caches, cost
    "tuner.tracking",  # MLflow, registry, plots, progress
    "tuner.tuning",  # settings, space, objective, study, coordinator, workers, conclusion
    "tuner.report",  # `tune evaluate`'s tables
    "tuner.cli",  # the command line
)
MOST_IMPORTS = 15  # project modules one module may import: the widest today (tuning.winner_export) is at it


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the project's packages, by dotted name (a package by its own name)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(module: str, path: Path, known: Iterable[str]) -> set[str]:
    """The project modules `module` imports anywhere in its file (lazy imports inside functions count too)."""
    known = set(known)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import sub` names a submodule when there is one, else a name inside pkg
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:  # `import a.b.c` of a module: its nearest known enclosing module
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
    return targets


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module → the project modules it imports."""
    found = modules(root)
    return {name: _imported(name, path, found) for name, path in found.items()}


def _package_of(module: str, packages: set[str]) -> str:
    """The innermost package holding `module` (a package module stands for itself)."""
    while module not in packages:
        module = module.rpartition(".")[0]
    return module


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def package_graph(graph: dict[str, set[str]], root: Path = ROOT) -> dict[str, set[str]]:
    """Package → the packages its modules import (a package's own `__init__` belongs to it)."""
    packages = {name for name, path in modules(root).items() if path.name == "__init__.py"}
    edges: dict[str, set[str]] = {p: set() for p in packages}
    for module, targets in graph.items():
        source = _package_of(module, packages)
        for target in targets:
            other = _package_of(target, packages)
            # a package reaching into its own subpackage is layering (tuner uses tuner.calibration), not a cycle;
            # the reverse arrow (a subpackage importing its parent's modules) is what counts
            if other != source and not other.startswith(source + "."):
                edges[source].add(other)
    return edges


def top_level_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Top-level package → the top-level packages it imports."""
    edges: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for module, targets in graph.items():
        for target in targets:
            if target.split(".")[0] != module.split(".")[0]:
                edges[module.split(".")[0]].add(target.split(".")[0])
    return edges


def test_no_cycle_between_top_level_packages() -> None:
    """objectives (metrics) sits below tuner: tuner imports it, never the other way round."""
    graph = top_level_graph(import_graph())
    assert cycles(graph) == [], graph
    assert graph["objectives"] == set()


def test_no_cycle_between_packages_or_files() -> None:
    graph = import_graph()
    assert cycles(package_graph(graph)) == []
    assert cycles(graph) == []


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the layer holding `module`; None for the root `tuner` module."""
    for rank, layer in enumerate(LAYERS):
        if module == layer or module.startswith(layer + "."):
            return rank
    if module == "tuner":
        return None
    raise AssertionError(f"{module} lies in no layer of LAYERS: add its package there")


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where a lower layer imports a higher one."""
    found = []
    for module, targets in graph.items():
        source = layer_of(module)
        for target in targets:
            rank = layer_of(target)
            if source is None and rank is not None or source is not None and rank is not None and rank > source:
                found.append((module, target))
    return sorted(found)


def test_lower_packages_never_import_higher_ones() -> None:
    assert upward_imports(import_graph()) == []


def test_the_layer_check_fails_on_an_upward_import() -> None:
    graph = {
        "tuner.engine.models": {"tuner.tuning.search_space"},
        "tuner.tuning.study": {"tuner.common.files", "tuner"},
    }
    assert upward_imports(graph) == [("tuner.engine.models", "tuner.tuning.search_space")]


def test_every_module_lies_in_a_layer() -> None:
    for module in import_graph():
        layer_of(module)


def test_no_module_imports_more_than_a_few_others() -> None:
    graph = {
        module: targets - {"tuner"} for module, targets in import_graph().items()
    }  # the root holds only the version
    widest = max(graph, key=lambda m: len(graph[m]))
    assert len(graph[widest]) <= MOST_IMPORTS, (widest, sorted(graph[widest]))


def test_the_graph_reader_sees_relative_and_lazy_imports(tmp_path: Path) -> None:
    """The reader itself, on a made-up package: a relative import, a lazy one and a cycle are found."""
    for name, text in {
        "tuner/__init__.py": "",
        "tuner/a.py": "from .b import x\n",
        "tuner/b.py": "def f():\n    from tuner import c\n",
        "tuner/c.py": "import tuner.a\n",
        "objectives/__init__.py": "from objectives.m import y\n",
        "objectives/m.py": "",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    graph = import_graph(tmp_path)
    assert graph == {
        "tuner": set(),
        "tuner.a": {"tuner.b"},
        "tuner.b": {"tuner.c"},
        "tuner.c": {"tuner.a"},
        "objectives": {"objectives.m"},
        "objectives.m": set(),
    }
    assert cycles(graph) == [["tuner.a", "tuner.b", "tuner.c"]]


if __name__ == "__main__":
    graph = import_graph()
    edges = sum(len(t) for t in graph.values())
    print(f"{len(graph)} modules, {edges} import edges (half of the others: {(len(graph) - 1) / 2:.0f})")
    for module in sorted(graph, key=lambda m: -len(graph[m]))[:8]:
        print(f"  {module}: imports {len(graph[module])} ({', '.join(sorted(graph[module]))})")
    print("top-level packages:", {k: sorted(v) for k, v in top_level_graph(graph).items()})
    print("package cycles:", cycles(package_graph(graph)) or "none", "| file cycles:", cycles(graph) or "none")
