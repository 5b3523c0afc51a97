"""Waking a waiting run when another run releases its lock, through Prefect's events.

Under a Prefect worker every waiting run is a process of its own, so waiters cannot share one poll;
polling alone would spend the project's 600 requests a minute on looks. A run that releases a lock
emits `volcano.lock.released` (see `_events`); a waiting run subscribes to that one event of that one
lock and calls the core's `volcano_locks.waiting.wake`, which makes this process's waiters on the key
try to acquire at once. The core's wait engine keeps polling as the safety net, backing off to a
slow pace (and looking at a crashed holder's `expires_at`), so waiting works, more slowly, wherever
the events cannot be reached.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta

from prefect.events.clients import get_events_subscriber
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.settings import PREFECT_API_URL

from prefect_volcano._events import LOCK_RESOURCE_PREFIX, lock_resource_id
from volcano_locks.waiting import wake

__all__ = ["alistening", "listening"]

logger = logging.getLogger("prefect_volcano.wake")

RELEASED = f"{LOCK_RESOURCE_PREFIX}released"
WAKE_ENV = "VOLCANO_PREFECT_WAKE"
"""Set to `off` to wait by polling alone (no events subscription), e.g. where events are blocked."""
_SKEW = timedelta(seconds=2)  # events of the last seconds before we listened still count


class ReleaseListener:
    """Wakes this process's waiters on `key` whenever a run announces it released `key`.

    Args:
        key: The lock waited for.
        api_url: The waiting client's API URL (only its waiters are woken).
        credential_id: The waiting client's credential fingerprint (likewise).
    """

    def __init__(self, key: str, api_url: str, credential_id: str) -> None:
        self.key = key
        self._api_url = api_url
        self._credential_id = credential_id
        self.woken = 0
        # The subscriber replays the last minute on connect; an older release says nothing now.
        self._since = datetime.now(UTC) - _SKEW

    @staticmethod
    def available() -> bool:
        """Whether to listen: a Prefect API is configured, and `VOLCANO_PREFECT_WAKE` is not `off`."""
        return bool(PREFECT_API_URL.value()) and os.environ.get(WAKE_ENV, "on").strip().lower() != "off"

    async def listen(self) -> None:
        """Subscribe and wake on each release until cancelled; give up quietly if events are unreachable."""
        event_filter = EventFilter(
            event=EventNameFilter(name=[RELEASED]),
            resource=EventResourceFilter(id=[lock_resource_id(self.key)]),
        )
        try:
            async with get_events_subscriber(filter=event_filter, reconnection_attempts=3) as subscriber:
                logger.debug("listening for releases of lock %r", self.key)
                async for event in subscriber:
                    if event.event == RELEASED and event.occurred >= self._since:
                        woken = wake(self.key, api_url=self._api_url, credential_id=self._credential_id)
                        self.woken += woken
                        logger.debug(
                            "lock %r released elsewhere (fencing token %s): woke %d waiter(s)",
                            self.key,
                            event.payload.get("fencing_token"),
                            woken,
                        )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # events are an optimisation: polling still finds the release
            logger.info("no release events for lock %r (%s); waiting by polling alone", self.key, exc)


@contextmanager
def listening(key: str, api_url: str, credential_id: str) -> Iterator[None]:
    """Listen for releases of `key` on a daemon thread (its own event loop) for the block's duration."""
    if not ReleaseListener.available():
        yield
        return
    listener = ReleaseListener(key, api_url, credential_id)
    loop = asyncio.new_event_loop()
    task = loop.create_task(listener.listen())

    def run() -> None:
        try:
            loop.run_until_complete(task)
        except asyncio.CancelledError:
            pass  # stopped: the wait is over
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    # The run's context carries Prefect's settings (API URL, auth) into the listener's thread.
    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(run,), name=f"volcano-lock-wake:{key}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        loop.call_soon_threadsafe(task.cancel)
        thread.join(timeout=10)


@asynccontextmanager
async def alistening(key: str, api_url: str, credential_id: str) -> AsyncIterator[None]:
    """Listen for releases of `key` in a task of the running loop for the block's duration."""
    if not ReleaseListener.available():
        yield
        return
    listener = ReleaseListener(key, api_url, credential_id)
    task = asyncio.get_running_loop().create_task(listener.listen(), name=f"volcano-lock-wake:{key}")
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
