"""Acquisitions whose caller gave up: which endings leave one possibly granted, and their clean-up.

An ``acquire`` that ends without a definite answer (no response, a timeout, a 503 after its one
retry, another 5xx, a garbled reply) or is cancelled mid-flight may still be granted by the server:
the request may have reached it, or be sitting there, delayed, and be served later. Our local
server shows the second case plainly: a request it has read is served after any ``when=before``
fault delay whether or not the client is still connected (``server/app.py`` sleeps, then serves), so
from the client's side *when* such an acquisition lands is undecidable. Nobody but the client knows a
token the client generated, so nobody could ever release that lease: it would block the key, unseen,
until its TTL ran out.

So the client releases it, with the same token, on the keeping lane: at once and then again at
:data:`RELEASE_AT` seconds after the caller gave up (a landing window of about a minute, in a few
requests). A release can only ever free a lease of that very token, so the repeats are harmless; an
acquisition the server serves later than the window is left to its TTL (liveness, never safety: no
one holds its token). ``close`` makes one last round, bounded by one request timeout, then stops.

A token the *caller* supplied is left alone: per the contract such callers own recovery (they retry
with the same token and request id to learn the outcome), and a clean-up release racing that retry
would free the lease the retry just recovered. The wait engine is such a caller.

:class:`Ledger` is the sans-I/O schedule; :class:`SyncReaper` (one daemon thread, alive only while
there is something to release) and :class:`AsyncReaper` (one task) drive it.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from volcano_locks.errors import ProtocolError, ServerError, TransportError, Unavailable, VolcanoError
from volcano_locks.protocol import new_request_id

__all__ = [
    "RELEASE_AT",
    "AsyncReaper",
    "Attempt",
    "Ledger",
    "Orphan",
    "SyncReaper",
    "uncertain",
]

logger = logging.getLogger("volcano_locks.orphans")

RELEASE_AT = (0.0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5, 63.5)
"""Seconds after the caller gave up at which an abandoned acquisition is released (8 requests)."""

_UNCERTAIN = (TransportError, Unavailable, ServerError, ProtocolError)


def uncertain(exc: BaseException) -> bool:
    """Whether an acquisition that ended with ``exc`` may still have been granted by the server.

    Definite refusals (409 contention, 429, 401/403, 400 and client-side validation) leave nothing;
    anything else, including a cancellation or an interrupt, may.
    """
    return not isinstance(exc, VolcanoError) or isinstance(exc, _UNCERTAIN)


@dataclass
class Attempt:
    """One ``acquire`` call as its client sees it: the token, whose it is, and whether anything was sent."""

    token: str = field(repr=False)
    request_id: str
    generated: bool
    sent: bool = False

    @classmethod
    def start(cls, token: str | None, request_id: str | None) -> Attempt:
        """The attempt for a caller's ``token`` and ``request_id`` (each generated when ``None``).

        A supplied value is kept verbatim; the acquisition flow validates it before anything is sent.
        """
        rid = new_request_id() if request_id is None else request_id
        if token is None:
            return cls(str(uuid.uuid4()), rid, generated=True)
        return cls(token, rid, generated=False)

    def abandoned(self, exc: BaseException) -> bool:
        """Whether ending with ``exc`` leaves a lease only this client could release."""
        return self.generated and self.sent and uncertain(exc)


@dataclass(frozen=True)
class Orphan:
    """An acquisition its caller gave up on: the key, the token it was sent with, and when."""

    key: str
    token: str = field(repr=False)
    request_id: str
    gave_up: float


class Ledger:
    """When each orphan is due for its next release (sans-I/O; not thread-safe on its own)."""

    def __init__(self, schedule: tuple[float, ...] = RELEASE_AT) -> None:
        self._schedule = schedule
        self._heap: list[tuple[float, int, int, Orphan]] = []  # (due, sequence, step, orphan)
        self._seq = 0

    def add(self, orphan: Orphan) -> None:
        """Schedule ``orphan``'s releases, the first at ``gave_up + schedule[0]``."""
        self._push(orphan, 0)

    def _push(self, orphan: Orphan, step: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (orphan.gave_up + self._schedule[step], self._seq, step, orphan))

    def next_at(self) -> float | None:
        """When the next release is due (``None``: nothing left to release)."""
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> list[Orphan]:
        """The orphans to release now; each is rescheduled for its next step, if it has one."""
        out: list[Orphan] = []
        while self._heap and self._heap[0][0] <= now:
            _, _, step, orphan = heapq.heappop(self._heap)
            out.append(orphan)
            if step + 1 < len(self._schedule):
                self._push(orphan, step + 1)
        return out

    def drain(self) -> list[Orphan]:
        """Every orphan still scheduled, once each, and forget them all (the last round)."""
        out = list({id(o): o for _, _, _, o in sorted(self._heap)}.values())
        self._heap.clear()
        return out

    def __len__(self) -> int:
        return len(self._heap)


