"""The wait engine's two drivers: :func:`wait_acquire` (threads) and :func:`async_wait_acquire` (asyncio).

Both drive the one flow (:mod:`volcano_locks.waiting.flow`) through :class:`_Run`, which holds all
they share; they differ only in how they block until a step's time and how they send its call.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Protocol, TypedDict, Unpack

from volcano_locks._steps import Op, Send, advance, async_outcome, outcome
from volcano_locks.clock import lease_clock
from volcano_locks.errors import ConflictError, VolcanoError, WaitTimeout
from volcano_locks.governor import Governor
from volcano_locks.models import LockLease, LockState
from volcano_locks.telemetry import record
from volcano_locks.waiting.flow import _Flow, _Step, _wait_flow
from volcano_locks.waiting.policy import Contention, OnWaiting, WaitPolicy, _policy, _raising
from volcano_locks.waiting.registry import SharedPolls
from volcano_locks.waiting.waiter import _LoopSignal, _new_waiter, _Signal, _ThreadSignal, _Waiter

__all__ = ["AsyncWaitClient", "SyncWaitClient", "async_wait_acquire", "wait_acquire"]

logger = logging.getLogger("volcano_locks.waiting")


class _WaitClient(Protocol):
    """What the engine needs of either client: its credential's identity, its governor, ``abandon``."""

    @property
    def api_url(self) -> str: ...
    @property
    def credential_id(self) -> str: ...
    @property
    def governor(self) -> Governor: ...
    def abandon(self, key: str, token: str, request_id: str) -> None: ...


class SyncWaitClient(_WaitClient, Protocol):
    """What the engine needs of a sync client (``VolcanoLocks``): its credential's identity and two calls."""

    def get(self, key: str) -> LockState: ...
    def acquire(
        self, key: str, ttl: int, *, token: str | None = ..., request_id: str | None = ...
    ) -> LockLease: ...


class AsyncWaitClient(_WaitClient, Protocol):
    """What the engine needs of an async client (``AsyncVolcanoLocks``)."""

    async def get(self, key: str) -> LockState: ...
    async def acquire(
        self, key: str, ttl: int, *, token: str | None = ..., request_id: str | None = ...
    ) -> LockLease: ...
    async def release(self, key: str, lease: LockLease) -> None: ...


class _WaitArgs(TypedDict, total=False):
    """The keyword arguments of both drivers (see :func:`wait_acquire`)."""

    timeout: float | None
    token: str | None
    poll: float
    request_id: str | None
    on_waiting: OnWaiting | None
    policy: WaitPolicy | None
    contention: Contention


class _Run:
    """One wait being driven: the step to perform next (``None`` once done), then the lease.

    What both drivers decide about a step lives here: counting a call as a waiting request, raising a
    refusal under ``contention="raise"``, and handing the flow each outcome.
    """

    def __init__(
        self,
        flow: _Flow,
        waiter: _Waiter,
        governor: Governor,
        raising: bool,
        on_waiting: OnWaiting | None,
        mode: str = "in_slot",
    ) -> None:
        self.waiter = waiter
        self.mode = mode
        self.waiting = False  # past its first refusal: counted among the waiters
        self._flow = flow
        self._governor = governor
        self._raising = raising
        self._on_waiting = on_waiting
        self._started = lease_clock()
        self.step: _Step | None = None
        self.lease: LockLease | None = None
        self.resume()

    def resume(self, result: object = None) -> None:
        """Hand the flow what the last step gave (``None`` after a wait); take its next step."""
        self.step, self.lease = advance(self._flow, result)

    def send(self) -> Op:
        """The call the current :class:`~volcano_locks._steps.Send` step makes, counted as waiting."""
        assert isinstance(self.step, Send)
        self._governor.note_waiting()
        return self.step.op

    def answer(self, result: object) -> None:
        """Hand the flow the call's outcome; with ``contention="raise"``, raise a refusal first."""
        if isinstance(result, ConflictError) and not self._raising and not self.waiting:
            self.waiting = True
            record.waiting(self.waiter.key, self.mode, 1)
        if self._raising:
            if isinstance(result, ConflictError):
                self.waiter.refused()  # a definite answer: no lease of this attempt to abandon
                raise result
            if isinstance(result, VolcanoError) and self._on_waiting is not None:
                self._on_waiting(None, lease_clock() - self._started)
        self.resume(result)

    def result(self) -> LockLease:
        """The lease the finished flow returned."""
        assert self.step is None and self.lease is not None
        return self.lease


