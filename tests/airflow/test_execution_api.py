"""The triggerer's in-process Execution API is built when the triggerer starts, not on its first request.

Real Airflow: its plugin manager finds the listener through the package's entry point, and the API built
ahead, its versioned routers generated, is the one the triggerer's supervisor then gets. The whole
triggerer under load (the supervisor answering through it) is ``test_triggerer_stack.py``.
"""

from __future__ import annotations

import sys

import pytest

from airflow_provider_volcano.runtime import execution_api as _execution_api


@pytest.fixture
def builder(monkeypatch: pytest.MonkeyPatch) -> object:
    """Airflow's own builder, put back after the test (prebuild replaces it in this process)."""
    from airflow.jobs import triggerer_job_runner

    original = triggerer_job_runner.in_process_api_server
    monkeypatch.setattr(triggerer_job_runner, "in_process_api_server", original)
    return original


def _listener() -> object:
    from airflow.listeners.listener import get_listener_manager

    found = [p for p in get_listener_manager().pm.get_plugins() if type(p).__name__ == "_PrebuildListener"]
    assert len(found) == 1, "the airflow.plugins entry point did not register the listener"
    return found[0]


def test_outside_a_triggerer_the_listener_builds_nothing(builder: object, monkeypatch) -> None:
    from airflow.jobs import triggerer_job_runner

    monkeypatch.setattr(sys, "argv", ["airflow", "scheduler"])
    _listener().on_starting(component=None)  # type: ignore[attr-defined]
    assert triggerer_job_runner.in_process_api_server is builder


def test_switched_off_the_triggerer_builds_nothing_ahead(builder: object, monkeypatch) -> None:
    from airflow.jobs import triggerer_job_runner

    monkeypatch.setattr(sys, "argv", ["airflow", "triggerer"])
    monkeypatch.setenv(_execution_api.ENV_SWITCH, "0")
    _listener().on_starting(component=None)  # type: ignore[attr-defined]
    assert triggerer_job_runner.in_process_api_server is builder


def test_a_starting_triggerer_gets_its_api_built_ahead_and_the_supervisor_uses_it(
    builder: object, monkeypatch, airflow_db
) -> None:
    from airflow.jobs import triggerer_job_runner

    monkeypatch.setattr(sys, "argv", ["airflow", "triggerer"])
    monkeypatch.delenv(_execution_api.ENV_SWITCH, raising=False)
    _listener().on_starting(component=None)  # type: ignore[attr-defined]
    built = triggerer_job_runner.in_process_api_server
    assert built is not builder
    api = built()
    assert api is built()  # one instance: the supervisor's client gets the app built ahead
    assert api.app._cadwyn_initialized  # its versioned routers exist already
    assert _execution_api.prebuild() is True  # and a second start builds nothing again
    assert triggerer_job_runner.in_process_api_server is built


def test_the_starting_triggerers_job_is_stamped_after_the_build(builder: object, monkeypatch) -> None:
    from datetime import UTC, datetime, timedelta

    from airflow.jobs import triggerer_job_runner

    class Job:  # what the listener reads of the job Airflow is constructing: its first heartbeat
        latest_heartbeat = datetime.now(UTC) - timedelta(seconds=40)

    monkeypatch.setattr(sys, "argv", ["airflow", "triggerer"])
    monkeypatch.delenv(_execution_api.ENV_SWITCH, raising=False)
    before = datetime.now(UTC)
    job = Job()
    _listener().on_starting(component=job)  # type: ignore[attr-defined]
    assert job.latest_heartbeat >= before
    assert triggerer_job_runner.in_process_api_server is not builder
