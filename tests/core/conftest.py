"""Core fixtures: both clients behind one interface on the session's server, and that server for faults."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from volcano_locks.server.clock import SkewedClock
from volcano_locks.server.harness import InProcessServer, LocalServer

from .helpers import make_client


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


@pytest.fixture
def movable_server() -> Iterator[InProcessServer]:
    """A server of this test's own, in this process, whose clock the test steps (`jump_clock`) instead of
    waiting out a lease for real."""
    with InProcessServer(clock=SkewedClock(), admin=True, quota=1_000_000) as srv:
        yield srv
