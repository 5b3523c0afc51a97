"""Holding one run's lock: the sync and async shells around one set of decisions (`Holding`).

With `on_contention="wait"` the run waits in the core's wait engine (one engine, one request budget
per process); the engine's reports are told in the run log, and when the wait starts the run also
listens for the lock's release events, where Prefect's events reach it, to be woken on a release.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager, contextmanager
from typing import Any

from prefect import State

from prefect_volcano._events import LockEvents
from prefect_volcano._report import RunReport, Scope, WaitReporter, run_logger
from prefect_volcano._spec import LockSpec
from prefect_volcano._wake import ReleaseListener, anothing, listen_in_task, listen_in_thread
from prefect_volcano.credentials import async_client_for, sync_client_for
from volcano_locks import (
    AsyncLockGuard,
    AsyncVolcanoLocks,
    LockContention,
    LockGuard,
    LockLease,
    OwnershipLost,
    VolcanoError,
    VolcanoLocks,
    WaitTimeout,
)
from volcano_locks.guard import AsyncLockContext, LockContext
from volcano_locks.waiting import WaitPolicy

EVENTS_WAIT_POLICY = WaitPolicy(poll=1.0, factor=1.6, cap=60.0)
"""Looks while release events wake the waiter: backing off to one a minute (the safety net only)."""

__all__ = ["Holding", "hold", "hold_async"]

Guard = LockGuard | AsyncLockGuard


class Holding:
    """One run's attempt at its lock: what it decided, what it holds, and what it tells the user.

    Args:
        spec: The decorator's checked arguments.
        key: The rendered lock key.
        scope: What the lock wraps (a task or a flow run).
        client: The run's locks client.
        cancels: Whether loss cancels the body (async) rather than interrupting it (sync).
        listen: Starts listening for releases when the wait starts; returns how to stop.
    """

    def __init__(
        self,
        spec: LockSpec,
        key: str,
        scope: Scope,
        client: VolcanoLocks | AsyncVolcanoLocks,
        *,
        cancels: bool,
        listen: Callable[[str, str, str, str | None], Callable[[], Any]],
    ) -> None:
        self.spec = spec
        self.key = key
        self.client = client
        self.report = RunReport(key, scope, LockEvents(key, client.api_url), run_logger(), cancels=cancels)
        self.guard: Guard | None = None
        self.skipped: State[None] | None = None
        self.lease: LockLease | None = None
        self._listen = listen
        self.stop_listening: Callable[[], Any] = lambda: None
        self.waiter = WaitReporter(self.report, on_start=self._start_listening)

    def _start_listening(self) -> None:
        client = self.client
        self.stop_listening = self._listen(
            self.key, client.api_url, client.credential_id, self.report.events.runner
        )

    def open(self) -> Any:
        """The core's `with_lock` for this run (waiting in the core's engine with `on_contention="wait"`)."""
        waits = self.spec.on_contention == "wait"
        context: LockContext | AsyncLockContext = self.client.with_lock(
            self.key,
            self.spec.ttl,
            on_contention="wait" if waits else "raise",
            wait_timeout=self.spec.wait_timeout,
            interrupt=True,
            on_loss=self.lost,
            on_waiting=self.waiter if waits else None,
            # Where releases are announced (events), looks are only the safety net for a holder that
            # dies without releasing, and the engine looks at such a holder's expiry anyway.
            wait_policy=EVENTS_WAIT_POLICY if waits and ReleaseListener.available() else None,
        )
        return context

    def contended(self, exc: LockContention) -> None:
        """Decide what a contention means under `skip` (skip) or `fail` (fail, naming the holder).

        Raises:
            LockContention: With `on_contention="fail"`; any `OwnershipLost` or `WaitTimeout` as is.
        """
        if isinstance(exc, OwnershipLost | WaitTimeout) or self.spec.on_contention == "wait":
            raise exc
        if self.spec.on_contention == "skip":
            self.skipped = self.report.skipped(exc.holder)
            return
        message = self.report.contention_message(exc, self.spec.on_contention)
        self.report.log.error("%s", message)
        raise LockContention(
            message, status=exc.status, code=exc.code, request_id=exc.request_id, holder=exc.holder
        ) from exc

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


@contextmanager
def hold(spec: LockSpec, key: str, scope: Scope) -> Iterator[Holding]:
    """Hold `key` per `spec` around a sync body; `holding.guard` is None when the run skips."""
    with sync_client_for(spec.credentials.get()) as client:
        holding = Holding(spec, key, scope, client, cancels=False, listen=listen_in_thread)
        try:
            with ExitStack() as stack:
                try:
                    holding.entered(stack.enter_context(holding.open()))
                except LockContention as exc:
                    holding.contended(exc)
                finally:
                    holding.stop_listening()
                yield holding
        except VolcanoError as exc:
            holding.failed(exc)
            raise
        holding.finished()


# -------------------------------------------------------------------------------------- async shell


@asynccontextmanager
async def hold_async(spec: LockSpec, key: str, scope: Scope) -> AsyncIterator[Holding]:
    """Hold `key` per `spec` around an async body (cancelled on loss); see `hold`."""
    async with async_client_for(await spec.credentials.aget()) as client:
        holding = Holding(spec, key, scope, client, cancels=True, listen=listen_in_task)
        holding.stop_listening = anothing
        try:
            async with AsyncExitStack() as stack:
                try:
                    holding.entered(await stack.enter_async_context(holding.open()))
                except LockContention as exc:
                    holding.contended(exc)
                finally:
                    await holding.stop_listening()
                yield holding
        except VolcanoError as exc:
            holding.failed(exc)
            raise
        holding.finished()
