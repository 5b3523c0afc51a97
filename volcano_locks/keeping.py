"""Keep a lease that is already held for a block: renew it in the background, never acquire or release.

``with_lock`` acquires on entry and releases on exit. Some holders do neither: a member task of an
Airflow lock group renews the group's lease while it runs and leaves it held for the next member
(the group's own release task ends it); an operator that acquired through the wait engine releases
on its own terms. :func:`keep` and :func:`async_keep` give them the lease keeper of
:mod:`volcano_locks.renewal` with the guard's reporting (:class:`~volcano_locks.guard.LockGuard`):

* the lease is renewed on the keeper's schedule until the block ends; nothing is released on exit;
* a loss is final and leaves the block as ``OwnershipLost`` (after the block's own exception, if it
  raised one): the sync form raises it in the block's thread at once with ``interrupt=True``, the
  async form always cancels the block, as ``with_lock`` does;
* a lease with no safe renewal window left is loss before the block is entered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Protocol

from volcano_locks.clock import lease_clock
from volcano_locks.errors import ErrorCode, OwnershipLost
from volcano_locks.guard import AsyncLockGuard, LockGuard, _InterruptedByLoss, _Interrupter
from volcano_locks.models import LockLease
from volcano_locks.renewal import (
    STOP_JITTER,
    STOP_REACH,
    AsyncLeaseKeeper,
    KeeperTiming,
    LeaseKeeper,
    renewal_timeout,
    safe_window_end,
)

__all__ = ["async_keep", "keep"]


class _SyncKeepClient(Protocol):
    @property
    def timeout(self) -> float: ...
    def renew_within(self, lease: LockLease, timeout: float) -> LockLease: ...


class _AsyncKeepClient(Protocol):
    @property
    def timeout(self) -> float: ...
    async def renew_within(self, lease: LockLease, timeout: float) -> LockLease: ...


def _timing(client_timeout: float, lease: LockLease, *, stops_block: bool) -> KeeperTiming:
    """The keeper's timing for ``lease``; no safe window left is loss before the block starts.

    A keeper that stops its block on loss renews early enough (``STOP_REACH``, ``STOP_JITTER``) that the
    block is stopped within a third of the TTL of the loss, round trip included.
    """
    timeout = renewal_timeout(client_timeout, lease.ttl)
    if stops_block:
        timing = KeeperTiming(request_timeout=timeout, reach=STOP_REACH, jitter=STOP_JITTER)
    else:
        timing = KeeperTiming(request_timeout=timeout)
    if lease_clock() >= safe_window_end(lease, timing):
        raise OwnershipLost(
            f"lease of lock {lease.key!r} has no safe renewal window left; block not entered",
            code=ErrorCode.NO_SAFE_WINDOW,
        )
    return timing


def _leaving(exc: BaseException | None, loss: OwnershipLost | None, news_of_loss: bool) -> None:
    """Raise the loss unless the block's own exception leaves (an interrupt only carried the news)."""
    if loss is not None and (exc is None or news_of_loss):
        raise loss from None


@contextmanager
def keep(
    client: _SyncKeepClient,
    lease: LockLease,
    *,
    interrupt: bool = False,
    on_loss: Callable[[OwnershipLost], object] | None = None,
) -> Iterator[LockGuard]:
    """Renew ``lease`` on a named daemon thread while the block runs; yields its guard.

    Args:
        client: The client that renews (``VolcanoLocks``).
        lease: The held lease to keep (acquired before, by this process or the owner it stands for).
        interrupt: Raise ``OwnershipLost`` in the block's thread as soon as loss is detected.
        on_loss: Called once, from the keeper thread, with the ``OwnershipLost``.

    Raises:
        OwnershipLost: The lease was lost (or had no safe window left); raised after the block.
    """
    interrupter = _Interrupter() if interrupt else None

    def lost(loss: OwnershipLost) -> None:
        if interrupter is not None:
            interrupter()
        if on_loss is not None:
            on_loss(loss)

    keeper = LeaseKeeper(
        lease, client.renew_within, timing=_timing(client.timeout, lease, stops_block=interrupt), on_loss=lost
    )

    def stop() -> None:
        if interrupter is not None:
            interrupter.disarm_quietly()  # an interrupt fired on the way out: the loss raised below says it
        keeper.stop()

    keeper.start()
    try:
        yield LockGuard(keeper)
    except BaseException as exc:
        stop()
        _leaving(exc, keeper.loss, isinstance(exc, _InterruptedByLoss))
        raise
    stop()
    _leaving(None, keeper.loss, False)


@asynccontextmanager
async def async_keep(
    client: _AsyncKeepClient,
    lease: LockLease,
    *,
    on_loss: Callable[[OwnershipLost], object] | None = None,
) -> AsyncIterator[AsyncLockGuard]:
    """Renew ``lease`` in a named task while the block runs; on loss cancel the block; yields its guard.

    Args:
        client: The client that renews (``AsyncVolcanoLocks``).
        lease: The held lease to keep.
        on_loss: Called once, from the keeper task, with the ``OwnershipLost``.

    Raises:
        OwnershipLost: The lease was lost (instead of the cancellation it caused); raised after the block.
    """
    task = asyncio.current_task()
    cancelled = False

    def lost(loss: OwnershipLost) -> None:
        nonlocal cancelled
        if task is not None and not cancelled:
            cancelled = True
            task.cancel(msg="volcano lock ownership lost")
        if on_loss is not None:
            on_loss(loss)

    renew: Callable[[LockLease, float], Awaitable[LockLease]] = client.renew_within
    keeper = AsyncLeaseKeeper(
        lease, renew, timing=_timing(client.timeout, lease, stops_block=True), on_loss=lost
    )
    keeper.start()
    exc: BaseException | None = None
    try:
        yield AsyncLockGuard(keeper)
    except BaseException as raised:
        exc = raised
        raise
    finally:
        news = False
        if cancelled and task is not None:
            # Our own cancel is withdrawn; a count left means someone else cancelled the task too.
            news = isinstance(exc, asyncio.CancelledError) and task.uncancel() == 0
        await keeper.stop()
        _leaving(exc, keeper.loss, news)
