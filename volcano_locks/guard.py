"""``with_lock``: hold a lock for a block, renewing it in the background, and release it on exit.

Entering acquires (``on_contention``: ``"raise"``, ``"wait"`` or ``"skip"``), starts the lease keeper
and yields a guard. Exiting stops the keeper, then releases the latest lease with a fresh request id
through :func:`volcano_locks.releasing.release_or_lapse`: a release refused for now (429, 503) or
unanswered is retried while the lease lives, then left to lapse with a warning, and never raises
(``guard.release_outcome`` says which). What is raised on exit, in order of precedence: the block's
own exception; else the renewal failure (``OwnershipLost``, raised after cleanup); else the
``OwnershipLost`` of a release that found the lease no longer this holder's.

With ``once`` (a business key on a run-once ledger, ``volcano_locks.once``), entering looks the key up
once the lock is held: ``guard.duplicate`` is the first run's record (the block should do nothing and may
return its ``result``), and ``guard.once`` is the key bound to this lease, for the effect and its record.
A look-up that fails releases the lock and raises its error without entering the block.

If a fresh lease already has no safe renewal window (acquisition took so long that a renewal could no
longer land a second before the local deadline), the lease is renewed once *before* the block is
entered; if even that leaves no window, the lease is released and ``OwnershipLost`` (code
``no_safe_window``) is raised without entering the block.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import threading
from collections.abc import Generator
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar, cast

from volcano_locks._steps import Send, advance, async_outcome, outcome
from volcano_locks.clock import lease_clock
from volcano_locks.errors import ConflictError, ErrorCode, InvalidRequest, OwnershipLost, VolcanoError
from volcano_locks.models import LeaseRef, LockLease
from volcano_locks.protocol import (
    validate_key,
    validate_request_id,
    validate_token,
    validate_ttl,
    validate_wait_timeout,
)
from volcano_locks.releasing import ReleaseOutcome, async_release_or_lapse, release_or_lapse
from volcano_locks.renewal import (
    AsyncLeaseKeeper,
    KeeperTiming,
    LeaseKeeper,
    renewal_timeout,
    safe_window_end,
)
from volcano_locks.telemetry import record
from volcano_locks.waiting import OnWaiting, WaitPolicy, async_wait_acquire, wait_acquire

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from volcano_locks.once import OnceRecord
    from volcano_locks.waiting import AsyncWaitClient, SyncWaitClient

    class _SyncClient(SyncWaitClient, Protocol):
        """What a sync ``with_lock`` needs of its client (``VolcanoLocks``)."""

        @property
        def timeout(self) -> float: ...
        def release(self, key: str, lease: LockLease) -> None: ...
        def release_within(self, lease: LockLease | LeaseRef, timeout: float) -> None: ...
        def renew_within(self, lease: LockLease, timeout: float) -> LockLease: ...

    class _AsyncClient(AsyncWaitClient, Protocol):
        """What an async ``with_lock`` needs of its client (``AsyncVolcanoLocks``)."""

        @property
        def timeout(self) -> float: ...
        async def release(self, key: str, lease: LockLease) -> None: ...
        async def release_within(self, lease: LockLease | LeaseRef, timeout: float) -> None: ...
        async def renew_within(self, lease: LockLease, timeout: float) -> LockLease: ...


__all__ = ["AsyncLockContext", "AsyncLockGuard", "LockContext", "LockGuard", "OnContention"]


_KeeperT = TypeVar("_KeeperT", bound=LeaseKeeper | AsyncLeaseKeeper)

logger = logging.getLogger("volcano_locks.guard")

OnContention = Literal["raise", "wait", "skip"]
_POLICIES = ("raise", "wait", "skip")


class _InterruptedByLoss(OwnershipLost):
    """Raised asynchronously in the body's thread; replaced on exit by the keeper's first reason."""

    def __init__(
        self, message: str = "lock ownership lost while the block was running", **kwargs: object
    ) -> None:
        super().__init__(message, code=ErrorCode.INTERRUPTED)


class _Interrupter:
    """Raises :class:`_InterruptedByLoss` once in the thread that created it, while its block runs.

    ``PyThreadState_SetAsyncExc`` fires between bytecodes. ``disarm`` ends the block; an interrupt sent
    but not fired yet is cleared then, so the block's cleanup is not cut short. Used by ``with_lock``'s
    sync context and by ``keeping.keep``.
    """

    def __init__(self) -> None:
        self._thread_id = threading.get_ident()
        self._arm = threading.Lock()
        self._running = True
        self._sent = False

    def __call__(self) -> None:
        with self._arm:
            if self._running and not self._sent:
                self._sent = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self._thread_id), ctypes.py_object(_InterruptedByLoss)
                )

    def disarm(self) -> None:
        """The block is over; call again if this call itself raised the interrupt on the way out."""
        with self._arm:
            self._running = False
            if self._sent:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread_id), None)

    def disarm_quietly(self) -> None:
        """Disarm, swallowing an interrupt that fired during the first try (the loss is raised after)."""
        try:
            self.disarm()
        except _InterruptedByLoss:
            self.disarm()


def _check_options(
    key: str,
    ttl: int,
    token: str | None,
    request_id: str | None,
    on_contention: str,
    wait_timeout: float | None,
    on_loss: object,
) -> None:
    validate_key(key)
    validate_ttl(ttl)
    if token is not None:
        validate_token(token)
    if request_id is not None:
        validate_request_id(request_id)
    if on_contention not in _POLICIES:
        raise InvalidRequest(
            f"invalid on_contention {on_contention!r}: expected one of {', '.join(_POLICIES)}"
        )
    validate_wait_timeout(wait_timeout)
    if on_loss is not None and not callable(on_loss):
        raise InvalidRequest(f"invalid on_loss {on_loss!r}: expected a callable taking the OwnershipLost")


def _no_window(lease: LockLease, timing: KeeperTiming, now: float) -> bool:
    return now >= safe_window_end(lease, timing)


@dataclass(frozen=True)
class _Options:
    key: str
    ttl: int
    token: str | None = field(repr=False)
    request_id: str | None
    on_contention: OnContention
    wait_timeout: float | None
    on_waiting: OnWaiting | None
    wait_policy: WaitPolicy | None = None
    once: Any = None


_Entered = tuple[LockLease, KeeperTiming, "OnceRecord | None"] | None


def _check_once(once: object) -> None:
    if once is not None and not (
        callable(getattr(once, "lookup", None)) and callable(getattr(once, "bound", None))
    ):
        raise InvalidRequest(
            f"invalid once {type(once).__name__}: expected a business key on a run-once ledger "
            "(ledger.once(key) of volcano_locks.once)"
        )


def _enter_flow(opts: _Options, client_timeout: float) -> Generator[Send, object, _Entered]:
    """What entering ``with_lock`` decides, for both shells: acquire, make sure of a safe window.

    Returns the lease and the keeper's timing, or ``None`` when contention is skipped.
    """
    asked = lease_clock()
    acquired = yield Send("wait_acquire" if opts.on_contention == "wait" else "acquire")
    if isinstance(acquired, ConflictError) and opts.on_contention == "skip":  # either 409: contention
        logger.info("lock is held elsewhere; skipping the block (on_contention='skip')")
        record.wait_ended(opts.key, "skipped", lease_clock() - asked)
        return None
    if isinstance(acquired, BaseException):
        raise acquired
    assert isinstance(acquired, LockLease)
    lease = acquired
    timing = KeeperTiming(request_timeout=renewal_timeout(client_timeout, lease.ttl))
    now = lease_clock()
    if not _no_window(lease, timing, now):
        return (yield from _look_up(opts, lease, timing))
    budget = min(timing.request_timeout, lease.local_deadline - timing.margin - now)
    if budget >= timing.min_attempt:
        renewed = yield Send("renew", lease, timeout=budget)
        if isinstance(renewed, BaseException):
            yield Send("release", lease)
            raise renewed
        assert isinstance(renewed, LockLease)
        lease = renewed
        if not _no_window(lease, timing, lease_clock()):
            return (yield from _look_up(opts, lease, timing))
    yield Send("release", lease)
    raise OwnershipLost(
        "acquired lease has no safe renewal window; block not entered", code=ErrorCode.NO_SAFE_WINDOW
    )


def _look_up(opts: _Options, lease: LockLease, timing: KeeperTiming) -> Generator[Send, object, _Entered]:
    """With ``once``: the business key's record, looked up under the lock (a failed look-up releases it)."""
    if opts.once is None:
        return lease, timing, None
    found = yield Send("lookup", lease)
    if isinstance(found, BaseException):
        yield Send("release", lease)
        raise found
    if found is not None:
        logger.info("duplicate run, the block should do nothing: %s", found.describe())  # type: ignore[attr-defined]
    return lease, timing, found  # type: ignore[return-value]


