"""mkdocs hooks: the Command line page is rendered from the `tune` app at build time (`tuner.cli.reference`), so a
changed option or help text changes the page; and the pages' math is typeset at build time, offline, into inline SVG
by matplotlib's mathtext (a dependency already), so the site needs no MathJax or KaTeX and no network to show it."""

from __future__ import annotations

import hashlib
import html
import io
import re
from typing import Any

MARKER = "<!-- cli-reference -->"
# pymdownx.arithmatex in generic mode leaves `\( … \)` (inline) and `\[ … \]` (display) in these elements
MATH = re.compile(r'<(?P<tag>span|div) class="arithmatex">\\(?P<open>[(\[])(?P<tex>.+?)\\[)\]]</(?P=tag)>', re.S)
MATH_POINTS = 12.0  # the size of the math, in points: the body text's


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from tuner.cli.reference import reference

    return markdown.replace(MARKER, reference())


def on_page_content(content: str, **_: Any) -> str:
    """Every arithmatex formula of a page as inline SVG, its TeX kept as the accessible label."""
    return MATH.sub(_typeset, content)


def _typeset(match: re.Match[str]) -> str:
    tex = html.unescape(match["tex"]).strip()
    svg, depth = math_svg(tex)
    label = html.escape(tex, quote=True)
    style = f"vertical-align: -{depth:.1f}pt" if match["open"] == "(" else "display: block; margin: 0.6em auto"
    svg = svg.replace("<svg ", f'<svg role="img" aria-label="{label}" style="{style}" ', 1)
    return f'<{match["tag"]} class="arithmatex">{svg}</{match["tag"]}>'


def math_svg(tex: str) -> tuple[str, float]:
    """`tex` typeset by matplotlib's mathtext as an SVG element (glyphs as paths, no metadata or date, so a build is
    reproducible), and how far it reaches below the baseline, in points."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.font_manager import FontProperties
    from matplotlib.mathtext import math_to_image

    out = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "posfair-docs", "svg.fonttype": "path"}):
        depth = math_to_image(f"${tex}$", out, prop=FontProperties(size=MATH_POINTS), format="svg")
    svg = out.getvalue().decode("utf-8")
    svg = svg[svg.index("<svg ") :]
    svg = re.sub(r"\s*<(metadata|style)\b.*?</\1>", "", svg, flags=re.S)  # its style's `*` rule would reach the page
    prefix = "math-" + hashlib.sha1(tex.encode()).hexdigest()[:8] + "-"  # ids of its own: a page has several formulas
    svg = re.sub(r'(id="|href="#|url\(#)', lambda m: m[1] + prefix, svg)
    return svg.strip(), float(depth)
