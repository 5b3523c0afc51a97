"""Waking a waiting run when another run releases its lock, through Prefect's events.

Under a Prefect worker every waiting run is a process of its own, so waiters cannot share one poll;
polling alone would spend the project's 600 requests a minute on looks. A run that releases a lock
emits `volcano.lock.released` (see `_events`); a waiting run subscribes to that lock's events and
calls the core's `volcano_locks.waiting.wake`, which makes this process's waiters on the key try to
acquire at once; a loss (`volcano.lock.lost`, after a force release) wakes them too. The waiting runs
keep a line from the same events (`WaitingLine`), so on a release only the first in line tries at
once: each run places itself by its own `waiting` event, learns of the runs that started waiting
just before it subscribed by reading Prefect's persisted events a few seconds later (the
subscription's replay has only those already persisted), and drops a first in line that lets a
release pass (a run that crashed while it waited says nothing). Each acquisition
(`volcano.lock.acquired`, with the lease's `expires_at`) is passed to the core's
`volcano_locks.waiting.inform`: the engine's looks, only the safety net here
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
import random
import threading
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from prefect.client.orchestration import get_client
from prefect.events import Event
from prefect.events.clients import get_events_subscriber
from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter, EventResourceFilter
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
SETTLED = 6.0
"""Seconds after subscribing from which a read holds every run that joined before (the persister's
default 5 s, and a second): from then on the first in line goes at once even in a crowd."""
CATCH_UP = (1.5, SETTLED, 20.0)
"""Seconds after subscribing at which a waiting run reads the line's persisted events (Prefect's event
persister stores them every 20 events or 5 s by default; later on a busy server)."""
DRAW = 1.0
"""Seconds within which runs that each take themselves for first, in a crowd whose line is unread,
draw when to try: several times an acquisition event's delivery on a loaded server (at 50 runs'
start, 0.5 s let 16-19 runs try on one release), and short enough for a small line's handoffs."""
CATCH_UP_SPAN = timedelta(minutes=2)  # how far before this run's own wait the read looks
CATCH_UP_PAGE = 50  # the most Prefect's /events/filter answers at once
CATCH_UP_PAGES = 10


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

    def joined(self, at: datetime | None) -> None:
        """This run started waiting `at` (when its own `waiting` event occurred).

        Its own event rarely reaches it: the run emits it before it subscribes, and Prefect's replay
        on subscribing holds only events already persisted (every 5 s by default). A run that does not
        know its own place takes itself for first, so every run tried at once on every release.
        """
        if self.me is not None and at is not None:
            self._since.setdefault(self.me, at)

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
        return self._head() in (None, self.me)

    def _head(self) -> str | None:
        mine = self._since.get(self.me) if self.me is not None else None
        if mine is None:
            return None
        return min(self._since.items(), key=lambda item: (item[1], item[0]))[0]

    def waiting(self, runner: str | None) -> bool:
        """Whether `runner` is in line, as far as this run knows."""
        return runner in self._since

    def crowded(self) -> bool:
        """Whether this run knows of another run in line."""
        return any(runner != self.me for runner in self._since)

    def passed_over(self, at: datetime) -> str | None:
        """The first in line did not take the lock released `at` within the patience: it left the line
        (a run that crashed or was cancelled while it waited says nothing). Return who is dropped.

        Otherwise every later release would again wait out the patience for it, and then send every run
        behind it to try at once. If it is alive after all, it still tries at once on the next release
        (it takes itself for first), so it loses nothing.
        """
        head = self._head()
        if head is None or head == self.me:
            return None
        self._since.pop(head)
        self._done[head] = max(at, self._done.get(head, at))
        return head


