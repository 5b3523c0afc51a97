"""The triggerer's in-process Execution API, built when the triggerer starts, not on its first request.

A triggerer is two processes: a supervisor (one thread: it heartbeats, assigns triggers, persists their
events and answers the trigger runner's requests) and the trigger runner (the event loop the triggers
run in). The supervisor answers the runner's Variable, connection, XCom and task-state requests through
an in-process copy of Airflow's Execution API, which Airflow builds lazily, on that one thread, at the
first such request: imports, the FastAPI app, and cadwyn's versioned routers for every API version. That
takes about 3-8 s on a quiet two-core machine and 30-100 s on a busy one. Meanwhile the supervisor
neither heartbeats nor reads the runner's messages nor persists any trigger's event: a lock trigger that
acquired its lock cannot hand it over, and past ``[triggerer] runner_health_check_threshold`` (30 s)
Airflow logs "TriggerRunner subprocess event loop appears deadlocked", stops heartbeating and its
triggers are moved to another triggerer (which may be just as cold). A ``VolcanoLockTrigger`` makes that
first request at once (its handoff watch reads the lock's handoff record), so every fresh triggerer
stalled on its first lock triggers (issue 28; py-spy of the supervisor shows its main thread in
``InProcessExecutionAPI.app`` and cadwyn's ``_cadwyn_initialize`` for the whole stall).

:class:`TriggererPrebuildPlugin` (an ``airflow.plugins`` entry point: Airflow loads those in every
component, whatever ``[core] lazy_discover_providers`` says) registers a listener whose ``on_starting``
builds that API in the ``airflow triggerer`` process before the triggerer's job exists (Airflow calls
``on_starting`` while it constructs the job; other components return at once): a triggerer takes no
trigger until it can answer them. The supervisor then gets the instance
built here from ``triggerer_job_runner.in_process_api_server`` (the one function Airflow 3.1 to 3.3 build
it with); its transport (a thread and an event loop) is still started by the supervisor itself, after
it has forked the trigger runner. Where that function is missing (a newer Airflow that builds the API
differently), nothing is changed: Airflow builds it as before. ``VOLCANO_TRIGGERER_PREBUILD=0`` turns it
off.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from datetime import UTC, datetime
from typing import Any

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

__all__ = ["ENV_SWITCH", "TriggererPrebuildPlugin", "prebuild"]

log = logging.getLogger(__name__)

ENV_SWITCH = "VOLCANO_TRIGGERER_PREBUILD"
_PREBUILT = "_volcano_prebuilt"  # marks the replacement of Airflow's builder (built once per process)


def _in_triggerer() -> bool:
    """Whether this process is ``airflow triggerer`` (the only component whose start needs the API)."""
    return sys.argv[1:2] == ["triggerer"]


class _PrebuildListener:
    """The listener: Airflow calls ``on_starting`` in every component it starts."""

    @hookimpl
    def on_starting(self, component: Any) -> None:
        """Build the triggerer's in-process Execution API before the triggerer's job starts."""
        if not _in_triggerer() or os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no"):
            return
        try:
            prebuild()
        except Exception:  # the triggerer still works, building the API on its first request as before
            log.exception(
                "Could not build the triggerer's Execution API ahead; Airflow builds it on first use"
            )
        if hasattr(component, "latest_heartbeat"):
            # Airflow stamped the job's first heartbeat before calling us: stamped after the build, the
            # new triggerer looks healthy from its start, not "recovered after" the build's length.
            component.latest_heartbeat = datetime.now(UTC)


class TriggererPrebuildPlugin(AirflowPlugin):
    """Registers the listener that builds a triggerer's in-process Execution API when the triggerer starts."""

    name = "volcano_locks_triggerer_prebuild"
    listeners = [_PrebuildListener()]  # noqa: RUF012


def prebuild() -> bool:
    """Build the in-process Execution API now and make the triggerer's supervisor use that instance.

    :return: whether the supervisor will use a prebuilt API (``False``: this Airflow builds it its way).
    """
    try:
        from airflow.jobs import triggerer_job_runner as runner
    except ImportError:
        return False
    build = getattr(runner, "in_process_api_server", None)
    if build is None:
        return False
    if getattr(build, _PREBUILT, False):
        return True
    started = time.monotonic()
    api = build()
    _initialise(api.app)

    def prebuilt() -> Any:
        return api

    setattr(prebuilt, _PREBUILT, True)
    runner.in_process_api_server = prebuilt
    log.info(
        "Built the triggerer's in-process Execution API in %.1f s, before taking triggers "
        "(Airflow would build it on its first trigger request, blocking its supervisor meanwhile)",
        time.monotonic() - started,
    )
    return True


def _initialise(app: Any) -> None:
    """Send the app one request: cadwyn generates its versioned routers on the first call it gets."""
    import httpx

    async def one_request() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://in-process.invalid") as client:
            await client.get("/volcano-locks-prebuild")  # any path: a 404 once the routers exist

    asyncio.run(one_request())