@contextmanager
def _running(
    client: SyncWaitClient | AsyncWaitClient,
    scope: object,
    signal: _Signal,
    key: str,
    ttl: int,
    args: _WaitArgs,
) -> Iterator[_Run]:
    """Validate the arguments, queue the waiter on its key's shared poll and drive its flow; close it after.

    A ``contention="raise"`` waiter queues alone (its own scope): it waits only for an answer.
    """
    poll, timeout = args.get("poll", 1.0), args.get("timeout")
    waiter = _new_waiter(key, ttl, timeout, args.get("token"), poll, args.get("request_id"), signal)
    policy = _policy(poll, args.get("policy"))
    raising = _raising(args.get("contention", "wait"))
    started = lease_clock()
    with SharedPolls.join(
        object() if raising else scope, client.api_url, client.credential_id, waiter, recall=not raising
    ) as entry:
        flow = _wait_flow(
            entry,
            waiter,
            client.governor,
            policy,
            timeout,
            None if raising else args.get("on_waiting"),
            lease_clock,
            random.random,
            raising=raising,
        )
        run: _Run | None = None
        ending: record.WaitOutcome = "acquired"
        span = None if raising else record.wait_started(key, policy.mode)
        try:
            run = _Run(flow, waiter, client.governor, raising, args.get("on_waiting"), policy.mode)
            yield run
        except WaitTimeout:
            ending = "timed_out"
            raise
        except Exception:
            ending = "failed"
            raise
        except BaseException:
            ending = "cancelled"
            raise
        finally:
            flow.close()
            if run is not None and run.waiting:
                record.waiting(key, run.mode, -1)
            if not raising:
                record.wait_ended(key, ending, lease_clock() - started, span)
            if waiter.uncertain and waiter.request_id is not None:
                # The wait ends (timed out, cancelled, failed) right after an attempt whose outcome is
                # unknown: the server may hold a lease for this token that nobody will use.
                client.abandon(waiter.key, waiter.token, waiter.request_id)


def wait_acquire(client: SyncWaitClient, key: str, ttl: int, **args: Unpack[_WaitArgs]) -> LockLease:
    """Acquire ``key`` with ``client``, waiting out contention up to ``timeout`` seconds (sync).

    Args:
        client: The client whose credential and connection pool the waiter uses.
        key: The lock key.
        ttl: The lease TTL in seconds.
        timeout: Give up after this many seconds (``None``: no bound; ``0``: one attempt).
        token: The ownership token for every attempt (generated when ``None``).
        poll: Seconds before the first look; later looks back off (see :class:`WaitPolicy`).
        request_id: Request id for the first acquisition.
        on_waiting: Called with the last holder seen and the seconds waited, when the wait starts
            and every ``policy.report_every`` seconds after.
        policy: The backoff (``poll`` overrides its first interval).
        contention: ``"wait"`` waits out a held lock; ``"raise"`` waits only for an answer: every
            attempt is an acquisition, a refusal (``ConflictError``) is raised at once, and what is
            not an answer (no response, 503, 429) is tried again as in a wait (same token, and the
            same request id after an uncertain attempt) until ``timeout``. Such a waiter does not
            queue behind the key's other waiters, and ``on_waiting(None, waited)`` is called after
            each attempt that got no answer.

    Raises:
        WaitTimeout: Still held (``contention="raise"``: still unanswered) when the timeout ran out;
            ``holder`` is the last state seen.
        ConflictError: Held by another owner (``contention="raise"`` only).
    """
    signal = _ThreadSignal()
    with _running(client, "thread", signal, key, ttl, args) as run:
        while (step := run.step) is not None:
            if isinstance(step, Send):
                run.answer(outcome(partial(_send_sync, client, run.waiter, run.send())))
            else:
                signal.wait_until(step.until)
                run.resume()
        return run.result()


def _send_sync(client: SyncWaitClient, waiter: _Waiter, op: Op) -> object:
    if op == "get":
        return client.get(waiter.key)
    return client.acquire(waiter.key, waiter.ttl, token=waiter.token, request_id=waiter.request_id)


async def async_wait_acquire(
    client: AsyncWaitClient, key: str, ttl: int, **args: Unpack[_WaitArgs]
) -> LockLease:
    """Acquire ``key`` with ``client``, waiting out contention up to ``timeout`` seconds (cancellable).

    Same arguments as :func:`wait_acquire`. A cancellation that lands while an acquisition is in
    flight lets that request finish in the background and releases the lease if it was granted (best
    effort: the client must stay open).

    Raises:
        WaitTimeout: Still held when the timeout ran out; ``holder`` is the last state seen.
    """
    signal = _LoopSignal(asyncio.get_running_loop())
    with _running(client, signal.loop, signal, key, ttl, args) as run:
        while (step := run.step) is not None:
            if isinstance(step, Send):
                call = client.get(key) if run.send() == "get" else _acquire_or_undo(client, run.waiter)
                run.answer(await async_outcome(call))
            else:
                await signal.wait_until(step.until)
                run.resume()
        return run.result()


_undoing: set[asyncio.Task[None]] = set()  # strong refs so pending clean-ups are not collected mid-flight


async def _acquire_or_undo(client: AsyncWaitClient, waiter: _Waiter) -> LockLease:
    """Acquire; if the waiter is cancelled meanwhile, let the request finish and release what it won.

    Without this, a cancelled wait whose acquisition the server granted would hold the lock, unseen,
    until its TTL ran out.
    """
    attempt = asyncio.ensure_future(
        client.acquire(waiter.key, waiter.ttl, token=waiter.token, request_id=waiter.request_id)
    )
    try:
        return await asyncio.shield(attempt)
    except asyncio.CancelledError:
        attempt.add_done_callback(lambda done: _release_won(client, done))
        raise


def _release_won(client: AsyncWaitClient, done: asyncio.Future[LockLease]) -> None:
    if done.cancelled() or done.exception() is not None:
        return
    lease = done.result()

    async def release() -> None:
        try:
            await client.release(lease.key, lease)
            logger.info(
                "released a lease won by a cancelled wait_acquire (fencing token %d)", lease.fencing_token
            )
        except Exception as exc:
            logger.warning("could not release a lease won by a cancelled wait_acquire: %s", exc)

    task = asyncio.get_running_loop().create_task(release(), name="volcano-lock-undo-acquire")
    _undoing.add(task)
    task.add_done_callback(_undoing.discard)
