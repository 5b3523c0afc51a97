"""Packaging fixtures: `make dist` once per session into a temporary directory; install times in the summary.

No ``__init__.py`` here on purpose: a package named ``packaging`` would shadow the real one for the whole
session. The helpers live in `helpers`.
"""

from __future__ import annotations

import pytest

from tests.packaging.helpers import PIP_INSTALL_PROPERTY, Dist
from tests.support.newcomer import make


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """`make dist` into a temporary directory (never the checkout's dist/), then what it made."""
    out = tmp_path_factory.mktemp("dist")
    make("dist", timeout=600, DIST_DIR=str(out))  # a hang catcher (it runs at low priority)
    wheels = sorted(out.glob("volcano_locks-*-py3-none-any.whl"))
    sdists = sorted(out.glob("volcano_locks-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return Dist(out, wheels[0], sdists[0])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print how long each pip install took (recorded as a test property), so a `make test` log shows it."""
    lines = [
        str(value)
        for outcome in ("passed", "failed")
        for report in terminalreporter.stats.get(outcome, [])
        for name, value in getattr(report, "user_properties", [])
        if name == PIP_INSTALL_PROPERTY
    ]
    if lines:
        terminalreporter.section("packaging")
        for line in lines:
            terminalreporter.write_line(line)
