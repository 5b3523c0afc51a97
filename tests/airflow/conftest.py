"""Airflow test harness: one private AIRFLOW_HOME with a SQLite metadata DB per session.

Airflow reads its configuration when first imported, so the environment is set here, at
conftest import time, before any test module imports airflow.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from volcano_airflow_testlib import volcano_conn_json

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
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


def airflow_bin() -> str:
    """Return the path of the airflow CLI of this environment."""
    return str(Path(sys.executable).with_name("airflow"))


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
    yield AIRFLOW_HOME
    shutil.rmtree(AIRFLOW_HOME, ignore_errors=True)


@pytest.fixture
def volcano_conn(volcano_server, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Point AIRFLOW_CONN_VOLCANO_DEFAULT at the session's local Volcano server."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_VOLCANO_DEFAULT",
        volcano_conn_json(volcano_server.url, volcano_server.service_key, anon_key=volcano_server.anon_key),
    )
    return volcano_server