class ReleaseListener:
    """Wakes this process's waiters on `key` when a run announces it released `key`.

    Args:
        key: The lock waited for.
        api_url: The waiting client's API URL (only its waiters are woken).
        credential_id: The waiting client's credential fingerprint (likewise).
        me: This run's resource id, to find its place in the line (None: always first).
        joined: When this run's `waiting` event occurred: its place in line.
    """

    def __init__(
        self,
        key: str,
        api_url: str,
        credential_id: str,
        project: str,
        me: str | None = None,
        joined: datetime | None = None,
    ) -> None:
        self.key = key
        self.project = project
        self._api_url = api_url
        self._credential_id = credential_id
        self.line = WaitingLine(me)
        self.line.joined(joined)
        self._joined = joined
        self._last_change: Event | None = None  # the latest release, loss or acquisition delivered
        self._missed_waiters = False  # a run it never heard join the line acquired since it waited
        self._read = False  # a read at least SETTLED s after subscribing put the missing runs in line
        self._draw: Callable[[], float] = random.random
        self.woken = 0
        # The subscriber replays the last minute on connect; an older release says nothing now.
        self._since = datetime.now(UTC) - _SKEW
        self._later: asyncio.Task[None] | None = None
        self._later_for: datetime | None = None  # when the release occurred that `_later` answers

    @property
    def _waiting_since(self) -> datetime:
        """When this run started waiting (else when it started listening, less the skew)."""
        return self._joined or self._since

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

    def _look_if_nothing_heard(self) -> None:
        """One look, if this run is first in line and has heard of no release or acquisition since it
        was refused: a release between its refusal and its subscription has no event here until
        Prefect's server persists it for a read (seen on a busy machine: the waiter then waited out a
        lease released a tenth of a second before it listened). A run behind others leaves the look to
        them: they listened earlier, so they heard the release and the next acquisition says so. The
        look costs one request; a lock still held refuses it."""
        heard = self._last_change is not None and self._last_change.occurred >= self._waiting_since
        if heard or not self.line.first():
            return
        woken = wake(self.key, api_url=self._api_url, credential_id=self._credential_id)
        logger.debug(
            "lock %r: one look, first in line with no release heard since waiting (%d waiter(s))",
            self.key,
            woken,
        )

    def _missed(self, events: list[Event]) -> Event | None:
        """The release among `events` that the subscription missed, if it is the lock's latest change."""
        changes = [e for e in events if e.event in FREED or e.event == ACQUIRED]
        if self._last_change is not None:
            changes.append(self._last_change)
        if not changes:
            return None
        latest = max(changes, key=lambda e: e.occurred)
        delivered = self._last_change is not None and latest.id == self._last_change.id
        if latest.event in FREED and not delivered and latest.occurred >= self._since:
            return latest
        return None

    async def _wake_later(self, event: Event, delay: float | None = None) -> None:
        """Wake after the patience (passing over the first in line), or after a drawn `delay`."""
        if delay is not None:
            await asyncio.sleep(delay)
            self._wake(event, f"after a draw of {delay:.2f} s (first as far as it knows, the line unread)")
            return
        await asyncio.sleep(self.line.patience)
        gone = self.line.passed_over(event.occurred)
        self._wake(event, f"after {self.line.patience:g} s (the first in line, {gone}, did not take it)")

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
        changes = event.event in FREED or event.event == ACQUIRED
        if changes and (self._last_change is None or event.occurred >= self._last_change.occurred):
            self._last_change = event
        runner = _runner(event)
        if (
            event.event == ACQUIRED
            and runner not in (None, self.line.me)
            and not self.line.waiting(runner)
            and event.occurred >= self._waiting_since
        ):
            self._missed_waiters = True  # it waited, and this run never heard it join the line
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
        if self.line.first() and (self._read or not (self._missed_waiters or self.line.crowded())):
            self._wake(event, "at once (first in line)")
            return
        # Behind the first in line: leave it the patience. First as far as this run knows, but in a
        # crowd whose line it has not read yet (the runs that joined just before it subscribed are
        # missing, and each of them may take itself for first too): try after a random draw within
        # DRAW seconds, so the first draw takes the lock and most others hear its acquisition first.
        delay = None if not self.line.first() else self._draw() * DRAW
        self._later = asyncio.get_running_loop().create_task(self._wake_later(event, delay))
        self._later_for = event.occurred

    def _filter(self, since: datetime | None = None) -> EventFilter:
        """The line's events of this lock (occurred from `since` until now, if given)."""
        line = EventFilter(
            event=EventNameFilter(name=[WAITING, ACQUIRED, RELEASED, LOST, SKIPPED]),
            resource=EventResourceFilter(id=[lock_resource_id(self.key, self.project)]),
        )
        if since is not None:
            line.occurred = EventOccurredFilter.model_validate({"since": since})
        return line

    async def _catch_up(self, after: tuple[float, ...] = CATCH_UP) -> None:
        """Read the line's events Prefect has persisted since, `after` seconds from subscribing.

        The subscription's replay holds only persisted events: the runs that started waiting in the
        seconds before this one subscribed are missing from its line, and each of them took itself for
        first. Once Prefect's persister has stored them, one read (a Prefect API call, not a lock
        request) puts them in line. A release the read finds and the subscription missed wakes this
        run as a delivered one would. At the SETTLED read, a run first in line that heard nothing since
        it was refused looks once (`_look_if_nothing_heard`), for a release the persister has not
        stored yet; a look at every subscription cost one request a waiting run, and at 50 runs let go
        at once the runs that took themselves for first all looked before the first release.
        """
        since = (self._joined or datetime.now(UTC)) - CATCH_UP_SPAN
        waited = 0.0
        for at in after:
            await asyncio.sleep(at - waited)
            waited = at
            missed = None
            try:
                events = await self._read_line(since)
            except Exception as exc:  # the line stays as the stream made it: a few more tries, no harm
                logger.debug("lock %r: could not read the line's events (%s)", self.key, exc)
            else:
                for event in events:
                    self.line.saw(event)
                self._read = self._read or at >= SETTLED
                logger.debug(
                    "lock %r: read %d persisted event(s) of the line; first in line: %s",
                    self.key,
                    len(events),
                    self.line.first(),
                )
                missed = self._missed(events)
            if missed is not None:
                self._on(missed)  # wakes as a delivered release would
            elif at == SETTLED:
                self._look_if_nothing_heard()

    async def _read_line(self, since: datetime) -> list[Event]:
        """The line's persisted events since `since`, newest first, at most `CATCH_UP_PAGES` pages."""
        events: list[Event] = []
        async with get_client() as client:
            page = await client.read_events(filter=self._filter(since), limit=CATCH_UP_PAGE)
            for _ in range(CATCH_UP_PAGES):
                events += page.events
                if page.next_page is None:
                    break
                page = await client.read_events_page(str(page.next_page))
        return events

    async def listen(self) -> None:
        """Subscribe and wake on releases until cancelled; give up quietly if events are unreachable."""
        catching_up: asyncio.Task[None] | None = None
        try:
            async with get_events_subscriber(filter=self._filter(), reconnection_attempts=3) as subscriber:
                logger.debug("listening for releases of lock %r", self.key)
                catching_up = asyncio.get_running_loop().create_task(self._catch_up())
                async for event in subscriber:
                    self._on(event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # events are an optimisation: polling still finds the release
            logger.info("no release events for lock %r (%s); waiting by polling alone", self.key, exc)
        finally:
            self._cancel_later()
            if catching_up is not None:
                catching_up.cancel()


def listen_in_thread(
    key: str, api_url: str, credential_id: str, project: str, me: str | None, joined: datetime | None
) -> Callable[[], None]:
    """Start listening for releases of `key` on a daemon thread; return the function that stops it."""
    if not ReleaseListener.available():
        return _nothing
    listener = ReleaseListener(key, api_url, credential_id, project, me, joined)
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
    key: str, api_url: str, credential_id: str, project: str, me: str | None, joined: datetime | None
) -> Callable[[], Awaitable[None]]:
    """Start listening for releases of `key` in a task of the running loop; return its async stop."""
    if not ReleaseListener.available():
        return anothing
    listener = ReleaseListener(key, api_url, credential_id, project, me, joined)
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
