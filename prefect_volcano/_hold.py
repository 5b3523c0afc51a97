"""Holding one run's lock: the sync and async shells around one set of decisions (`Holding`).

With `on_contention="wait"` the run waits in the core's wait engine (one engine, one request budget
per process); the engine's reports are told in the run log, and when the wait starts the run also
listens for the lock's release events, where Prefect's events reach it, to be woken on a release.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager, contextmanager
from datetime import datetime
from typing import Any

from prefect import State

from prefect_volcano._events import LockEvents
from prefect_volcano._report import RunReport, Scope, WaitReporter, run_logger, run_who
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
from volcano_locks.integration import AsyncLockContext, LockContext, WaitPolicy
from volcano_locks.once import OnceRecord

EVENTS_WAIT_POLICY = WaitPolicy(poll=1.0, factor=1.6, cap=60.0, at_expiry=True, mode="event_woken")
"""Looks while release events wake the waiter and acquisitions are announced: only the safety net, at
the known holder's expiry plus the grace (a crashed holder) or within about a minute, whichever is first
(a holder outside Prefect releases without an event), else backing off to one a minute."""

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
        once_key: The rendered business key, with ``spec.ledger`` (``None``: no run-once).
    """

    def __init__(
        self,
        spec: LockSpec,
        key: str,
        scope: Scope,
        client: VolcanoLocks | AsyncVolcanoLocks,
        *,
        cancels: bool,
        listen: Callable[[str, str, str, str, str | None, datetime | None], Callable[[], Any]],
        once_key: str | None = None,
    ) -> None:
        self.spec = spec
        self.key = key
        self.once_key = once_key
        self.client = client
        events = LockEvents(key, client.api_url, client.project)
        self.report = RunReport(key, scope, events, run_logger(), cancels=cancels, project=client.project)
        self.guard: Guard | None = None
        self.skipped: State[None] | None = None
        self.lease: LockLease | None = None
        self._listen = listen
        self.stop_listening: Callable[[], Any] = lambda: None
        self.waiter = WaitReporter(self.report, on_start=self._start_listening)

    def _start_listening(self, joined: datetime | None) -> None:
        client = self.client
        self.stop_listening = self._listen(
            self.key, client.api_url, client.credential_id, client.project, self.report.events.runner, joined
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
            once=None if self.once_key is None else self.spec.ledger.once(self.once_key, who=run_who()),
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
        if guard.duplicate is not None:
            self.duplicated(guard.duplicate)

    @property
    def body_guard(self) -> Guard | None:
        """The guard the body runs under: ``None`` when it does not run (skipped, or a duplicate)."""
        return self.guard if self.skipped is None else None

    def duplicated(self, record: OnceRecord) -> None:
        """The business key was done by an earlier run: end as a duplicate, with its recorded result."""
        self.skipped = self.report.duplicate(record)

    def lost(self, exc: OwnershipLost) -> None:
        """The keeper's loss callback (from its thread or task): tell it once."""
        self.report.loss(exc, self.guard.lease if self.guard is not None else None)

    def failed(self, exc: VolcanoError) -> None:
        """Tell a lock error that ends the run; errors the body raised itself pass untold."""
        guard = self.guard
        if isinstance(exc, WaitTimeout) and guard is None:
            self.report.gave_up(exc, self.spec.wait_timeout)
        elif isinstance(exc, OwnershipLost) and (
            guard is None or guard.lost or guard.release_outcome is None
        ):
            # At entry (no safe renewal window left), while the body ran, or found by the release
            # (the lease was force-released or taken before it arrived): the body's run was not safe.
            self.lost(exc)

    def ended(self) -> None:
        """However the run ended: tell how the release went, then finish recording inside the run.

        A body that raised is released like one that returned, and says so; a release that did not go
        through is a warning (the lease lapses), never the run's failure.
        """
        guard = self.guard
        try:
            outcome = guard.release_outcome if guard is not None and not guard.lost else None
            if outcome is not None:
                self.lease = outcome.lease
                self.report.release_ended(outcome)
        finally:
            self.report.close()

    def finished(self) -> LockLease | None:
        """After a clean exit: the last lease (None when skipped); a loss is raised, never success."""
        guard = self.guard
        if guard is None:
            return None
        if guard.lost:  # the core raises the loss on exit; never report success after one
            raise guard.loss or OwnershipLost(f"ownership of lock {self.key!r} was lost")
        return self.lease


# --------------------------------------------------------------------------------------- sync shell


@contextmanager
def hold(spec: LockSpec, key: str, scope: Scope, once_key: str | None = None) -> Iterator[Holding]:
    """Hold `key` per `spec` around a sync body; the body runs when `holding.runs_body`."""
    with sync_client_for(spec.credentials.get()) as client:
        holding = Holding(spec, key, scope, client, cancels=False, listen=listen_in_thread, once_key=once_key)
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
        finally:
            holding.ended()
        holding.finished()


# -------------------------------------------------------------------------------------- async shell


@asynccontextmanager
async def hold_async(
    spec: LockSpec, key: str, scope: Scope, once_key: str | None = None
) -> AsyncIterator[Holding]:
    """Hold `key` per `spec` around an async body (cancelled on loss); see `hold`."""
    async with async_client_for(await spec.credentials.aget()) as client:
        holding = Holding(spec, key, scope, client, cancels=True, listen=listen_in_task, once_key=once_key)
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
        finally:
            await asyncio.to_thread(contextvars.copy_context().run, holding.ended)  # joins the view's writes
        holding.finished()
