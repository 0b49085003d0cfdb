"""YAML as posfair reads it from users: safe tags only, no duplicate keys, alias expansion bounded.

`yaml.safe_load` already refuses `!!python/...` tags, but it lets the last of two equal keys win silently
and expands aliases without limit (a 1 KB "billion laughs" file grows to gigabytes). Here the document is
composed first (aliases are shared nodes, so composing is cheap), its expanded size is counted on that
graph, and only a document within `MAX_NODES` is constructed. Errors name the file and line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from tuner.common.messages import first_line

MAX_NODES = 100_000
"""Scalars, lists and mappings a document may expand to: far beyond any config or options file."""


class YamlError(ValueError):
    """A YAML file posfair refuses; the message names the file, the line and the fix."""


class _Loader(yaml.SafeLoader):
    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise YamlError(
                        f"line {key_node.start_mark.line + 1}: key {key_node.value!r} appears twice in one mapping "
                        f"(first on line {seen[key] + 1}); keep one"
                    )
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _expanded_size(root: Node, limit: int) -> tuple[int, int]:
    """Nodes the document holds once every alias is expanded, counted on the shared graph (linear time), and the
    nodes written in it (each alias's target once)."""
    sizes: dict[int, int] = {}
    visiting: set[int] = set()

    def size(node: Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in visiting:
            raise YamlError(
                f"line {node.start_mark.line + 1}: an alias refers to the structure that holds it; "
                "posfair reads no recursive YAML"
            )
        visiting.add(key)
        total = 1
        if isinstance(node, SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        visiting.discard(key)
        sizes[key] = min(total, limit + 1)
        return sizes[key]

    return size(root), len(sizes)


def loads(text: str, source: str = "<yaml>", max_nodes: int = MAX_NODES) -> Any:
    """Parse one YAML document with the rules above; `source` names the file in errors."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded, written = _expanded_size(node, max_nodes)
        if written > max_nodes:
            raise YamlError(
                f"{source}: holds more than {max_nodes:,} values, far more than any file posfair reads (a config, a "
                "search space or an options file holds tens); give the right file, or list fewer values"
            )
        if expanded > max_nodes:
            raise YamlError(
                f"{source}: expands to more than {max_nodes:,} values through its aliases (*name); "
                "write the values out or use fewer aliases"
            )
        return loader.construct_document(node)
    except YamlError as error:
        message = str(error)
        raise YamlError(
            message if message.startswith(source) else f"{source}:{message.removeprefix('line ')}"
        ) from None
    except yaml.constructor.ConstructorError as error:
        line = f":{error.problem_mark.line + 1}" if error.problem_mark else ""
        if "could not determine a constructor" in str(error.problem):
            raise YamlError(
                f"{source}{line}: contains a tag posfair never loads (such as !!python/object); write plain YAML"
            ) from None
        raise YamlError(f"{source}{line}: {error.problem}") from None
    except yaml.MarkedYAMLError as error:
        line = f":{error.problem_mark.line + 1}" if error.problem_mark else ""
        raise YamlError(f"{source}{line}: not valid YAML: {error.problem}") from None
    except yaml.YAMLError as error:
        raise YamlError(f"{source}: not valid YAML: {first_line(error)}") from None
    except RecursionError:
        raise YamlError(f"{source}: nested too deeply to read") from None
    finally:
        loader.dispose()


def load_file(path: str | Path, max_nodes: int = MAX_NODES) -> Any:
    """`loads` of a UTF-8 file; a missing file, a folder or another encoding is one clear error."""
    path = Path(path)
    if path.is_dir():
        raise YamlError(f"{path} is a folder; give a YAML file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise YamlError(f"{path}: no such file; check the name and the folder ({Path.cwd()})") from None
    except UnicodeDecodeError:
        raise YamlError(f"{path}: not UTF-8 text; re-save it as UTF-8") from None
    except OSError as error:
        raise YamlError(f"{path}: cannot read it ({error.strerror})") from None
    return loads(text, str(path), max_nodes)
