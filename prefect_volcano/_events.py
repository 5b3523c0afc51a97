"""Prefect events for a lock's life as one run sees it: waiting, acquired, released, lost, skipped, lapsed.

The lock is the event's resource (`volcano.lock.<project>/<key>`: locks are scoped to a Volcano
project, and two projects may use one lock name); the flow run and task run that hold or want it
are related resources, so the Event Feed shows who held which lock when, and an
automation can match `volcano.lock.lost`. Payloads carry public facts only: the fencing token,
TTL, expiry and the loss's reason and code; never the service key or an ownership token.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from prefect.context import FlowRunContext, TaskRunContext
from prefect.events import Event, emit_event

__all__ = [
    "LOCK_EVENTS",
    "LOCK_RESOURCE_PREFIX",
    "LockEvents",
    "lock_resource_id",
]

LOCK_RESOURCE_PREFIX = "volcano.lock."
"""Every lock resource id starts with this; the lock key follows."""

LOCK_EVENTS = ("waiting", "acquired", "released", "lapsing", "lost", "skipped", "lapsed", "duplicate")
"""What is emitted, as `volcano.lock.<what>`."""

logger = logging.getLogger("prefect_volcano.events")


def lock_resource_id(key: str, project: str) -> str:
    """The Prefect resource id of lock `key` of Volcano project `project` (`volcano.lock.<project>/<key>`).

    A lock key never contains `/`, so the id names one lock of one project.
    """
    return f"{LOCK_RESOURCE_PREFIX}{project}/{key}"


def _public_url(api_url: str) -> str:
    # A URL may carry userinfo; the event must not.
    parts = urlsplit(api_url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _run_related() -> list[dict[str, str]]:
    """The flow run and task run of the current context, as related resources."""
    related: list[dict[str, str]] = []
    flow_ctx = FlowRunContext.get()
    task_ctx = TaskRunContext.get()
    flow_run = getattr(flow_ctx, "flow_run", None)
    if flow_run is not None:
        related.append(
            {
                "prefect.resource.id": f"prefect.flow-run.{flow_run.id}",
                "prefect.resource.role": "flow-run",
                "prefect.resource.name": flow_run.name,
            }
        )
    task_run = getattr(task_ctx, "task_run", None)
    if task_run is not None:
        if flow_run is None and task_run.flow_run_id is not None:
            related.append(
                {
                    "prefect.resource.id": f"prefect.flow-run.{task_run.flow_run_id}",
                    "prefect.resource.role": "flow-run",
                }
            )
        related.append(
            {
                "prefect.resource.id": f"prefect.task-run.{task_run.id}",
                "prefect.resource.role": "task-run",
                "prefect.resource.name": task_run.name,
            }
        )
    return related


class LockEvents:
    """Emits one run's lock events; build it in the run's own thread (it reads the run context).

    Emitting is best effort and never blocks the lock: Prefect's events worker sends in the
    background, and a failure to emit is logged by Prefect, not raised here.
    """

    def __init__(self, key: str, api_url: str, project: str) -> None:
        self._resource = {
            "prefect.resource.id": lock_resource_id(key, project),
            "prefect.resource.name": key,
            "volcano.lock.key": key,
            "volcano.project": project,
            "volcano.api-url": _public_url(api_url),
        }
        self._open = True
        # Read now: the keeper thread that reports a loss has no run context of its own.
        self._related = _run_related()
        self._last: Event | None = None

    @property
    def runner(self) -> str | None:
        """The resource id of the run these events speak for: its task run, else its flow run."""
        for role in ("task-run", "flow-run"):
            for related in self._related:
                if related["prefect.resource.role"] == role:
                    return related["prefect.resource.id"]
        return None

    def emit(
        self,
        what: str,
        extra_related: list[dict[str, str]] | None = None,
        occurred: datetime | None = None,
        **payload: Any,
    ) -> datetime | None:
        """Emit `volcano.lock.<what>` with the given public facts as its payload (and more related runs).

        Each event follows the one before it, unless `occurred` dates it earlier (a lapse found after
        the acquisition it precedes): that one stands apart. Returns when the event occurred (None
        when Prefect emits nothing, as outside a configured API, or once the run is over: `close`).
        """
        if not self._open:
            return None
        event = emit_event(
            f"{LOCK_RESOURCE_PREFIX}{what}",
            resource=self._resource,
            related=self._related + (extra_related or []),
            payload={k: v for k, v in payload.items() if v is not None},
            occurred=occurred,
            follows=None if occurred is not None else self._last,
        )
        if event is None:
            return None
        if occurred is None:
            self._last = event
        return event.occurred

    def close(self) -> None:
        """The run is over: what would be emitted from now on is dropped quietly (the run's events
        worker may be gone, and Prefect would log an error for it)."""
        self._open = False