def _leaving(
    exc: BaseException | None,
    loss: OwnershipLost | None,
    release_error: BaseException | None,
    *,
    news_of_loss: bool,
) -> BaseException | None:
    """What leaves the block, in order: the loss if ``exc`` only carried its news (an interrupt, our own
    cancellation); else the block's own exception (``None`` here: it propagates as it is); else the
    renewal failure; else a release's ``OwnershipLost`` (a refused release never comes here)."""
    if news_of_loss and loss is not None:
        loss.__suppress_context__ = True  # the interrupt only carried the news; keep the loss's cause
        return loss
    if exc is not None:
        return None
    return loss if loss is not None else release_error


class _GuardState(Generic[_KeeperT]):
    """What both guards report: the latest lease and whether ownership was lost."""

    def __init__(
        self, keeper: _KeeperT | None, once: Any = None, duplicate: OnceRecord | None = None
    ) -> None:
        self._keeper: _KeeperT | None = keeper
        self._release_outcome: ReleaseOutcome[LockLease] | None = None
        self._once = None if once is None else once.bound(self)
        self._duplicate = duplicate

    @property
    def duplicate(self) -> OnceRecord | None:
        """With ``once``: the first run's record when the business key is already done, else ``None``."""
        return self._duplicate

    @property
    def once(self) -> Any:
        """With ``once``: the business key bound to this guard's lease (``.begin()`` / ``.publish(...)``)."""
        return self._once

    @property
    def acquired(self) -> bool:
        """Whether the lock was acquired (``False`` only with ``on_contention="skip"``)."""
        return self._keeper is not None

    @property
    def lease(self) -> LockLease | None:
        """The latest lease, or ``None`` when not acquired."""
        return None if self._keeper is None else self._keeper.lease

    @property
    def fencing_token(self) -> int | None:
        """The lease's fencing token, to pass to whatever the lock protects."""
        return None if self._keeper is None else self._keeper.lease.fencing_token

    @property
    def release_outcome(self) -> ReleaseOutcome[LockLease] | None:
        """How the release on exit ended (released, or left to lapse); ``None`` until the block exits."""
        return self._release_outcome

    @property
    def lost(self) -> bool:
        """Whether ownership was lost; stop protected work when it is."""
        return self._keeper is not None and self._keeper.lost

    @property
    def loss(self) -> OwnershipLost | None:
        """The first reason ownership was lost, or ``None``."""
        return None if self._keeper is None else self._keeper.loss

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(acquired={self.acquired}, fencing_token={self.fencing_token}, "
            f"lost={self.lost})"
        )


