"""VolcanoLockTrigger: waits in the triggerer for a Volcano lock and acquires it for its task."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_volcano._tokens import TaskIdentity, derive_token

if TYPE_CHECKING:
    from airflow_provider_volcano.hooks.volcano import VolcanoHook
    from volcano_locks import AsyncVolcanoLocks, LockLease, LockState

__all__ = ["VolcanoLockTrigger"]

STATUS_ACQUIRED = "acquired"
STATUS_TIMEOUT = "timeout"
STATUS_ERROR = "error"


def _holder_facts(holder: LockState | None) -> str:
    if holder is None or not holder.held or holder.fencing_token is None:
        return "held by another owner"  # a refused acquisition does not say by whom; a look will
    return f"held with fencing token {holder.fencing_token}"


@dataclass(frozen=True)
class WaitOutcome:
    """How one trigger's wait ended.

    :param status: ``acquired``, ``timeout`` or ``error``.
    :param lease: the lease acquired for the waiter (``acquired`` only).
    :param holder: the last holder seen (``timeout``).
    :param message: what happened, naming the lock (never a key or token).
    """

    status: str
    lease: LockLease | None = None
    holder: LockState | None = None
    message: str = ""


@dataclass(eq=False)
class _SharedClient:
    client: AsyncVolcanoLocks
    users: int = 0


# One client (one connection pool) per event loop and connection settings, shared by the triggers
# waiting in that loop: a triggerer with 500 deferred tasks holds one pool, not 500. The key part of
# the identity is a fingerprint, never the key itself.
_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[object, ...], _SharedClient]] = (
    weakref.WeakKeyDictionary()
)


@asynccontextmanager
async def _shared_client(hook: VolcanoHook) -> AsyncIterator[AsyncVolcanoLocks]:
    """This event loop's client for the hook's connection (built by the hook on first use)."""
    config = hook.config  # already parsed by aget_config
    ident = (
        *dataclasses.astuple(dataclasses.replace(config, service_key="", anon_key=None)),
        hashlib.sha256(f"{config.service_key}\x00{config.anon_key}".encode()).hexdigest(),
    )
    clients = _CLIENTS.setdefault(asyncio.get_running_loop(), {})
    shared = clients.get(ident)
    if shared is None:
        shared = clients[ident] = _SharedClient(hook.get_async_client())
    shared.users += 1
    try:
        yield shared.client
    finally:
        shared.users -= 1
        if shared.users == 0 and clients.get(ident) is shared:
            del clients[ident]
            await shared.client.aclose()


async def wait_for_lock(
    hook: VolcanoHook,
    key: str,
    token: str,
    ttl: int,
    deadline: float | None,
    poll: float,
    log: logging.Logger | Any,
) -> WaitOutcome:
    """Wait for ``key`` in the core's wait engine and acquire it with ``token`` for ``ttl`` seconds.

    The engine (:mod:`volcano_locks.waiting`) is the same one the core's ``wait_acquire`` and Prefect
    use: every trigger waiting on one key in this triggerer queues behind one poll (first come,
    first served, one release wakes one trigger), and every trigger of the connection's credential
    draws its looks from one governed waiting budget, so a triggerer with 200 deferred tasks on 200
    keys costs no more than its budget (default 120 requests a minute).

    :param hook: the hook whose connection the client is built from (``aget_config`` already awaited).
    :param key: the lock key.
    :param token: the ownership token to acquire with (derived for the task try).
    :param ttl: the TTL to acquire with.
    :param deadline: give up at this wall-clock time (epoch seconds); ``None``: no bound.
    :param poll: seconds between looks at the held lock (the triggerer's budget caps the total).
    :param log: where "still waiting" lines go (the trigger's logger: the task's log).
    """
    from volcano_locks import AuthError, InvalidRequest, VolcanoError, WaitTimeout
    from volcano_locks.waiting import WaitPolicy

    def still_waiting(holder: LockState | None, waited: float) -> None:
        log.info("Still waiting for lock %r after %.0f s; it is %s", key, waited, _holder_facts(holder))

    timeout = None if deadline is None else max(0.0, deadline - time.time())
    async with _shared_client(hook) as client:
        try:
            lease = await client.wait_acquire(
                key,
                ttl,
                timeout=timeout,
                token=token,
                poll=poll,
                on_waiting=still_waiting,
                # The engine's learning backoff, poll_interval its floor: looks reset to it when the
                # lock changes hands and back off while one holder keeps it (triggerers are many
                # processes too, and the project's 600 a minute is shared by all of them).
                policy=WaitPolicy(poll=poll),
            )
        except WaitTimeout as exc:
            return WaitOutcome(
                STATUS_TIMEOUT,
                holder=exc.holder,
                message=f"timed out waiting for lock {key!r} ({_holder_facts(exc.holder)})",
            )
        except (AuthError, InvalidRequest) as exc:
            return WaitOutcome(STATUS_ERROR, message=f"cannot wait for lock {key!r}: {exc}")
        except VolcanoError as exc:
            return WaitOutcome(STATUS_ERROR, message=f"waiting for lock {key!r} failed: {exc}")
    return WaitOutcome(STATUS_ACQUIRED, lease=lease)


class VolcanoLockTrigger(BaseTrigger):
    """Waits without a worker slot until a Volcano lock is free, then acquires it for its task.

    It acquires with the ownership token derived from the service key and the task try's identity
    and random nonce, so nothing secret is stored in the trigger row and the resumed task
    re-acquires that same lease (same fencing token). It acquires for the *handoff*: with
    ``handoff_ttl`` (at least ``ttl``), so the lease outlives a resume that takes longer than the
    task's TTL (executor queueing, pod start, a busy pool); the resumed task's idempotent
    re-acquire then sets the lease to its own ``ttl`` from that moment. Fires one event whose
    ``status`` is ``acquired``, ``timeout`` or ``error``; the payload holds the lock key, the
    fencing token, ``expires_at``, ``acquired_at`` (when the trigger's acquisition was sent), the
    handoff allowance and a message, never a key or an ownership token.

    :param volcano_conn_id: the Volcano connection id.
    :param lock_key: the lock to wait for.
    :param ttl: the task's lease TTL in seconds.
    :param identity: the task instance try with its nonce (``TaskIdentity.as_dict()``).
    :param deadline: give up at this wall-clock time (epoch seconds); ``None`` waits without bound.
    :param poll: seconds between reads of a held lock.
    :param handoff_ttl: the TTL the trigger acquires with, the time its task has to resume (``None``
        or less than ``ttl``: ``ttl``).
    """

    def __init__(
        self,
        *,
        volcano_conn_id: str,
        lock_key: str,
        ttl: int,
        identity: dict[str, Any],
        deadline: float | None = None,
        poll: float = 2.0,
        handoff_ttl: int | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.volcano_conn_id = volcano_conn_id
        self.lock_key = lock_key
        self.ttl = int(ttl)
        self.identity = TaskIdentity.from_dict(identity).as_dict()
        self.deadline = None if deadline is None else float(deadline)
        self.poll = float(poll)
        self.handoff_ttl = max(self.ttl, int(handoff_ttl or 0))

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return the classpath and JSON-primitive kwargs (no key, no token)."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "volcano_conn_id": self.volcano_conn_id,
                "lock_key": self.lock_key,
                "ttl": self.ttl,
                "identity": dict(self.identity),
                "deadline": self.deadline,
                "poll": self.poll,
                # Only when it differs: trigger rows written before the handoff allowance existed
                # (no such kwarg) keep deserialising to the same trigger.
                **({"handoff_ttl": self.handoff_ttl} if self.handoff_ttl != self.ttl else {}),
            },
        )

    def _event(self, status: str, message: str, state: Any = None) -> TriggerEvent:
        expires_at = getattr(state, "expires_at", None)
        acquired_at = getattr(state, "acquired_at", None)
        return TriggerEvent(  # type: ignore[no-untyped-call]
            {
                "status": status,
                "lock_key": self.lock_key,
                "fencing_token": getattr(state, "fencing_token", None),
                "expires_at": expires_at.isoformat() if expires_at is not None else None,
                # When the trigger's acquisition was sent: the resumed task measures its resume delay.
                "acquired_at": acquired_at.isoformat() if acquired_at is not None else None,
                "handoff_ttl": self.handoff_ttl,
                "message": message,
                # Echoed so a resumed task can defer again within the same bound, even where the
                # deferral's method kwargs are not carried over (dag.test()).
                "deadline": self.deadline,
                "nonce": self.identity["nonce"],
            }
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Wait for the lock in the core's wait engine and yield one event."""
        from airflow_provider_volcano.hooks.volcano import VolcanoConnectionError, VolcanoHook

        hook = VolcanoHook(self.volcano_conn_id)
        try:
            config = await hook.aget_config()
        except VolcanoConnectionError as exc:
            yield self._event(STATUS_ERROR, str(exc))
            return
        token = derive_token(config.service_key, TaskIdentity.from_dict(self.identity), self.lock_key)
        # The handoff allowance, not the task's TTL: the lease must outlive the task's resume.
        outcome = await wait_for_lock(
            hook, self.lock_key, token, self.handoff_ttl, self.deadline, self.poll, self.log
        )
        if outcome.status == STATUS_ACQUIRED and outcome.lease is not None:
            self.log.info(
                "Acquired lock %r for the task (fencing token %s); it holds for the handoff "
                "(%s s) until the task resumes and renews it at its own ttl (%s s)",
                self.lock_key,
                outcome.lease.fencing_token,
                self.handoff_ttl,
                self.ttl,
            )
            yield self._event(STATUS_ACQUIRED, f"acquired lock {self.lock_key!r}", outcome.lease)
        else:
            yield self._event(outcome.status, outcome.message, outcome.holder)
