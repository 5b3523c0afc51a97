"""Core fixtures: both clients behind one interface, pointed at the session's local server."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from typing import Any

import pytest

from volcano_locks import AsyncVolcanoLocks, VolcanoLocks
from volcano_locks.server.harness import LocalServer


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


@pytest.fixture(params=["sync", "async"])
def client(request: pytest.FixtureRequest, volcano_server: LocalServer) -> Iterator[Any]:
    """A client of each kind (the async one driven through SyncView)."""
    view, close = make_client(request.param, volcano_server.url, volcano_server.service_key)
    try:
        yield view
    finally:
        close()


@pytest.fixture
def admin_server(volcano_server: LocalServer) -> Iterator[LocalServer]:
    """The session server, with faults cleared again after the test."""
    try:
        yield volcano_server
    finally:
        volcano_server.set_faults(None)


def requests_for(server: LocalServer, request_id: str) -> list[dict[str, Any]]:
    """The server's log entries for one request id."""
    return [r for r in server.requests() if r.get("request_id") == request_id]