class LockGuard(_GuardState["LeaseKeeper"]):
    """What a sync ``with_lock`` block gets: the latest lease and whether ownership was lost."""

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block up to ``timeout`` seconds for loss; return whether ownership is lost.

        A guard that did not acquire (``on_contention="skip"``) has nothing to lose: ``False`` at once.
        """
        if self._keeper is None:
            return False
        return self._keeper.wait_lost(timeout)


class AsyncLockGuard(_GuardState["AsyncLeaseKeeper"]):
    """What an ``async with_lock`` block gets: the latest lease and whether ownership was lost."""

    async def wait_lost(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for loss; return whether ownership is lost.

        A guard that did not acquire (``on_contention="skip"``) has nothing to lose: ``False`` at once.
        """
        if self._keeper is None:
            return False
        return await self._keeper.wait_lost(timeout)


def _released(guard: LockGuard | AsyncLockGuard | None, result: object) -> BaseException | None:
    """Keep a release's outcome on the guard; return the ``OwnershipLost`` of a lease found gone."""
    if isinstance(result, BaseException):
        logger.warning("release after with_lock found the lease lost: %s", result)
        return result
    if guard is not None:
        guard._release_outcome = cast(ReleaseOutcome[LockLease], result)
    return None


_ClientT = TypeVar("_ClientT")


