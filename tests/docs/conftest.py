"""Fixtures for the tests that run the README's and the docs' snippets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from volcano_locks.server import LocalServer


@pytest.fixture
def readme_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalServer]:
    """A server of its own (the README uses the fixed key daily-report) and the VOLCANO_* variables."""
    with LocalServer(db=str(tmp_path / "readme.sqlite3")) as srv:
        for name, value in srv.env().items():
            monkeypatch.setenv(name, value)
        yield srv
