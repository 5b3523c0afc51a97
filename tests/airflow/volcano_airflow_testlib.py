"""Helpers shared by the Airflow tests (a uniquely named module: tests/ has several conftests)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

DAGS = Path(__file__).resolve().parents[2] / "dags"


def airflow_bin() -> str:
    """Return the path of the airflow CLI of this environment."""
    return str(Path(sys.executable).with_name("airflow"))


def volcano_conn_json(url: str, service_key: str, **extra: object) -> str:
    """Return a Volcano connection in Airflow's JSON env-var form."""
    return json.dumps({"conn_type": "volcano", "host": url, "password": service_key, "extra": extra})
