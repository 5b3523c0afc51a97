"""The model checker against a real server that breaks the contract on purpose (the `grant_held` fault):
the same calls through real clients, checked once against the honest server and once against the broken
one. Only the broken one's history is a violation, and the report says which grant no order explains."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from volcano_locks import LockContention, OwnershipLost, VolcanoLocks
from volcano_locks.server.harness import LocalServer

from .history import RecordingTransport, load_ops, read_calls, read_server_history
from .linearizability import Verdict, check_ops

pytestmark = pytest.mark.slow  # a server process of its own, and four clients


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalServer]:
    with LocalServer(admin=True, history=str(tmp_path / "history-0.jsonl")) as srv:
        yield srv


def _client(srv: LocalServer, tmp_path: Path, name: str) -> VolcanoLocks:
    transport = RecordingTransport(tmp_path / f"calls-{name}.jsonl", worker=name, server=0)
    return VolcanoLocks(srv.url, service_key=srv.service_key, timeout=5.0, transport=transport)


def _contend(srv: LocalServer, tmp_path: Path, key: str, *, bug: str | None) -> Verdict:
    """A holds the key; B tries to take it (with `bug` switched on just then); then both let go."""
    with _client(srv, tmp_path, "a") as a, _client(srv, tmp_path, "b") as b:
        held = a.acquire(key, 30)
        a.get(key)
        srv.set_faults(bug)
        try:
            stolen = b.acquire(key, 30)
        except LockContention:
            stolen = None
        srv.set_faults(None)
        try:
            kept = a.renew(key, held)
        except OwnershipLost:  # the broken server gave the lock to B
            kept = None
        b.get(key)
        if stolen is not None:
            b.release(key, stolen)
        if kept is not None:
            a.release(key, kept)
    loaded = load_ops(read_calls(tmp_path), read_server_history([tmp_path / "history-0.jsonl"]))
    assert not loaded.mismatches
    verdict = check_ops(loaded.ops)
    verdict.counts = loaded.counts
    return verdict


def test_the_honest_server_is_explained(server: LocalServer, tmp_path: Path, unique_key: str) -> None:
    verdict = _contend(server, tmp_path, unique_key, bug=None)
    assert verdict.ok and verdict.ops == 6 and verdict.counts["client_calls"] == 6, verdict.line()


def test_a_server_that_grants_a_held_lock_is_caught(
    server: LocalServer, tmp_path: Path, unique_key: str
) -> None:
    verdict = _contend(server, tmp_path, unique_key, bug="grant_held:count=1")
    assert len(verdict.violations) == 1, verdict.line()
    report = verdict.violations[0].describe()
    assert "acquire" in report and "'status': 201, 'fencing': 2" in report, report
