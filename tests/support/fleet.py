"""Shared pieces of the fleet tests: holders that must keep their locks, and held keys to wait on."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from volcano_locks import LockLease, VolcanoLocks


def other_credential(server: Any) -> str:
    """A second service key of the same project (a distinct JWT: no in-process wake-up is shared)."""
    return str(server.mint_key(permissions=["locks.manage"]))


def hold_elsewhere(server: Any, keys: list[str], ttl: int = 600) -> tuple[str, dict[str, LockLease]]:
    """Hold ``keys`` with another credential of the project, long and never renewed (they cost nothing).

    Returns the credential (to release them with) and the leases.
    """
    other = other_credential(server)
    with VolcanoLocks(server.url, service_key=other) as client:
        return other, {k: client.acquire(k, ttl) for k in keys}


def release_elsewhere(server: Any, credential: str, leases: dict[str, LockLease], keys: list[str]) -> None:
    """Release ``keys`` of ``leases`` with ``credential``."""
    with VolcanoLocks(server.url, service_key=credential) as client:
        for k in keys:
            client.release(k, leases[k])


@contextmanager
def holders(server: Any, prefix: str, count: int = 5, ttl: int = 15) -> Iterator[list[str]]:
    """``count`` threads each hold ``<prefix>-h<n>`` (``with_lock``, renewed) with the server's key.

    Yields a list that, once the block has ended, names every holder that lost its lock.
    """
    stop = threading.Event()
    lost: list[str] = []

    def hold(n: int) -> None:
        with (
            VolcanoLocks(server.url, service_key=server.service_key) as client,
            client.with_lock(f"{prefix}-h{n}", ttl) as guard,
        ):
            stop.wait(600)
            if guard.lost:
                lost.append(f"h{n}: {guard.loss}")

    threads = [threading.Thread(target=hold, args=(n,), name=f"fleet-holder-{n}") for n in range(count)]
    for t in threads:
        t.start()
    try:
        yield lost
    finally:
        stop.set()
        for t in threads:
            t.join(30)


def refused_keeping(server: Any) -> list[dict[str, Any]]:
    """Renewals and releases the server refused for the quota (what must never happen)."""
    return [r for r in server.requests() if r.get("op") in ("renew", "release") and r.get("status") == 429]