class _ContextBase(Generic[_ClientT]):
    """The options both context managers check and keep (the client is a sync or an async one)."""

    def __init__(
        self,
        client: _ClientT,
        key: str,
        ttl: int,
        *,
        token: str | None,
        request_id: str | None,
        on_contention: OnContention,
        wait_timeout: float | None,
        interrupt: bool,
        on_loss: Callable[[OwnershipLost], object] | None,
        on_waiting: OnWaiting | None = None,
        wait_policy: WaitPolicy | None = None,
        once: object = None,
    ) -> None:
        _check_options(key, ttl, token, request_id, on_contention, wait_timeout, on_loss)
        _check_once(once)
        self._client = client
        self._opts = _Options(
            key, ttl, token, request_id, on_contention, wait_timeout, on_waiting, wait_policy, once
        )
        self._interrupt = bool(interrupt)
        self._on_loss = on_loss
        self._entered = False

    def _call(
        self, step: Send, wait: Callable[..., object], release: Callable[[LockLease], object]
    ) -> object:
        """The call that performs ``step`` (a coroutine for the async client); not yet made."""
        client: Any = self._client
        o = self._opts
        if step.op == "lookup":
            return o.once.lookup()
        if step.op == "wait_acquire":
            return wait(
                client,
                o.key,
                o.ttl,
                timeout=o.wait_timeout,
                token=o.token,
                request_id=o.request_id,
                on_waiting=o.on_waiting,
                policy=o.wait_policy,
            )
        if step.op == "acquire":
            return client.acquire(o.key, o.ttl, token=o.token, request_id=o.request_id)
        assert isinstance(step.lease, LockLease)  # the entry flow renews and releases only the lease it holds
        if step.op == "renew":
            return client.renew_within(step.lease, step.timeout)
        return release(step.lease)

    def _enter_once(self) -> Generator[Send, object, _Entered]:
        if self._entered:
            raise RuntimeError("a with_lock context can be entered only once; call with_lock() again")
        self._entered = True
        return _enter_flow(self._opts, self._client.timeout)  # type: ignore[attr-defined]


class LockContext(_ContextBase["_SyncClient"]):
    """The sync context manager returned by ``VolcanoLocks.with_lock``; enter it once.

    Renewal runs on a named daemon thread. With ``interrupt=True``, loss raises ``OwnershipLost`` in the
    thread that entered the block (``PyThreadState_SetAsyncExc``): it fires between bytecodes, so a
    body blocked inside one C call (a socket read, ``time.sleep``) sees it only when that call returns.
    """

    def __init__(self, client: _SyncClient, key: str, ttl: int, **options: Any) -> None:
        super().__init__(client, key, ttl, **options)
        self._keeper: LeaseKeeper | None = None
        self._guard: LockGuard | None = None
        self._interrupter: _Interrupter | None = None

    def __enter__(self) -> LockGuard:
        flow = self._enter_once()
        step, entered = advance(flow, None)
        while step is not None:
            call = partial(self._call, step, wait_acquire, self._release_quietly)
            caught = Exception if step.op == "lookup" else VolcanoError
            step, entered = advance(flow, outcome(call, caught))
        if entered is None:
            return LockGuard(None)
        lease, timing, duplicate = entered
        self._keeper = LeaseKeeper(lease, self._client.renew_within, timing=timing, on_loss=self._lost)
        self._interrupter = _Interrupter() if self._interrupt else None
        self._keeper.start()
        self._guard = LockGuard(self._keeper, self._opts.once, duplicate)
        return self._guard

    def _release_quietly(self, lease: LockLease) -> BaseException | None:
        try:
            self._client.release(self._opts.key, lease)
        except VolcanoError as exc:
            logger.warning("release after with_lock failed: %s", exc)
            return exc
        return None

    def _release_finished(self, lease: LockLease) -> BaseException | None:
        """Release after the block: a refusal is retried, then left to lapse; only a loss comes back."""
        return _released(self._guard, outcome(partial(release_or_lapse, self._client, lease)))

    def _lost(self, loss: OwnershipLost) -> None:
        if self._interrupter is not None:
            self._interrupter()
        if self._on_loss is not None:
            self._on_loss(loss)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if self._interrupter is not None:
            self._interrupter.disarm_quietly()
        keeper = self._keeper
        if keeper is None:
            return False
        keeper.stop()
        release_error = self._release_finished(keeper.lease)
        leaving = _leaving(exc, keeper.loss, release_error, news_of_loss=isinstance(exc, _InterruptedByLoss))
        if leaving is not None:
            raise leaving
        return False


