"""Sphinx extension: every external link on the site is well-formed.

This machine (and CI) has no internet, so ``sphinx-build -b linkcheck`` cannot fetch external links.
Internal links (documents, anchors, ``:doc:``/``:ref:``) are resolved by Sphinx itself and warn when
broken; what is left for external links is their form: an ``http(s)`` URL with a host and no spaces
or placeholders, or a ``mailto:`` with an address. A malformed one is a warning, which ``make docs``
turns into an error.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

_HOST = re.compile(r"^(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+[a-z]{2,}$|^localhost$|^\d{1,3}(?:\.\d{1,3}){3}$")


def problem(uri: str) -> str | None:
    """Why ``uri`` is not a well-formed external link, or None when it is (or is not external)."""
    parts = urlsplit(uri)
    if parts.scheme == "mailto":
        return (
            None if re.fullmatch(r"[^@\s]+@[^@\s]+\.[a-z]{2,}", parts.path) else "a malformed mailto address"
        )
    if parts.scheme not in ("http", "https"):
        return None if not parts.scheme else f"an unexpected scheme {parts.scheme!r}"
    if re.search(r"[\s<>{}\"\\]", uri):
        return "a space, a placeholder or a quote in it"
    if not _HOST.match(parts.hostname or ""):
        return f"no valid host ({parts.netloc!r})"
    return None


def _check(app: Sphinx, doctree: nodes.document) -> None:
    for ref in doctree.findall(nodes.reference):
        uri = ref.get("refuri", "")
        if "://" in uri or uri.startswith("mailto:"):
            why = problem(uri)
            if why:
                logger.warning("malformed external link %s: %s", uri, why, location=ref)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("doctree-read", _check)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
