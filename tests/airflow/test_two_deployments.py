"""Two Airflow installations, one DAG file, one run id, one service key: still two owners.

A scheduled run's id (``scheduled__<date>``) is the same in every deployment of a DAG, so nothing
derived from the task instance's public facts alone may serve as its ownership token. Each
installation here has its own AIRFLOW_HOME and metadata database and runs the daily rollup for
the same day in its own process, with the same run id (``dag.test()`` with ``run_after`` = the
logical date, as a scheduler's run of that interval would have); with ``on_contention="skip"``
exactly one may write the day's rollup.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.airflow.helpers import DAGS
from volcano_locks.fencing import FencedTable

pytestmark = pytest.mark.slow

DAY = "2026-03-01"
RUN = """
import json, sys
from datetime import datetime, timezone
from airflow.dag_processing.dagbag import BundleDagBag
dags, conf = sys.argv[1], json.loads(sys.argv[2])
day = datetime.fromisoformat(sys.argv[3]).replace(tzinfo=timezone.utc)
bag = BundleDagBag(dag_folder=dags, bundle_path=dags, bundle_name="dags-folder")
dr = bag.get_dag("volcano_daily_rollup").test(logical_date=day, run_after=day, run_conf=conf)
print("RESULT", json.dumps({"run_id": dr.run_id, "state": str(dr.state)}))
"""


def _installation(airflow_db: Path, root: Path, name: str, examples_db: Path) -> dict[str, str]:
    home = root / name
    home.mkdir()
    shutil.copy(airflow_db / "airflow.pristine.db", home / "airflow.db")
    shutil.copy(airflow_db / "airflow.cfg", home / "airflow.cfg")
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "VOLCANO_EXAMPLES_DB": str(examples_db),  # the warehouse both deployments write to
    }


def test_two_installations_running_the_same_scheduled_run_are_two_owners(
    airflow_db: Path, volcano_conn, unique_key, tmp_path: Path
) -> None:
    examples_db = tmp_path / "warehouse.sqlite"
    conf = json.dumps({"lock_key": unique_key, "hold_seconds": 15})
    command = [sys.executable, "-c", RUN, str(DAGS), conf, DAY]
    envs = [_installation(airflow_db, tmp_path, name, examples_db) for name in ("east", "west")]

    # Both start together, so both reach their acquisition within a second or two of each other
    # (the same start-up cost); the holder keeps the lock 15 s, far longer than that spread.
    runs = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for env in envs
    ]
    outputs = [run.communicate(timeout=240)[0] for run in runs]
    for run, out in zip(runs, outputs, strict=True):
        assert run.returncode == 0, out[-3000:]
    results = [json.loads(out.split("RESULT ", 1)[1].splitlines()[0]) for out in outputs]
    assert results[0]["run_id"] == results[1]["run_id"] == f"manual__{DAY}T00:00:00+00:00", results
    assert [r["state"] for r in results] == ["success", "success"], results
    holders = [out for out in outputs if "Holding lock" in out]
    skippers = [out for out in outputs if "skipping (on_contention='skip')" in out]
    assert len(holders) == 1 and len(skippers) == 1, [out[-2000:] for out in outputs]
    # Exactly one rollup was written, by the first installation's lease.
    writes = FencedTable(str(examples_db)).history(f"rollup:{DAY}")
    assert len(writes) == 1 and writes[0].accepted, writes
    # The server saw two different owners on the key (one refused), not one owner twice.
    on_key = [
        r for r in volcano_conn.requests() if unique_key in r.get("path", "") and r.get("op") == "acquire"
    ]
    by_owner: dict[str, list[int]] = {}
    for r in on_key:
        by_owner.setdefault(r["token_sha256"], []).append(r["status"])
    assert sorted(by_owner.values()) == [[201], [409]], by_owner
    for out in outputs:
        assert volcano_conn.service_key not in out
