"""mkdocs hook: the Command line page is rendered from the `tune` app at build time (`tuner.cli.reference`), so a
changed option or help text changes the page."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from tuner.cli.reference import reference

    return markdown.replace(MARKER, reference())