class AsyncLockContext(_ContextBase["_AsyncClient"]):
    """The async context manager returned by ``AsyncVolcanoLocks.with_lock``; enter it once.

    The keeper runs as a named task. On loss the task running the block is cancelled and the
    ``async with`` raises ``OwnershipLost`` instead of ``CancelledError``; a cancellation that came from
    elsewhere still propagates as ``CancelledError``. ``interrupt`` is accepted for symmetry with the
    sync form: the async block is always cancelled on loss.
    """

    def __init__(self, client: _AsyncClient, key: str, ttl: int, **options: Any) -> None:
        super().__init__(client, key, ttl, **options)
        self._keeper: AsyncLeaseKeeper | None = None
        self._guard: AsyncLockGuard | None = None
        self._task: asyncio.Task[object] | None = None
        self._body_running = False
        self._cancelled = False

    async def __aenter__(self) -> AsyncLockGuard:
        flow = self._enter_once()
        step, entered = advance(flow, None)
        while step is not None:
            call = cast("Awaitable[object]", self._call(step, async_wait_acquire, self._release_quietly))
            caught = Exception if step.op == "lookup" else VolcanoError
            step, entered = advance(flow, await async_outcome(call, caught))
        if entered is None:
            return AsyncLockGuard(None)
        lease, timing, duplicate = entered
        self._task = asyncio.current_task()
        self._keeper = AsyncLeaseKeeper(lease, self._client.renew_within, timing=timing, on_loss=self._lost)
        self._keeper.start()
        self._body_running = True
        self._guard = AsyncLockGuard(self._keeper, self._opts.once, duplicate)
        return self._guard

    async def _stop_and_release(self, keeper: AsyncLeaseKeeper) -> BaseException | None:
        await keeper.stop()
        return _released(self._guard, await async_outcome(async_release_or_lapse(self._client, keeper.lease)))

    async def _release_quietly(self, lease: LockLease) -> BaseException | None:
        try:
            await self._client.release(self._opts.key, lease)
        except VolcanoError as exc:
            logger.warning("release after with_lock failed: %s", exc)
            return exc
        return None

    def _lost(self, loss: OwnershipLost) -> None:
        if self._body_running and not self._cancelled and self._task is not None:
            self._cancelled = True
            self._task.cancel(msg="volcano lock ownership lost")
        if self._on_loss is not None:
            self._on_loss(loss)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        self._body_running = False
        keeper = self._keeper
        if keeper is None:
            return False
        outer_cancel = False
        if self._cancelled and self._task is not None:
            # Our own cancel is withdrawn; any count left means someone else cancelled the task too.
            outer_cancel = self._task.uncancel() > 0
        cleanup = asyncio.ensure_future(self._stop_and_release(keeper))
        try:
            release_error = await asyncio.shield(cleanup)
        except asyncio.CancelledError:
            # Cancelled while cleaning up: let the release finish (bounded by the request timeout) so the
            # lock is not left held until its TTL, then stay cancelled.
            await asyncio.wait([cleanup])
            raise
        leaving = _leaving(
            exc,
            keeper.loss,
            release_error,
            news_of_loss=isinstance(exc, asyncio.CancelledError) and self._cancelled and not outer_cancel,
        )
        if leaving is not None:
            raise leaving
        return False
