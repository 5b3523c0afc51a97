"""Small helpers for the core tests: scripted replies for sans-I/O flows, leases, both clients as one."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from volcano_locks import AsyncVolcanoLocks, VolcanoLocks
from volcano_locks.errors import TransportError
from volcano_locks.models import ABSOLUTE_LEASE_SECONDS, LockLease
from volcano_locks.protocol import Call, Flow, Reply
from volcano_locks.server.harness import LocalServer

TOKEN = "3f0e8d1c-6a1b-4c2d-9e8f-0a1b2c3d4e5f"
REQUEST_ID = "AA0E8D1C-6A1B-4C2D-9E8F-0A1B2C3D4E5F"
EXPIRES = "2026-11-29T10:00:30.123456789Z"


def reply(
    status: int,
    body: object = None,
    *,
    headers: dict[str, str] | None = None,
    sent_at: float = 100.0,
    raw: bytes | None = None,
) -> Reply:
    """A reply as the shells build it."""
    content = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
    return Reply(status, headers or {}, content, sent_at, datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC))


def run_flow(flow: Flow[object], outcomes: Sequence[Reply | TransportError]) -> tuple[object, list[Call]]:
    """Drive ``flow`` with the scripted outcomes; return its result and the calls it made."""
    calls: list[Call] = []
    pending = list(outcomes)
    try:
        call = next(flow)
        while True:
            calls.append(call)
            outcome = pending.pop(0)
            call = flow.throw(outcome) if isinstance(outcome, TransportError) else flow.send(outcome)
    except StopIteration as stop:
        return stop.value, calls


def lease(
    *,
    key: str = "k",
    ttl: int = 30,
    sent: float = 0.0,
    absolute: float | None = None,
    fencing: int = 7,
    token: str = TOKEN,
) -> LockLease:
    """A lease whose successful request was sent at monotonic ``sent``."""
    absolute = sent + ABSOLUTE_LEASE_SECONDS if absolute is None else absolute
    now = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
    return LockLease(
        key, token, now + timedelta(seconds=ttl), fencing, ttl, now, min(sent + ttl, absolute), absolute
    )


class SyncView:
    """Runs an AsyncVolcanoLocks' coroutines on a private loop, so one test body covers both clients."""

    def __init__(self, client: AsyncVolcanoLocks, runner: asyncio.Runner) -> None:
        self._client = client
        self._runner = runner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if inspect.iscoroutinefunction(attr):
            return lambda *args, **kwargs: self._runner.run(attr(*args, **kwargs))
        return attr


def make_client(kind: str, url: str, key: str, **kwargs: Any) -> tuple[Any, Any]:
    """Return (client-as-sync, closer) for kind "sync" or "async"."""
    if kind == "sync":
        client = VolcanoLocks(url, service_key=key, **kwargs)
        return client, client.close
    runner = asyncio.Runner()
    aclient = AsyncVolcanoLocks(url, service_key=key, **kwargs)

    def close() -> None:
        runner.run(aclient.aclose())
        runner.close()

    return SyncView(aclient, runner), close


def requests_for(server: LocalServer, request_id: str) -> list[dict[str, Any]]:
    """The server's log entries for one request id."""
    return [r for r in server.requests() if r.get("request_id") == request_id]
