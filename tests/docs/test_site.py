"""The built docs site: an API reference for every exported name, diagrams drawn, nothing loaded from outside.

The site is built once per session with `make docs` into a temporary directory (about half a minute), then
every page is opened in Debian's chromium with every request recorded.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.docs.helpers import REPO
from tests.support.newcomer import make

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
# Each package's exports and the reference page that must document all of them.
REFERENCE = {
    "volcano_locks": "core",
    "volcano_locks.fencing": "fencing",
    "airflow_provider_volcano": "airflow",
    "prefect_volcano": "prefect",
}
LOCAL_SCHEMES = {"file", "data", "about", "blob"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`make docs` into a temporary directory; the built site's root."""
    out = tmp_path_factory.mktemp("site") / "html"
    make("docs", timeout=600, DOCS_OUT=str(out))
    return out


def test_the_reference_documents_every_name_each_package_exports(site: Path) -> None:
    for package, page in REFERENCE.items():
        # The Airflow package's __all__ is importable without Airflow: its exports are imported lazily.
        exported = importlib.import_module(package).__all__
        html = (site / "docs" / "reference" / f"{page}.html").read_text(encoding="utf-8")
        ids = set(re.findall(r'<dt class="sig sig-object py" id="([^"]+)"', html))
        missing = [name for name in exported if f"{package}.{name}" not in ids]
        assert not missing, f"{page}.html lacks {missing}"
    index = (site / "genindex.html").read_text(encoding="utf-8")
    for name in ("VolcanoLocks", "OwnershipLost", "FencedSQL", "VolcanoCredentials", "locked_task"):
        assert f">{name}" in index or f"{name} (" in index, f"{name} is not in the index"


def test_diagrams_are_drawn_into_the_page_not_by_a_script(site: Path) -> None:
    html = (site / "docs" / "behaviour.html").read_text(encoding="utf-8")
    figure = re.search(
        r'<figure class="diagram" role="img"[^>]*><div[^>]*><svg .*?</svg></div></figure>', html, flags=re.S
    )
    assert figure, "the sequence diagram of behaviour.md is not an inline SVG"
    assert "worker A (holder)" in figure.group(0) and "late write with fencing token 7" in figure.group(0)
    assert "mermaid.min.js" not in html and "```mermaid" not in html


def test_no_page_loads_anything_from_outside_the_site(site: Path) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        pytest.skip(f"no chromium at {CHROMIUM} (.ci/run installs Debian's)")
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20, pages
    outside: dict[str, set[str]] = {}
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            context = browser.new_context()
            current = {"page": ""}

            def record(route: object) -> None:
                url = route.request.url  # type: ignore[attr-defined]
                if urlsplit(url).scheme not in LOCAL_SCHEMES:
                    outside.setdefault(current["page"], set()).add(url)
                    route.abort()  # type: ignore[attr-defined]
                else:
                    route.continue_()  # type: ignore[attr-defined]

            context.route("**/*", record)
            page = context.new_page()
            for path in pages:
                current["page"] = str(path.relative_to(site))
                page.goto(path.as_uri(), wait_until="load")
        finally:
            browser.close()
    assert outside == {}


def test_a_missing_docstring_fails_the_build(tmp_path: Path) -> None:
    """The reference's check itself, on a package with one undocumented export, built with -W as make docs."""
    package = tmp_path / "sample_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            '''
            """A package with one documented and one bare export."""

            __all__ = ["documented", "bare", "LIMIT"]

            LIMIT = 3
            """The largest number of things."""


            def documented() -> None:
                """Do the documented thing."""


            def bare() -> None:
                pass
            '''
        ),
        encoding="utf-8",
    )
    (tmp_path / "conf.py").write_text(
        f"import sys\nsys.path[:0] = [{str(tmp_path)!r}, {str(REPO / 'docs' / '_ext')!r}]\n"
        'extensions = ["sphinx.ext.autodoc", "apiref"]\nnitpicky = True\n',
        encoding="utf-8",
    )
    (tmp_path / "index.rst").write_text("Sample\n======\n\n.. api-reference:: sample_pkg\n", encoding="utf-8")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-E",
            "-W",
            "-q",
            "-b",
            "html",
            str(tmp_path),
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode != 0
    assert "sample_pkg.bare has no docstring" in done.stderr, done.stderr
    assert "documented" not in done.stderr and "LIMIT" not in done.stderr, done.stderr
