"""The trigger's wait: the core's wait engine in the triggerer's event loop, and the looks beside it.

:func:`wait_for_lock` is what :class:`~airflow_provider_volcano.triggers.lock.VolcanoLockTrigger` runs:
one client (one connection pool) per event loop and connection, one watch per key of its handoff
record shared by the triggers waiting on it (the async driver of
:mod:`airflow_provider_volcano.runtime.handoff_look`), and the "Still waiting" lines.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import hashlib
import logging
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from airflow_provider_volcano._handoff import LOOK_EVERY
from airflow_provider_volcano._tokens import TaskIdentity
from airflow_provider_volcano.records.handoff import HandoffRecord
from airflow_provider_volcano.records.holder import HolderRecord, read_holder
from airflow_provider_volcano.runtime.airflow_calls import ask
from airflow_provider_volcano.runtime.handoff_look import alook, waiting_facts
from airflow_provider_volcano.runtime.holder_watch import WATCH_EVERY, HolderWatch, look_at_holder
from airflow_provider_volcano.runtime.waiting_line import LINE_READ_AGE
from volcano_locks import AuthError, InvalidRequest, VolcanoError, WaitTimeout
from volcano_locks.integration import WaitPolicy, expected_start, reported, reported_holder_age, wake

if TYPE_CHECKING:
    from airflow_provider_volcano.hooks.volcano import VolcanoHook
    from volcano_locks import AsyncVolcanoLocks, LockLease, LockState

__all__ = ["STATUS_ACQUIRED", "STATUS_ERROR", "STATUS_TIMEOUT", "WaitOutcome", "wait_for_lock"]

logger = logging.getLogger("airflow_provider_volcano.triggers.lock")  # the trigger's own lines

STATUS_ACQUIRED = "acquired"
STATUS_TIMEOUT = "timeout"
STATUS_ERROR = "error"


def _holder_facts(holder: LockState | None) -> str:
    if holder is None or not holder.held or holder.fencing_token is None:
        return "held by another owner"  # a refused acquisition does not say by whom; a look will
    return f"held with fencing token {holder.fencing_token}"


_RECORD_READS_PER_SECOND = 20.0  # a triggerer's looks at handoff records, all keys together, at most


@dataclass(eq=False)
class _HandoffWatch:
    """One key's look at its handoff record, shared by the triggers waiting on it in one event loop.

    Every ``WATCH_EVERY`` second (slower when the loop watches many keys: its looks at
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
    holder_watch: HolderWatch = dataclasses.field(default_factory=HolderWatch)  # issue 28

    read: asyncio.Future[LockState | None] | None = None
    read_at: float = 0.0

    async def holder(
        self, client: AsyncVolcanoLocks, *, fresh: bool = False, within: float = LOOK_EVERY
    ) -> LockState | None:
        """The holder, read once for every waiting line of this key within ``within`` seconds.

        :param fresh: read now (before a release is decided), not from the last few seconds.
        :param within: the oldest read that will do (seconds).
        """

        async def read() -> LockState | None:
            try:
                return await client.get(self.key)
            except VolcanoError:
                return None

        if fresh or self.read is None or time.monotonic() - self.read_at > within:
            self.read, self.read_at = asyncio.ensure_future(read()), time.monotonic()
        return await asyncio.shield(self.read)

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
        await asyncio.sleep(max(WATCH_EVERY, len(watches) / _RECORD_READS_PER_SECOND))


async def _look_once(watch: _HandoffWatch, client: AsyncVolcanoLocks, hook: VolcanoHook) -> None:
    """One look (:func:`~airflow_provider_volcano.runtime.handoff_look.alook`), told in every waiter's log."""
    key = watch.key
    waiters = [w for w, _, _ in list(watch.waiters.values())]
    seen = await alook(
        key,
        waiters,
        client,
        hook,
        logger,
        live=partial(watch.holder, client, fresh=True),
        tell=watch.log_info,
    )
    watch.record, watch.state = seen.record, seen.state
    watch.provenance = await ask(
        f"the holder record of lock {key!r}", read_holder, hook.keyring, key, None, logger, default=None
    )
    # Issue 28: the holder's try, watched through Airflow, wakes the waiters when it ends.
    await look_at_holder(watch.holder_watch, key, watch.provenance, client)
    if seen.warning is not None:
        logger.warning("%s", seen.warning)
    if seen.freed:
        wake(key)


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
                # asgiref lets a cancelled Airflow call finish in its thread before the task ends: wait
                # briefly, never for a slow Airflow call (it held a trigger's event back 30 s once).
                await asyncio.wait({watch.task}, timeout=1.0)


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
        *dataclasses.astuple(
            dataclasses.replace(config, service_key="", anon_key=None, previous_service_keys=())
        ),
        hashlib.sha256(
            "\x00".join((config.service_key, str(config.anon_key), *config.previous_service_keys)).encode()
        ).hexdigest(),
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
    reads: set[asyncio.Task[None]] = set()

    async def read_and_report(seen: LockState | None, age: float | None, waited: float, when: str) -> None:
        shared = None if watch.read is None else time.monotonic() - watch.read_at
        stale = age is None or age > LINE_READ_AGE or (shared is not None and shared < age)
        if seen is None or seen.fencing_token is None or stale:
            seen = await watch.holder(client, within=LINE_READ_AGE)  # no request if the shared one will do
            age = time.monotonic() - watch.read_at
        facts = waiting_facts(
            seen,
            watch.record,
            watch.state,
            watch.provenance,
            age=age,
            holder_state=watch.holder_watch.ended_state,
        )
        log.info("Still waiting for lock %r after %.0f s; it is %s; %s", key, waited, facts, when)

    def still_waiting(holder: LockState | None, waited: float) -> None:
        # Issue 28: the engine's last look when it is at most LINE_READ_AGE old, else a read shared by
        # the key's lines; either way its age is said (a long hold's backoff leaves looks a minute apart).
        when = expected_start(reported())  # the engine's estimate, inside its report (issue 30)
        age = reported_holder_age()
        task = asyncio.get_running_loop().create_task(read_and_report(holder, age, waited, when))
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
                policy=WaitPolicy(poll=poll, follow_turnover=True, mode="deferred"),
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
