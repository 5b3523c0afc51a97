"""Sphinx configuration of the docs site (``make docs``).

The site is built from the repository root (``sphinx-build -c docs . <out>``) so that the pages stay
where their owners keep them: the Airflow provider's reStructuredText pages in
``providers/volcano/docs`` (laid out as Airflow's own providers are), the Markdown pages in ``docs/``
(MyST) and ``CHANGELOG.md`` at the top. ``include_patterns`` names exactly those; nothing else in the
tree is read.

Links: a broken internal link, anchor, ``:doc:`` or ``:ref:`` is a warning, and ``make docs`` turns
warnings into errors. External links cannot be fetched here (no internet), so the ``links`` extension
checks each one for well-formedness instead (``docs/_ext/links.py``).

The API reference (``docs/reference/``) is generated from the docstrings of every name in each package's
``__all__`` (``docs/_ext/apiref.py``: a missing docstring is an error). Diagrams are drawn as SVG at build
time (``docs/_ext/diagrams.py``): the built pages load nothing from outside the site
(``tests/docs/test_site.py`` opens every page in a browser and checks).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))

from volcano_locks import __version__  # noqa: E402

project = "volcano-locks"
author = "the volcano-locks developers"
copyright = "2026, the volcano-locks developers"
version = release = __version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "apiref", "diagrams", "links"]
root_doc = "docs/index"
include_patterns = ["docs/**", "providers/volcano/docs/**", "CHANGELOG.md"]
exclude_patterns = ["docs/_build/**", "docs/_ext/**", "docs/conf.py"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}

# Markdown: GitHub-style heading anchors (so `page.md#a-heading` links work on GitHub and here), and
# ```mermaid fences drawn as SVG diagrams at build time (docs/_ext/diagrams.py).
myst_heading_anchors = 3
myst_fence_as_directive = ["mermaid"]
myst_enable_extensions = ["colon_fence"]

# Every reference must resolve. The exception: other libraries' objects in the API reference's
# signatures (the standard library, httpx, pydantic, Airflow, Prefect), whose inventories cannot be
# downloaded here; a reference to one of ours that resolves nowhere stays an error (docs/_ext/apiref.py).
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?!(volcano_locks|airflow_provider_volcano|prefect_volcano)\b).*")]
suppress_warnings: list[str] = []

# The API reference: Google-style docstrings (the core, Prefect) and :param: fields (the Airflow provider).
# Airflow is not in the environment that builds the site: autodoc imports the provider against a mock of
# it, and shows each default as written in the source (never a mock's repr).
autodoc_mock_imports = ["airflow", "asgiref"]  # asgiref: Airflow's, imported by the trigger's runtime
autodoc_preserve_defaults = True
autodoc_member_order = "bysource"
autodoc_class_signature = "separated"
# `single backticks` in a docstring (Markdown's code, the Prefect package's convention) show as code.
default_role = "code"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"
html_title = f"volcano-locks {release}"
html_static_path: list[str] = []
html_theme_options = {
    "description": "Volcano project locks for Airflow 3 and Prefect 3",
    "fixed_sidebar": True,
    # Wide enough for the API reference's signatures and a sequence diagram's legible width (860 px).
    "page_width": "1200px",
    "body_max_width": "none",
}


def _root_redirect(app: Any, error: BaseException | None) -> None:
    """The site's pages keep their repository paths, so the root index.html points at docs/index.html."""
    if error is None and app.builder.format == "html":
        target = f"{root_doc}.html"
        refresh = f'<meta http-equiv="refresh" content="0; url={target}">'
        page = f'<!doctype html>{refresh}<a href="{target}">docs</a>\n'
        (Path(app.outdir) / "index.html").write_text(page, encoding="utf-8")


def setup(app: Any) -> None:
    """Hooks of this site: the root redirect."""
    app.connect("build-finished", _root_redirect)
