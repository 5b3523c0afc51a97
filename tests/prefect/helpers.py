"""Helpers shared by the Prefect tests: locked tasks and flows to run, and what their runs left behind."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.events import Event
from prefect.events.filters import EventFilter, EventResourceFilter
from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.states import State

from prefect_volcano import VolcanoCredentials, current_lease, lock_resource_id, locked_task
from volcano_locks import VolcanoLocks

FLOWS_DIR = Path(__file__).resolve().parents[2] / "flows"

# What a lock event's payload may hold: facts, never a secret.
PUBLIC_PAYLOAD = {
    "fencing_token",
    "ttl",
    "expires_at",
    "holder_fencing_token",
    "reason",
    "code",
    "force_released",
    *(
        f"previous_{fact}"
        for fact in ("fencing_token", "flow_run_id", "flow_run_name", "task_run_id", "expires_at")
    ),
    "how",
}


def load_flow_module(stem: str) -> ModuleType:
    """Import flows/<stem>.py (a folder of scripts, not a package) once, as the module `flows_<stem>`."""
    name = f"flows_{stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, FLOWS_DIR / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@contextmanager
def prefect_server(
    home: Path,
    *,
    services: bool = True,
    database_url: str | None = None,
    start_timeout: float = 120.0,
    log: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """A real ``prefect server start`` (with its UI) on a free loopback port; yields its base URL.

    Its home and SQLite database are in ``home`` (``database_url``: another database, e.g.
    ``postgresql+asyncpg://...``). ``services=False`` runs none of the server's background services
    (the lease repossessor among them). ``log``: a file for the server's output (else it is dropped).
    ``extra_env``: more settings for the server (e.g. its database pool).
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    base = f"http://127.0.0.1:{port}"
    env = dict(
        os.environ,
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_API_DATABASE_CONNECTION_URL=database_url or f"sqlite+aiosqlite:///{home / 'prefect.db'}",
        PREFECT_API_URL=f"{base}/api",
        PREFECT_UI_API_URL=f"{base}/api",
        **(extra_env or {}),
    )
    prefect = str(Path(sys.executable).with_name("prefect"))
    command = [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115 (closed below)
    server = subprocess.Popen(
        [*command, *([] if services else ["--no-services"])],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                if httpx.get(f"{base}/api/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prefect server did not start (exit code {server.poll()})")
            time.sleep(0.5)
        yield base
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        if log is not None:
            out.close()  # type: ignore[union-attr]


def release_once_waiting(server: Any, holder: VolcanoLocks, key: str, lease: Any) -> threading.Thread:
    """Release ``lease`` (held by ``holder``) from a thread once a task's attempt on ``key`` was refused
    and its engine has looked at the lock (the look that names the holder for the waiting report and
    event). A fixed delay lost the race with a flow's start on a busy machine. Join it after the flow."""

    def looked() -> bool:
        ops = [r.get("op") for r in server.requests() if key in r.get("path", "")]
        return "acquire" in ops[1:] and "get" in ops

    def release() -> None:
        deadline = time.monotonic() + 60  # a hang catcher: a flow starts in seconds, not a minute
        while not looked() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        holder.release(key, lease)

    thread = threading.Thread(target=release, name="release-once-waiting")
    thread.start()
    return thread


def token_task(key: str, **options: Any) -> Any:
    """A task under ``locked_task(key, **options)`` that returns the fencing token of its lease."""

    @task
    @locked_task(key, **options)
    def hold() -> int:
        return current_lease().fencing_token

    return hold


def token_flow(key: str, **options: Any) -> Callable[[], int]:
    """A flow that runs ``token_task(key, **options)`` once and returns the fencing token it held."""
    hold = token_task(key, **options)

    @flow
    def run_hold() -> int:
        return int(hold())

    return run_hold


FLOW_WENT_ON = "flow went on"


def collecting_flow(job: Any) -> tuple[Callable[[], str], list[State[Any]]]:
    """A flow that calls the task ``job`` once per run, and the list that keeps each call's final state.

    The flow returns ``FLOW_WENT_ON`` after the call, whatever became of the task run.
    """
    states: list[State[Any]] = []

    @flow
    def run_job() -> str:
        states.append(job(return_state=True))
        return FLOW_WENT_ON

    return run_job, states


def assert_failed_with(state: State[Any], error: type[BaseException], match: str | None = None) -> None:
    """``state`` is a failed run whose result raises ``error`` (its message matching ``match``)."""
    assert state.is_failed(), state
    with pytest.raises(error, match=match):
        state.result()


def force_release_when(started: threading.Event, key: str) -> threading.Thread:
    """A thread that force-releases ``key`` as soon as ``started`` is set (within 30 s)."""

    def breaker() -> None:
        if started.wait(30):
            with VolcanoLocks() as admin:
                admin.force_release(key)

    thread = threading.Thread(target=breaker, daemon=True)
    thread.start()
    return thread


def run_logs(state: State[Any]) -> str:
    """The log messages of the flow run a flow's or a task's state belongs to, read from the Prefect API."""
    APILogWorker.drain_all(timeout=10)
    with get_client(sync_client=True) as client:
        details = state.state_details
        flow_run_id = (
            details.flow_run_id
            if details.task_run_id is None
            else client.read_task_run(details.task_run_id).flow_run_id
        )
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(log.message for log in logs)


PROJECT = "local"
"""The Volcano project of the local server's default keys (`LocalServer.project`)."""


def lock_events(key: str, names: list[str], timeout: float = 30.0, project: str = PROJECT) -> list[Event]:
    """The events of lock `key`, oldest first, once every name in `names` has arrived (bounded wait)."""
    EventsWorker.drain_all(timeout=10)
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_events(
                EventFilter(resource=EventResourceFilter(id=[lock_resource_id(key, project)])), limit=50
            )
            events = sorted(page.events, key=lambda e: e.occurred)
            seen = [e.event for e in events]
            if all(f"volcano.lock.{n}" in seen for n in names) or time.monotonic() > deadline:
                return events
            time.sleep(0.25)


def related_ids(event: Event, role: str) -> list[str]:
    """The ids of the resources related to ``event`` in ``role``."""
    return [r.id for r in event.related if r.role == role]


def assert_no_secret(events: list[Event], credentials: VolcanoCredentials) -> None:
    """No key of ``credentials`` in ``events``, and their payloads hold public facts only."""
    text = json.dumps([e.model_dump(mode="json") for e in events])
    assert credentials.service_key.get_secret_value() not in text
    assert credentials.anon_key is not None and credentials.anon_key.get_secret_value() not in text
    for event in events:
        assert set(event.payload) <= PUBLIC_PAYLOAD, event.payload
