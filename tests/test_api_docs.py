"""The API page (docs/api.md) documents every public entry point as Optuna documents its own: each parameter of its
signature in the rendered `Parameters` table, what it returns and what it raises; each field of a record in the
`Attributes` table. The page is built alone, with the site's own mkdocstrings configuration (the whole site's
strict build is `make docs`)."""

from __future__ import annotations

import dataclasses
import html
import importlib
import inspect
import os
import re
import shutil
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

ROOT = Path(__file__).parents[1]
PAGE = ROOT / "docs" / "api.md"
HEADING = re.compile(r'<h[1-6] id="([^"]+)" class="doc doc-heading">')


def rendered_objects() -> list[str]:
    """Every object the page renders: each `::: path` block, and each member its `members` option lists."""
    paths = []
    for block in re.split(r"^(?=::: )", PAGE.read_text(encoding="utf-8"), flags=re.MULTILINE)[1:]:
        path = block.split()[1]
        paths.append(path)
        members = re.search(r"members: \[(.*)\]", block)
        paths += [f"{path}.{name.strip()}" for name in members.group(1).split(",")] if members else []
    return paths


def resolve(path: str) -> object:
    """The object a dotted path names: the longest module prefix that imports, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(path)


def expected(thing: object) -> tuple[str, list[str]]:
    """The section that must list what `thing` takes, and the names it must list: a record's fields, or the
    parameters of a class's constructor or a function (`*args` and `**options` as written, but a `**options:
    Unpack[SomeTypedDict]` as its keywords, which the site's Griffe extension `unpack_typeddict` shows)."""
    if isinstance(thing, type) and issubclass(thing, BaseModel):
        return "Attributes:", list(thing.model_fields)
    if dataclasses.is_dataclass(thing):
        return "Attributes:", [field.name for field in dataclasses.fields(thing)]
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    hints = typing.get_type_hints(thing)
    names = []
    for parameter in inspect.signature(thing).parameters.values():  # type: ignore[arg-type]
        hint = hints.get(parameter.name)
        if typing.get_origin(hint) is typing.Unpack:  # `**options: Unpack[SomeTypedDict]`: its keywords, in order
            names += list(typing.get_type_hints(typing.get_args(hint)[0]))
        elif parameter.name != "self":
            names.append(stars.get(parameter.kind, "") + parameter.name)
    return "Parameters:", names


def sections(fragment: str) -> dict[str, list[str]]:
    """Each docstring section of an object's HTML (`Parameters:`, `Returns:`, ...) → the first cell of each row."""
    found = {}
    for title, body in re.findall(r'doc-section-title">([^<]+)</span>(.*?)</table>', fragment, flags=re.DOTALL):
        cells = re.findall(r'<tr class="doc-section-item">\s*<td>(.*?)</td>', body, flags=re.DOTALL)
        found[title] = [html.unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in cells]
    return found


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The built API page: each rendered object's HTML, by its id."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    folder = tmp_path_factory.mktemp("api-page")
    (folder / "docs").mkdir()
    shutil.copy(PAGE, folder / "docs" / "api.md")
    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    site |= {"docs_dir": str(folder / "docs"), "site_dir": str(folder / "site"), "nav": [{"API": "api.md"}]}
    site |= {"strict": False, "hooks": []}  # the page alone: its links to other pages lead nowhere here
    for plugin in site["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            plugin["mkdocstrings"]["handlers"]["python"]["paths"] = [str(ROOT)]
    (folder / "mkdocs.yml").write_text(yaml.safe_dump(site), encoding="utf-8")
    os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")
    build(load_config(str(folder / "mkdocs.yml")))
    parts = HEADING.split((folder / "site" / "api" / "index.html").read_text(encoding="utf-8"))
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_page_renders_every_object_it_names(page: dict[str, str]) -> None:
    assert set(rendered_objects()) <= set(page), sorted(set(rendered_objects()) - set(page))


@pytest.mark.parametrize("path", rendered_objects())
def test_each_entry_point_shows_its_parameters_what_it_returns_and_what_it_raises(
    page: dict[str, str],
    path: str,
) -> None:
    thing = resolve(path)
    name = getattr(thing, "__name__", path.rpartition(".")[2])
    if name != path.rpartition(".")[2]:  # another name of a method the page documents (`encode`): it says which
        assert f"{path.rpartition('.')[0]}.{name}" in rendered_objects() and name in page[path], path
        return
    shown = sections(page[path])
    title, names = expected(thing)
    assert shown.get(title) == names, f"{path}: {title} shows {shown.get(title)}, the code has {names}"
    if not isinstance(thing, type):
        assert shown.get("Returns:"), f"{path}: no Returns section"
    assert shown.get("Raises:"), f"{path}: no Raises section"
