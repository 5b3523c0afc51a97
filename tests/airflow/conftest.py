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
from pathlib import Path

import pytest

from tests.airflow.helpers import DAGS, VolcanoConn, airflow_bin, volcano_conn_json
from volcano_locks import VolcanoLocks

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


@pytest.fixture(scope="session")
def volcano_keys(volcano_server) -> tuple[str, str]:
    """One service key and one anon key for the session (the harness mints a new one per access)."""
    return volcano_server.service_key, volcano_server.anon_key


@pytest.fixture(scope="session")
def session_conn(volcano_server, volcano_keys) -> VolcanoConn:
    """The session's local Volcano server and keys, for module-scoped stacks (``helpers.dag_stack``)."""
    service_key, anon_key = volcano_keys
    return VolcanoConn(volcano_server, volcano_server.url, service_key, anon_key)


@pytest.fixture
def volcano_conn(session_conn: VolcanoConn, monkeypatch: pytest.MonkeyPatch) -> VolcanoConn:
    """Point AIRFLOW_CONN_VOLCANO_DEFAULT at the session's local Volcano server."""
    conn = session_conn
    monkeypatch.setenv(
        "AIRFLOW_CONN_VOLCANO_DEFAULT", volcano_conn_json(conn.url, conn.service_key, anon_key=conn.anon_key)
    )
    return conn


@pytest.fixture
def outside(volcano_conn: VolcanoConn) -> Iterator[VolcanoLocks]:
    """A core client on the same server and keys, holding and reading locks from outside Airflow."""
    with VolcanoLocks(volcano_conn.url, volcano_conn.anon_key, volcano_conn.service_key) as client:
        yield client
