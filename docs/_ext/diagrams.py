"""Sphinx extension: ```mermaid fences drawn as SVG when the site is built, so a page needs no script.

The Markdown pages keep their diagrams as ```mermaid fences (GitHub draws those itself); MyST hands each
fence to the ``mermaid`` directive here (``myst_fence_as_directive`` in ``conf.py``), which renders it
with mermaidx (mermaid.js run in an embedded QuickJS: no browser, no Node.js, no network) and puts the
SVG in the page. A page therefore loads nothing from a CDN and shows its diagrams with JavaScript off.
A diagram that does not render is a warning, which ``make docs`` turns into an error. Rendered SVGs are
kept by the hash of their source beside the doctrees, so an unchanged diagram is drawn once.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

MIN_WIDTH_PX = 860


def render_svg(source: str, cache: Path) -> str:
    """The diagram as an SVG document (from the cache when this exact source was drawn before)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    kept = cache / f"{digest}.svg"
    if kept.is_file():
        return kept.read_text(encoding="utf-8")
    import mermaidx  # imported on first use: starting its JavaScript engine takes a second or two

    svg: str = mermaidx.render(source).svg()
    cache.mkdir(parents=True, exist_ok=True)
    kept.write_text(svg, encoding="utf-8")
    return svg


class Mermaid(SphinxDirective):
    """``mermaid``: the content is a Mermaid diagram, put in the page as SVG."""

    has_content = True

    def run(self) -> list[nodes.Node]:
        source = "\n".join(self.content).strip()
        try:
            svg = render_svg(source, Path(self.env.doctreedir) / "diagrams")
        except Exception as exc:  # mermaid's own parse and render errors: say which diagram, fail the build
            logger.warning("diagram not drawn: %s", exc, location=self.get_location())
            return [nodes.literal_block(source, source)]
        svg = re.sub(r"^<\?xml[^>]*>\s*", "", svg)
        # Drawn no narrower than its text stays legible at; a wider diagram scrolls inside the column.
        html = (
            '<figure class="diagram" role="img" style="overflow-x: auto; margin: 1em 0">'
            f'<div style="min-width: {MIN_WIDTH_PX}px">{svg}</div></figure>'
        )
        return [nodes.raw("", html, format="html")]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("mermaid", Mermaid)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
