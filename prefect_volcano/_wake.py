"""Waking a waiting run when another run releases its lock, through Prefect's events.

Under a Prefect worker every waiting run is a process of its own, so waiters cannot share one poll;
polling alone would spend the project's 600 requests a minute on looks. A run that releases a lock
emits `volcano.lock.released` (see `_events`); a waiting run subscribes to that lock's events and
calls the core's `volcano_locks.waiting.wake`, which makes this process's waiters on the key try to
acquire at once; a loss (`volcano.lock.lost`, after a force release) wakes them too. The waiting runs
keep a line from the same events (`WaitingLine`), so on a release only the first in line tries at
once. Each acquisition (`volcano.lock.acquired`, with the lease's `expires_at`) is passed to the
core's `volcano_locks.waiting.inform`: the engine's looks, only the safety net here
(`WaitPolicy.at_expiry`), are then due when that lease would end unrenewed, so a line of short holds
costs no looks and a crashed holder (no release, no event) is taken over about a second after its
lease ends, by the first in line (the others leave it `patience` seconds). Where the events cannot be
reached, the engine polls on its own, more slowly.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from prefect.events import Event
from prefect.events.clients import get_events_subscriber
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.settings import PREFECT_API_URL

from prefect_volcano._events import LOCK_RESOURCE_PREFIX, lock_resource_id
from volcano_locks import LockState
from volcano_locks.integration import inform, wake

__all__ = ["WAKE_ENV", "ReleaseListener", "WaitingLine", "anothing", "listen_in_task", "listen_in_thread"]

logger = logging.getLogger("prefect_volcano.wake")

RELEASED = f"{LOCK_RESOURCE_PREFIX}released"
WAITING = f"{LOCK_RESOURCE_PREFIX}waiting"
ACQUIRED = f"{LOCK_RESOURCE_PREFIX}acquired"
SKIPPED = f"{LOCK_RESOURCE_PREFIX}skipped"
LOST = f"{LOCK_RESOURCE_PREFIX}lost"
FREED = (RELEASED, LOST)
"""Events after which the lock may be free now: a release, and a loss (a force release drops the lease;
its holder emits `lost` when its next renewal is refused)."""
WAKE_ENV = "VOLCANO_PREFECT_WAKE"
"""Set to `off` to wait by polling alone (no events subscription), e.g. where events are blocked."""
_SKEW = timedelta(seconds=2)  # events of the last seconds before we listened still count


def _runner(event: Event) -> str | None:
    """The task run (else flow run) an event of ours speaks for, as a resource id."""
    for role in ("task-run", "flow-run"):
        for related in event.related:
            if related.role == role:
                return related.id
    return None


def _holder(event: Event) -> LockState | None:
    """The lease an `acquired` event announces (None: its payload lacks the facts)."""
    token, expires = event.payload.get("fencing_token"), event.payload.get("expires_at")
    if not isinstance(token, int) or not isinstance(expires, str):
        return None
    try:
        expires_at = datetime.fromisoformat(expires)
    except ValueError:
        return None
    if expires_at.tzinfo is None:
        return None
    return LockState(held=True, expires_at=expires_at, fencing_token=token)


class WaitingLine:
    """The runs waiting for one lock, as their events tell, first come first; sans-I/O.

    On a release only the first run in line tries at once; the others give it `patience` seconds to
    announce that it acquired, and try themselves if it does not (it may have crashed or given up).
    So a release costs about one acquisition, not one per waiting process.

    Args:
        me: This run's resource id (`prefect.task-run.<id>` or `prefect.flow-run.<id>`), or None.
        patience: Seconds the others leave the first in line.
    """

    def __init__(self, me: str | None, patience: float = 2.0) -> None:
        self.me = me
        self.patience = patience
        self._since: dict[str, datetime] = {}
        self._done: dict[str, datetime] = {}

    def saw(self, event: Event) -> None:
        """Take in a waiting, acquired, released or skipped event of the lock."""
        runner = _runner(event)
        if runner is None:
            return
        if event.event == WAITING:
            done = self._done.get(runner)
            if done is None or done < event.occurred:  # events may arrive out of order
                self._since.setdefault(runner, event.occurred)
        else:
            self._done[runner] = max(event.occurred, self._done.get(runner, event.occurred))
            self._since.pop(runner, None)

    def first(self) -> bool:
        """Whether this run is first in line (or cannot tell: then it tries, which is always safe)."""
        mine = self._since.get(self.me) if self.me is not None else None
        if mine is None:
            return True
        return all((since, runner) >= (mine, self.me) for runner, since in self._since.items())


class ReleaseListener:
    """Wakes this process's waiters on `key` when a run announces it released `key`.

    Args:
        key: The lock waited for.
        api_url: The waiting client's API URL (only its waiters are woken).
        credential_id: The waiting client's credential fingerprint (likewise).
        me: This run's resource id, to find its place in the line (None: always first).
    """

    def __init__(
        self, key: str, api_url: str, credential_id: str, project: str, me: str | None = None
    ) -> None:
        self.key = key
        self.project = project
        self._api_url = api_url
        self._credential_id = credential_id
        self.line = WaitingLine(me)
        self.woken = 0
        # The subscriber replays the last minute on connect; an older release says nothing now.
        self._since = datetime.now(UTC) - _SKEW
        self._later: asyncio.Task[None] | None = None
        self._later_for: datetime | None = None  # when the release occurred that `_later` answers

    @staticmethod
    def available() -> bool:
        """Whether to listen: a Prefect API is configured, and `VOLCANO_PREFECT_WAKE` is not `off`."""
        return bool(PREFECT_API_URL.value()) and os.environ.get(WAKE_ENV, "on").strip().lower() != "off"

    def _wake(self, event: Event, how: str) -> None:
        woken = wake(self.key, api_url=self._api_url, credential_id=self._credential_id)
        self.woken += woken
        logger.debug(
            "lock %r released elsewhere (fencing token %s): woke %d waiter(s) %s",
            self.key,
            event.payload.get("fencing_token"),
            woken,
            how,
        )

    def _look_once_subscribed(self) -> None:
        """One look now that releases reach us: a release between this run's refusal and its
        subscription has no event here when Prefect's server had not yet stored it for the replay
        (seen on a busy machine: the waiter then waited out a lease released a tenth of a second
        before it listened). The look costs one request; a lock still held refuses it."""
        woken = wake(self.key, api_url=self._api_url, credential_id=self._credential_id)
        logger.debug(
            "lock %r: one look on subscribing, for a release just before it (%d waiter(s))", self.key, woken
        )

    async def _wake_later(self, event: Event) -> None:
        await asyncio.sleep(self.line.patience)
        self._wake(event, f"after {self.line.patience:g} s (the first in line did not take it)")

    def _cancel_later(self) -> None:
        if self._later is not None:
            self._later.cancel()
            self._later, self._later_for = None, None

    def _inform(self, event: Event) -> None:
        """Tell the engine of the new holder: look when its lease would end unrenewed, not before."""
        holder = _holder(event)
        if holder is None:
            return
        behind = 0.0 if self.line.first() else self.line.patience
        inform(self.key, holder, api_url=self._api_url, credential_id=self._credential_id, behind=behind)

    def _on(self, event: Event) -> None:
        logger.debug("event %s of %s at %s", event.event, _runner(event), event.occurred.isoformat())
        self.line.saw(event)  # a release, like an acquisition or a skip, ends its run's place in line
        if event.event == ACQUIRED:
            self._inform(event)
            # Someone took the lock after the release we deferred to the first in line: wait for the
            # next release. An acquisition from before that release (delivered late) says nothing.
            if self._later_for is not None and event.occurred >= self._later_for:
                self._cancel_later()
            return
        if event.event not in FREED or event.occurred < self._since:
            return
        self._cancel_later()
        if self.line.first():
            self._wake(event, "at once (first in line)")
        else:
            self._later = asyncio.get_running_loop().create_task(self._wake_later(event))
            self._later_for = event.occurred

    async def listen(self) -> None:
        """Subscribe and wake on releases until cancelled; give up quietly if events are unreachable."""
        event_filter = EventFilter(
            event=EventNameFilter(name=[WAITING, ACQUIRED, RELEASED, LOST, SKIPPED]),
            resource=EventResourceFilter(id=[lock_resource_id(self.key, self.project)]),
        )
        try:
            async with get_events_subscriber(filter=event_filter, reconnection_attempts=3) as subscriber:
                logger.debug("listening for releases of lock %r", self.key)
                self._look_once_subscribed()
                async for event in subscriber:
                    self._on(event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # events are an optimisation: polling still finds the release
            logger.info("no release events for lock %r (%s); waiting by polling alone", self.key, exc)
        finally:
            self._cancel_later()


def listen_in_thread(
    key: str, api_url: str, credential_id: str, project: str, me: str | None
) -> Callable[[], None]:
    """Start listening for releases of `key` on a daemon thread; return the function that stops it."""
    if not ReleaseListener.available():
        return _nothing
    listener = ReleaseListener(key, api_url, credential_id, project, me)
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

    def stop() -> None:
        loop.call_soon_threadsafe(task.cancel)
        thread.join(timeout=10)

    return stop


def listen_in_task(
    key: str, api_url: str, credential_id: str, project: str, me: str | None
) -> Callable[[], Awaitable[None]]:
    """Start listening for releases of `key` in a task of the running loop; return its async stop."""
    if not ReleaseListener.available():
        return anothing
    listener = ReleaseListener(key, api_url, credential_id, project, me)
    task = asyncio.get_running_loop().create_task(listener.listen(), name=f"volcano-lock-wake:{key}")

    async def stop() -> None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    return stop


def _nothing() -> None:
    return None


async def anothing() -> None:
    """Stop nothing (no listener was started)."""
    return None
