"""Prefect test fixtures: one Prefect test harness per session, under a private PREFECT_HOME.

ASYNC_FLOWS: an async flow without its own `result_storage` makes Prefect 3.9 ask the server for
the default result storage through a sync client it never closes (results.py,
`_read_server_default_result_storage_block_id`); under `filterwarnings = error` the leaked socket
fails whichever test collects it. The tests' async flows therefore pass `result_storage=tmp_path`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Before Prefect reads its settings: nothing from ~/.prefect (profiles, cached results) may leak in,
# and what the suite writes (result storage, memo store) stays where the secret scans can read it.
_HOME = Path(tempfile.mkdtemp(prefix="prefect-volcano-home-"))
os.environ["PREFECT_HOME"] = str(_HOME)
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"  # no telemetry calls from the test server

from prefect.settings import (  # noqa: E402
    PREFECT_API_URL,
    PREFECT_HOME,
    PREFECT_LOCAL_STORAGE_PATH,
    temporary_settings,
)
from prefect.testing.utilities import prefect_test_harness  # noqa: E402

from prefect_volcano import VolcanoCredentials  # noqa: E402


@pytest.fixture(scope="session")
def prefect_home() -> Path:
    """The private PREFECT_HOME of this test session (results are stored under its storage/)."""
    return _HOME


@pytest.fixture(scope="session", autouse=True)
def prefect_harness(prefect_home: Path) -> Iterator[str]:
    """One Prefect test server (temporary database) for the whole session; yields its API URL."""
    storage = prefect_home / "storage"
    settings = {PREFECT_HOME: prefect_home, PREFECT_LOCAL_STORAGE_PATH: storage}
    # 300 s: a hang catcher (at make test's start every lane starts its servers at once on two cores).
    with temporary_settings(updates=settings), prefect_test_harness(server_startup_timeout=300):
        yield str(PREFECT_API_URL.value())
    shutil.rmtree(prefect_home, ignore_errors=True)


@pytest.fixture
def volcano_env(volcano_server: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Point the VOLCANO_* environment (credentials=None) at the local server."""
    env: dict[str, str] = volcano_server.env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def credentials(volcano_server: Any) -> VolcanoCredentials:
    """An unsaved block for the local server."""
    return VolcanoCredentials(
        api_url=volcano_server.url,
        service_key=volcano_server.service_key,
        anon_key=volcano_server.anon_key,
    )


@pytest.fixture
def prefect_subprocess_env(prefect_harness: str, prefect_home: Path, volcano_server: Any) -> dict[str, str]:
    """Environment for a child process running flows against this session's harness and lock server."""
    env = dict(os.environ)
    env.update(volcano_server.env())
    env["PREFECT_API_URL"] = prefect_harness
    env["PREFECT_HOME"] = str(prefect_home)
    env["PREFECT_LOCAL_STORAGE_PATH"] = str(prefect_home / "storage")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")) if p
    )
    return env
