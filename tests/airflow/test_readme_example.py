"""The README's Airflow example, as written there: its connection variable and its DAG, run with dag.test().

The DAG is the README's block in a file of its own (Airflow finds it as it finds any DAG file), with the
user's ``write_rollup`` defined above it to record what it was handed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.docs.helpers import python_block, shell_commands
from volcano_locks import VolcanoLocks

_WRITE_ROLLUP = """\
import json as _json
import os as _os


def write_rollup(day, fencing_token):  # the user's own write; here it records what it was handed
    with open(_os.environ["README_ROLLUPS"], "a") as out:
        out.write(_json.dumps({"day": day, "fencing_token": fencing_token}) + "\\n")

"""


def readme_connection(api_url: str, service_key: str) -> dict:
    """What the README's ``export AIRFLOW_CONN_VOLCANO_DEFAULT=...`` sets, run by bash in a shell that has
    the ``VOLCANO_*`` variables `volcano-locks serve` printed."""
    (line,) = [c for c in shell_commands() if c.startswith("export AIRFLOW_CONN_VOLCANO_DEFAULT=")]
    done = subprocess.run(
        ["bash", "-c", f'{line}\nprintf %s "$AIRFLOW_CONN_VOLCANO_DEFAULT"'],
        env={"PATH": os.environ["PATH"], "VOLCANO_API_URL": api_url, "VOLCANO_SERVICE_KEY": service_key},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(done.stdout)


def test_the_readme_dag_holds_daily_rollup_through_the_readme_connection(
    volcano_server, volcano_keys, airflow_db, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db

    service_key, anon_key = volcano_keys
    conn = readme_connection(volcano_server.url, service_key)
    assert conn == {"conn_type": "volcano", "host": volcano_server.url, "password": service_key}
    monkeypatch.setenv("AIRFLOW_CONN_VOLCANO_DEFAULT", json.dumps(conn))
    rollups = tmp_path / "rollups.jsonl"
    monkeypatch.setenv("README_ROLLUPS", str(rollups))
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "readme_dag.py").write_text(
        _WRITE_ROLLUP + python_block("VolcanoLockOperator("), encoding="utf-8"
    )

    bag = BundleDagBag(dag_folder=str(folder), bundle_path=folder, bundle_name="dags-folder")
    assert bag.import_errors == {} and bag.dag_ids == ["daily_rollup"]
    dag = bag.get_dag("daily_rollup")
    assert dag.start_date.tzinfo is not None and dag.start_date.utcoffset().total_seconds() == 0

    # Stored as the dag processor would store it (under the configured bundle): dag.test() runs that.
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(bag, "dags-folder", None)
    dr = dag.test()
    assert dr.state == "success"
    (written,) = [json.loads(line) for line in rollups.read_text().splitlines()]
    assert written["day"] == f"{dr.logical_date:%Y-%m-%d}" and written["fencing_token"] >= 1
    with VolcanoLocks(volcano_server.url, anon_key, service_key) as client:
        assert not client.get("daily-rollup").held  # released after the task
