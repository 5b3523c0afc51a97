"""A task try's first acquisition, and what a refusal says of the holder.

The first try never waits for a held lock, so ``skip``, ``fail`` and a deferral decide on an answer
from the server. No response, 503 and 429 are not an answer: the core's wait engine
(:func:`volcano_locks.waiting.wait_acquire` with ``contention="raise"``, the engine the trigger and
the in-slot wait use too) tries again as the same owner (same ownership token, same request id after
an uncertain attempt), paced by the process's waiting budget, until the wait's bound.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException

from airflow_provider_volcano.records.holder import read_holder
from volcano_locks import VolcanoError, WaitTimeout
from volcano_locks.integration import wait_acquire

if TYPE_CHECKING:
    from airflow_provider_volcano.records.seal import Keyring
    from volcano_locks import LockLease, LockState, VolcanoLocks

__all__ = ["acquire_answered", "holder_facts", "read_state", "remaining"]


def remaining(deadline: float | None) -> float | None:
    """Seconds left until the wall-clock ``deadline`` (``None``: no bound)."""
    return None if deadline is None else max(0.0, deadline - time.time())


def acquire_answered(
    client: VolcanoLocks,
    key: str,
    ttl: int,
    token: str,
    *,
    deadline: float | None,
    bound: object,
    poll: float,
    log: logging.Logger | Any,
) -> LockLease:
    """Acquire ``key`` as the owner of ``token`` once the server answers; raise its refusal.

    :param deadline: wall-clock time (epoch seconds) to stop waiting for an answer; ``None``: never.
    :param bound: how the task's bound is named in the failure (e.g. ``wait_timeout=60``).
    :param poll: seconds before the first retry (later ones back off).
    :raises volcano_locks.ConflictError: the lock is held (or our own lease lapsed).
    :raises AirflowException: no answer before ``deadline``.
    """

    def unanswered(_holder: LockState | None, waited: float) -> None:
        log.warning(
            "Volcano lock API unavailable while acquiring lock %r (no answer for %.1f s); trying "
            "again as the same owner (bounded by %s)",
            key,
            waited,
            bound,
        )

    try:
        return wait_acquire(
            client,
            key,
            ttl,
            timeout=remaining(deadline),
            token=token,
            poll=poll,
            on_waiting=unanswered,
            contention="raise",
        )
    except WaitTimeout:
        raise AirflowException(
            f"The Volcano lock API did not answer for lock {key!r} within {bound} s"
        ) from None


def read_state(client: VolcanoLocks, key: str, log: logging.Logger | Any) -> LockState | None:
    """The lock's state, or ``None`` (logged) when it cannot be read."""

    try:
        return client.get(key)
    except VolcanoError as exc:
        log.warning("Could not read the holder of lock %r: %s", key, exc)
        return None


def holder_facts(state: LockState | None, lock_key: str | None = None, keys: Keyring | None = None) -> str:
    """The holder as a failure or a skip names it: its task try (from its sealed record) or its token.

    :param keys: the connection's keyring, to open the holder record with (``None``: not read).
    """
    if state is None or not state.held:
        return "held by another owner"
    expires = state.expires_at.isoformat() if state.expires_at is not None else "unknown"
    known = keys is not None and lock_key is not None and state.fencing_token is not None
    provenance = read_holder(keys, lock_key, state.fencing_token) if known and keys and lock_key else None
    if provenance is not None:
        return f"{provenance.describe()}, until {expires}"
    return f"held by another owner with fencing token {state.fencing_token} until {expires}"
