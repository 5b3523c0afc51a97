"""Airflow test harness: one private AIRFLOW_HOME with a SQLite metadata DB per session.

Airflow reads its configuration when first imported, so the environment is set here, at
conftest import time, before any test module imports airflow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.helpers import DAGS, airflow_bin, volcano_conn_json

AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="volcano-airflow-home-"))

os.environ.update(
    {
        "AIRFLOW_HOME": str(AIRFLOW_HOME),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME}/airflow.db",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    }
)
os.environ.pop("AIRFLOW_CONN_VOLCANO_DEFAULT", None)

# dag.test() imports Airflow's in-process execution API, whose starlette test client warns about
# its own httpx dependency; that is Airflow's business, not ours, so import it once quietly here
# (the suite turns warnings into errors).
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import airflow.api_fastapi.execution_api.app  # noqa: F401


@pytest.fixture(scope="session")
def airflow_db() -> Iterator[Path]:
    """Migrate the session's SQLite metadata DB once; yield AIRFLOW_HOME."""
    subprocess.run(
        [airflow_bin(), "db", "migrate"],
        check=True,
        capture_output=True,
        env=os.environ.copy(),
        timeout=180,
    )
    # A pristine copy for tests that start their own Airflow processes on a private database.
    shutil.copy(AIRFLOW_HOME / "airflow.db", AIRFLOW_HOME / "airflow.pristine.db")
    yield AIRFLOW_HOME
    shutil.rmtree(AIRFLOW_HOME, ignore_errors=True)


@dataclass(frozen=True)
class VolcanoConn:
    """The connection the tests configured: the server and the exact keys in it."""

    server: Any
    url: str
    service_key: str = field(repr=False)
    anon_key: str = field(repr=False)

    def requests(self) -> list[dict[str, Any]]:
        """The server's recent request log."""
        return list(self.server.requests())


@pytest.fixture(scope="session")
def volcano_keys(volcano_server) -> tuple[str, str]:
    """One service key and one anon key for the session (the harness mints a new one per access)."""
    return volcano_server.service_key, volcano_server.anon_key


@pytest.fixture
def volcano_conn(volcano_server, volcano_keys, monkeypatch: pytest.MonkeyPatch) -> VolcanoConn:
    """Point AIRFLOW_CONN_VOLCANO_DEFAULT at the session's local Volcano server."""
    service_key, anon_key = volcano_keys
    monkeypatch.setenv(
        "AIRFLOW_CONN_VOLCANO_DEFAULT", volcano_conn_json(volcano_server.url, service_key, anon_key=anon_key)
    )
    return VolcanoConn(volcano_server, volcano_server.url, service_key, anon_key)
