"""Which API-server requests make the plugin's middleware look at the handoff records (issue 28).

The whole path (a clear or a mark through the REST API freeing the lease in the API server) runs on the
full stack in ``tests/airflow/test_waits_stack.py``; here, which requests may have ended a task try.
"""

from __future__ import annotations

import pytest

from airflow_provider_volcano.plugins.actions import acted_on


@pytest.mark.parametrize(
    ("method", "path", "dag_id"),
    [
        ("POST", "/api/v2/dags/etl/clearTaskInstances", "etl"),
        ("POST", "/api/v2/dags/etl/dagRuns/manual__1/clear", "etl"),
        ("PATCH", "/api/v2/dags/etl/dagRuns/manual__1/taskInstances/load", "etl"),
        ("PATCH", "/api/v2/dags/etl/dagRuns/manual__1/taskInstances/load/3", "etl"),
        ("PATCH", "/api/v2/dags/etl/dagRuns/manual__1/taskInstances", "etl"),
        ("PATCH", "/api/v2/dags/etl/dagRuns/manual__1", "etl"),
        ("PATCH", "/api/v2/dags/~/dagRuns/~/taskInstances", "~"),
        ("PATCH", "/airflow/api/v2/dags/etl/dagRuns/r/taskInstances/t", "etl"),  # under a base URL
    ],
)
def test_a_clear_or_a_state_set_is_an_action_on_its_dag(method: str, path: str, dag_id: str) -> None:
    assert acted_on(method, path) == dag_id


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v2/dags/etl/dagRuns/manual__1/taskInstances/load"),
        ("POST", "/api/v2/dags/~/dagRuns/~/taskInstances/list"),  # a listing sent as POST
        ("PATCH", "/api/v2/dags/etl"),  # pausing a DAG ends no try
        ("POST", "/api/v2/dags/etl/dagRuns"),  # triggering a run
        ("POST", "/api/v2/variables"),
        ("PUT", "/execution/task-instances/0190-aa/state"),  # a worker's own report
    ],
)
def test_reads_triggers_and_workers_reports_are_not(method: str, path: str) -> None:
    assert acted_on(method, path) is None
