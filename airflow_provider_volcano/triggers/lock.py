"""VolcanoLockTrigger: waits in the triggerer for a Volcano lock and acquires it for its task."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
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

from airflow_provider_volcano._handoff import (
    LOOK_EVERY,
    HandoffRecord,
    clear_record,
    describe,
    lease_of,
    owner_state,
    read_record,
    released_line,
    unusable_because,
    write_record,
)
from airflow_provider_volcano._provenance import HolderRecord, read_holder
from airflow_provider_volcano._tokens import TaskIdentity

if TYPE_CHECKING:
    from airflow_provider_volcano.hooks.volcano import VolcanoHook
    from volcano_locks import AsyncVolcanoLocks, LockLease, LockState

__all__ = ["VolcanoLockTrigger"]

logger = logging.getLogger(__name__)

STATUS_ACQUIRED = "acquired"
STATUS_TIMEOUT = "timeout"
STATUS_ERROR = "error"


def _holder_facts(holder: LockState | None) -> str:
    if holder is None or not holder.held or holder.fencing_token is None:
        return "held by another owner"  # a refused acquisition does not say by whom; a look will
    return f"held with fencing token {holder.fencing_token}"


def waiting_facts(
    holder: LockState | None,
    record: HandoffRecord | None,
    state: object,
    provenance: HolderRecord | None = None,
) -> str:
    """The holder as a waiting line names it: fencing token, until when, and whether it is a handoff.

    With the holder's provenance record (:mod:`airflow_provider_volcano._provenance`) naming the live
    fencing token, the line names the holding task try too.
    """
    if holder is None or not holder.held or holder.fencing_token is None:
        return "held by another owner (not read yet)"
    until = holder.expires_at.isoformat() if holder.expires_at is not None else "an unknown time"
    if provenance is not None and provenance.fencing_token == holder.fencing_token:
        return f"{provenance.describe()}, until {until}"
    return (
        f"held with fencing token {holder.fencing_token} until {until}; "
        f"{describe(record, holder.fencing_token, state)}"
    )


_RECORD_READS_PER_SECOND = 20.0  # a triggerer's looks at handoff records, all keys together, at most


@dataclass(eq=False)
class _HandoffWatch:
    """One key's look at its handoff record, shared by the triggers waiting on it in one event loop.

    Every ``LOOK_EVERY`` seconds (slower when the loop watches many keys: its looks at
    records stay under ``_RECORD_READS_PER_SECOND``) it reads the key's record; when the try it names
    can no longer use its lease (:func:`unusable_because`), it releases that lease with the token
    derived for that try and wakes the key's waiters.
    """

    key: str
    waiters: dict[int, tuple[TaskIdentity, Any, contextvars.Context]] = dataclasses.field(
        default_factory=dict
    )
    users: int = 0
    record: HandoffRecord | None = None
    state: object = None
    provenance: HolderRecord | None = None
    task: asyncio.Task[None] | None = None

    read: asyncio.Future[LockState | None] | None = None
    read_at: float = 0.0

    async def holder(self, client: AsyncVolcanoLocks) -> LockState | None:
        """The holder, read once for every waiting line of this key within a few seconds."""
        from volcano_locks import VolcanoError

        async def read() -> LockState | None:
            try:
                return await client.get(self.key)
            except VolcanoError:
                return None

        if self.read is None or time.monotonic() - self.read_at > LOOK_EVERY:
            self.read, self.read_at = asyncio.ensure_future(read()), time.monotonic()
        return await asyncio.shield(self.read)

    def unusable_because(self, record: HandoffRecord) -> str | None:
        for waiter, _log, _context in list(self.waiters.values()):
            reason = unusable_because(record, self.state, waiter)
            if reason is not None:
                return reason
        return None

    def log_info(self, line: str) -> None:
        """Log ``line`` in every waiting trigger's context: the triggerer routes it to each task's log."""
        logger.info("%s", line)
        for _waiter, log, context in list(self.waiters.values()):
            context.run(log.info, "%s", line)


_WATCHES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _HandoffWatch]] = (
    weakref.WeakKeyDictionary()
)


async def _look_at_handoffs(watch: _HandoffWatch, client: AsyncVolcanoLocks, hook: VolcanoHook) -> None:
    """Look at the key's handoff record every few seconds until cancelled (see :class:`_HandoffWatch`)."""
    watches = _WATCHES.get(asyncio.get_running_loop(), {})
    while True:
        try:
            await _look_once(watch, client, hook)
        except Exception:  # a watch that dies silently would strand its waiters again: say so, go on
            logger.exception("looking at the handoff record of lock %r failed; looking again", watch.key)
        await asyncio.sleep(max(LOOK_EVERY, len(watches) / _RECORD_READS_PER_SECOND))