def _report(orphan: Orphan, exc: BaseException | None) -> None:
    if exc is None:
        logger.debug("released abandoned acquisition of %r (request id %s)", orphan.key, orphan.request_id)
    elif isinstance(exc, VolcanoError):
        logger.debug("releasing abandoned acquisition of %r: %s", orphan.key, exc.message)
    else:
        logger.warning("releasing abandoned acquisition of %r failed: %r", orphan.key, exc)


R = TypeVar("R")


class _Reaper(Generic[R]):
    """What both reapers hold: the release call, its timeout, the clock and the ledger of orphans."""

    def __init__(
        self,
        release: Callable[[Orphan, float | None], R],
        timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._release = release
        self._timeout = timeout
        self._clock = clock
        self._ledger = Ledger()
        self._closing = False
        self._open()

    def _open(self) -> None:
        """Make what this kind of reaper runs on (a condition and a thread slot, or a task slot)."""
        raise NotImplementedError


class SyncReaper(_Reaper[None]):
    """Releases a sync client's orphans on one named daemon thread, started when there is one."""

    def _open(self) -> None:
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, key: str, token: str, request_id: str) -> None:
        """Release ``token``'s lease of ``key`` now and on the schedule (ignored once closed)."""
        with self._cond:
            if self._closing:
                return
            self._ledger.add(Orphan(key, token, request_id, self._clock()))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="volcano-locks-reaper", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            for orphan in batch:
                if self._closing:
                    break  # the ledger still holds every orphan with a step left: the last round
                self._attempt(orphan, None)

    def _next_batch(self) -> list[Orphan] | None:
        """Wait for the next due releases; ``None`` when done (after the last round, once closing)."""
        with self._cond:
            while not self._closing:
                at = self._ledger.next_at()
                if at is None:
                    self._thread = None
                    return None
                now = self._clock()
                if at <= now:
                    return self._ledger.due(now)
                self._cond.wait(at - now)
            last = self._ledger.drain()
        self._last_round(last)
        return None

    def _attempt(self, orphan: Orphan, timeout: float | None) -> None:
        try:
            self._release(orphan, timeout)
        except Exception as exc:  # best effort: the schedule tries again; the thread must not die
            _report(orphan, exc)
        else:
            _report(orphan, None)

    def _last_round(self, orphans: list[Orphan]) -> None:
        ends = self._clock() + self._timeout
        for orphan in orphans:
            left = ends - self._clock()
            if left <= 0:
                logger.info("client closed: %d abandoned acquisitions left to their TTL", len(orphans))
                return
            self._attempt(orphan, left)

    def close(self) -> None:
        """Release what is pending once more (bounded by one request timeout), then stop the thread."""
        with self._cond:
            self._closing = True
            thread = self._thread
            self._cond.notify()
        if thread is not None:
            # A release in progress (one timeout), then the last round (one timeout).
            thread.join(2 * self._timeout + 1.0)


class AsyncReaper(_Reaper[Awaitable[None]]):
    """Releases an async client's orphans from one task on the loop that gave them up."""

    def _open(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None

    def add(self, key: str, token: str, request_id: str) -> None:
        """Release ``token``'s lease of ``key`` now and on the schedule (call from the client's loop)."""
        if self._closing:
            return
        self._ledger.add(Orphan(key, token, request_id, self._clock()))
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="volcano-locks-reaper")
        elif self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        wake = self._wake
        assert wake is not None
        while not self._closing:
            at = self._ledger.next_at()
            if at is None:
                return
            wait = at - self._clock()
            if wait > 0:
                wake.clear()
                try:
                    async with asyncio.timeout(wait):
                        await wake.wait()
                except TimeoutError:
                    pass
                continue
            for orphan in self._ledger.due(self._clock()):
                if self._closing:
                    break  # the ledger still holds every orphan with a step left: the last round
                await self._attempt(orphan, None)
        ends = self._clock() + self._timeout
        last = self._ledger.drain()
        for orphan in last:
            left = ends - self._clock()
            if left <= 0:
                logger.info("client closed: %d abandoned acquisitions left to their TTL", len(last))
                return
            await self._attempt(orphan, left)

    async def _attempt(self, orphan: Orphan, timeout: float | None) -> None:
        try:
            await self._release(orphan, timeout)
        except Exception as exc:  # best effort: the schedule tries again; the task must not die
            _report(orphan, exc)
        else:
            _report(orphan, None)

    async def aclose(self) -> None:
        """Release what is pending once more (bounded by one request timeout), then end the task."""
        self._closing = True
        task = self._task
        if task is None or task.done():
            return
        if self._wake is not None:
            self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), 2 * self._timeout + 1.0)
        except TimeoutError:
            task.cancel()
