"""Holding one run's lock: the sync and async shells around one set of decisions (`Holding`).

The first attempt never waits: a contention is seen (and told, with the holder's fencing token)
before the run decides to skip, fail or wait. Only then does a waiting run enter the core's wait,
with a reminder every minute and, where Prefect's events reach it, a wake-up on each release.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager, contextmanager
from typing import Any, Literal

from prefect import State

from prefect_volcano._events import LockEvents
from prefect_volcano._report import RunReport, Scope, WaitReporter, run_logger
from prefect_volcano._spec import LockSpec
from prefect_volcano._wake import alistening, listening
from prefect_volcano.credentials import async_client_for, sync_client_for
from volcano_locks import (
    AsyncLockGuard,
    AsyncVolcanoLocks,
    LockContention,
    LockGuard,
    LockLease,
    LockState,
    OwnershipLost,
    VolcanoError,
    VolcanoLocks,
    WaitTimeout,
)
from volcano_locks.guard import AsyncLockContext, LockContext

__all__ = ["Holding", "hold", "hold_async"]

Guard = LockGuard | AsyncLockGuard


class Holding:
    """One run's attempt at its lock: what it decided, what it holds, and what it tells the user."""

    def __init__(self, spec: LockSpec, key: str, scope: Scope, api_url: str, *, cancels: bool) -> None:
        self.spec = spec
        self.key = key
        self.report = RunReport(key, scope, LockEvents(key, api_url), run_logger(), cancels=cancels)
        self.guard: Guard | None = None
        self.skipped: State[None] | None = None
        self.lease: LockLease | None = None
        self.waiter = WaitReporter(self.report)

    def open(self, client: VolcanoLocks | AsyncVolcanoLocks, policy: Literal["raise", "wait"]) -> Any:
        """The core's `with_lock` for this run: `"raise"` first, `"wait"` once the run decided to wait."""
        waits = policy == "wait"
        context: LockContext | AsyncLockContext = client.with_lock(
            self.key,
            self.spec.ttl,
            on_contention=policy,
            wait_timeout=self.spec.wait_timeout if waits else None,
            interrupt=True,
            on_loss=self.lost,
            on_waiting=self.waiter if waits else None,
        )
        return context

    def contended(self, exc: LockContention) -> bool:
        """Decide what a contention on the first attempt means; return whether to wait.

        Raises:
            LockContention: With `on_contention="fail"`, naming the lock and the holder.
        """
        if isinstance(exc, OwnershipLost | WaitTimeout):
            raise exc
        policy = self.spec.on_contention
        if policy == "skip":
            self.skipped = self.report.skipped(exc.holder)
            return False
        if policy == "fail":
            message = self.report.contention_message(exc, policy)
            self.report.log.error("%s", message)
            raise LockContention(
                message, status=exc.status, code=exc.code, request_id=exc.request_id, holder=exc.holder
            ) from exc
        return True

    def waiting(self, holder: LockState | None) -> None:
        """Tell the user the run waits (naming the holder's fencing token); the engine reports after."""
        self.waiter.started(holder)

    def entered(self, guard: Guard) -> None:
        """Record and tell that the lock is held."""
        self.guard = guard
        lease = guard.lease
        if lease is not None:
            self.report.acquired(lease)

    def lost(self, exc: OwnershipLost) -> None:
        """The keeper's loss callback (from its thread or task): tell it once."""
        self.report.loss(exc, self.guard.lease if self.guard is not None else None)

    def failed(self, exc: VolcanoError) -> None:
        """Tell a lock error that ends the run; errors the body raised itself pass untold."""
        if isinstance(exc, WaitTimeout) and self.guard is None:
            self.report.gave_up(exc, self.spec.wait_timeout)
        elif isinstance(exc, OwnershipLost) and (self.guard is None or self.guard.lost):
            self.lost(exc)  # at entry (no safe renewal window left) or while the body ran

    def finished(self) -> LockLease | None:
        """After a clean exit: tell the release and return the last lease (None when skipped)."""
        guard = self.guard
        if guard is None:
            return None
        if guard.lost:  # the core raises the loss on exit; never report success after one
            raise guard.loss or OwnershipLost(f"ownership of lock {self.key!r} was lost")
        self.lease = guard.lease
        if self.lease is not None:
            self.report.released(self.lease)
        return self.lease


# --------------------------------------------------------------------------------------- sync shell


def _peek(client: VolcanoLocks, key: str) -> LockState | None:
    # A 409 need not name the holder; one read does, once per wait, so the user learns who holds it.
    try:
        return client.get(key)
    except VolcanoError:
        return None


@contextmanager
def hold(spec: LockSpec, key: str, scope: Scope) -> Iterator[Holding]:
    """Hold `key` per `spec` around a sync body; `holding.guard` is None when the run skips."""
    with sync_client_for(spec.credentials.get()) as client:
        holding = Holding(spec, key, scope, client.api_url, cancels=False)
        try:
            with ExitStack() as stack:
                try:
                    holding.entered(stack.enter_context(holding.open(client, "raise")))
                except LockContention as exc:
                    if holding.contended(exc):
                        holding.waiting(exc.holder or _peek(client, key))
                        with listening(
                            key, client.api_url, client.credential_id, holding.report.events.runner
                        ):
                            holding.entered(stack.enter_context(holding.open(client, "wait")))
                yield holding
        except VolcanoError as exc:
            holding.failed(exc)
            raise
        holding.finished()


# -------------------------------------------------------------------------------------- async shell


async def _apeek(client: AsyncVolcanoLocks, key: str) -> LockState | None:
    try:
        return await client.get(key)
    except VolcanoError:
        return None


@asynccontextmanager
async def hold_async(spec: LockSpec, key: str, scope: Scope) -> AsyncIterator[Holding]:
    """Hold `key` per `spec` around an async body (cancelled on loss); see `hold`."""
    async with async_client_for(await spec.credentials.aget()) as client:
        holding = Holding(spec, key, scope, client.api_url, cancels=True)
        try:
            async with AsyncExitStack() as stack:
                try:
                    holding.entered(await stack.enter_async_context(holding.open(client, "raise")))
                except LockContention as exc:
                    if holding.contended(exc):
                        holding.waiting(await _apeek(client, key) if exc.holder is None else exc.holder)
                        async with alistening(
                            key, client.api_url, client.credential_id, holding.report.events.runner
                        ):
                            holding.entered(await stack.enter_async_context(holding.open(client, "wait")))
                yield holding
        except VolcanoError as exc:
            holding.failed(exc)
            raise
        holding.finished()