async def _look_once(watch: _HandoffWatch, client: AsyncVolcanoLocks, hook: VolcanoHook) -> None:
    """One look: read the record, ask for its owner's state, free the lease if the owner cannot use it."""
    from asgiref.sync import sync_to_async

    from volcano_locks import ConflictError, VolcanoError
    from volcano_locks.waiting import wake

    record = await sync_to_async(read_record)(watch.key)
    watch.record = record
    watch.provenance = await sync_to_async(read_holder)(watch.key)
    if record is not None and all(record.owner != w for w, _, _ in list(watch.waiters.values())):
        watch.state = await sync_to_async(owner_state)(record.owner)
        reason = watch.unusable_because(record)
        if reason is not None:
            token = hook.ownership_token(record.owner, watch.key)
            try:
                await client.release(watch.key, lease_of(record, token))
                watch.log_info(released_line(record, reason))
            except ConflictError:
                pass  # that try's lease is gone already (lapsed or released)
            except VolcanoError as exc:
                logger.warning("Could not release the stranded handoff of lock %r: %s", watch.key, exc)
                record = None  # try again at the next look
            if record is not None:
                await sync_to_async(clear_record)(watch.key, record.fencing_token, logger)
                watch.record = None
                wake(watch.key)


@asynccontextmanager
async def _handoff_watch(
    key: str, client: AsyncVolcanoLocks, hook: VolcanoHook, waiter: TaskIdentity | None, log: Any
) -> AsyncIterator[_HandoffWatch]:
    """This event loop's watch of ``key``'s handoff record (started by its first waiter)."""
    watches = _WATCHES.setdefault(asyncio.get_running_loop(), {})
    watch = watches.get(key)
    if watch is None:
        watch = watches[key] = _HandoffWatch(key)
    watch.users += 1
    ticket = id(object()) if waiter is None else id(waiter)
    if waiter is not None:
        watch.waiters[ticket] = (waiter, log, contextvars.copy_context())
        if watch.task is None:
            # Not in this trigger's context (the triggerer routes log lines by it): the watch serves
            # every trigger on the key, and outlives this one if others still wait.
            watch.task = asyncio.create_task(
                _look_at_handoffs(watch, client, hook), context=contextvars.Context()
            )
    try:
        yield watch
    finally:
        watch.waiters.pop(ticket, None)
        watch.users -= 1
        if watch.users == 0:
            if watches.get(key) is watch:
                del watches[key]
            if watch.task is not None:
                watch.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch.task


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
    waiter: TaskIdentity | None = None,
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
    :param waiter: the task try waiting: with it, a handoff lease whose try can no longer use it is
        released (see :mod:`airflow_provider_volcano._handoff`) instead of waited out.
    """
    from volcano_locks import AuthError, InvalidRequest, VolcanoError, WaitTimeout
    from volcano_locks.waiting import WaitPolicy

    reads: set[asyncio.Task[None]] = set()

    def report(holder: LockState | None, waited: float) -> None:
        log.info(
            "Still waiting for lock %r after %.0f s; it is %s",
            key,
            waited,
            waiting_facts(holder, watch.record, watch.state, watch.provenance),
        )

    async def read_and_report(waited: float) -> None:
        report(await watch.holder(client), waited)

    def still_waiting(holder: LockState | None, waited: float) -> None:
        if holder is not None and holder.held and holder.fencing_token is not None and holder.expires_at:
            report(holder, waited)
            return
        # A refused acquisition does not say by whom nor until when: one read (per report) does.
        task = asyncio.get_running_loop().create_task(read_and_report(waited))
        reads.add(task)
        task.add_done_callback(reads.discard)

    timeout = None if deadline is None else max(0.0, deadline - time.time())
    async with (
        _shared_client(hook) as client,
        _handoff_watch(key, client, hook, waiter, log) as watch,
    ):
        try:
            lease = await client.wait_acquire(
                key,
                ttl,
                timeout=timeout,
                token=token,
                poll=poll,
                on_waiting=still_waiting,
                # The engine's learning backoff, poll_interval its floor: one poll per key stands for
                # every trigger waiting on it here, so while a line passes it keeps looking every
                # poll_interval (handoffs stay quick) and backs off for a long holder; the triggerer's
                # adaptive waiting rate caps the total, as for any process of the project.
                policy=WaitPolicy(poll=poll, follow_turnover=True),
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
        finally:
            for task in list(reads):
                task.cancel()
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
            await hook.aget_config()  # parsed once: the token below and the client use it
        except VolcanoConnectionError as exc:
            yield self._event(STATUS_ERROR, str(exc))
            return
        # The handoff allowance, not the task's TTL: the lease must outlive the task's resume.
        identity = TaskIdentity.from_dict(self.identity)
        token = hook.ownership_token(identity, self.lock_key)
        outcome = await wait_for_lock(
            hook, self.lock_key, token, self.handoff_ttl, self.deadline, self.poll, self.log, identity
        )
        if outcome.status == STATUS_ACQUIRED and outcome.lease is not None:
            from asgiref.sync import sync_to_async

            # Written before the event, so a waiter can tell whose handoff this lease is, and free
            # it if that try never gets to use it; the resumed task deletes it once it holds.
            record = HandoffRecord(
                self.lock_key, outcome.lease.fencing_token, outcome.lease.expires_at, identity
            )
            await sync_to_async(write_record)(record, self.log)
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
