"""Watching the holder's task try through Airflow, so a waiter looks at the lock the moment it may be free.

A lock's holder is a task try that Airflow runs; Airflow knows when that try ends (success, failure,
a ``kill -9`` its supervisor reports, a user's mark or clear), and asking it costs no Volcano request.
So a waiter that knows who holds its lock (the holder provenance record,
:mod:`airflow_provider_volcano.records.holder`, sealed: a record whose seal
fails is no record) asks Airflow for that try's state every
:data:`WATCH_EVERY` seconds and wakes its key's waiters (:func:`volcano_locks.waiting.wake`) when:

- the try leaves ``running``: the holder released the lock at the end of its body (or is about to);
  the woken waiter's acquisition is the look, at once, however far its backoff had grown;
- a try that left ``running`` leaves a lease behind (it crashed, or was killed): the lease can be
  taken over at its ``expires_at`` plus the server's grace second, and the waiters are woken then
  (and :data:`EXPIRY_LOOKS` times a second apart after it, for clocks that disagree a little);
- the holder record names another try (the lock changed hands): the waiters' backoff learns it.

The Volcano cost of all this is one wake (an acquisition from the waiting budget) per change of the
holder's try, one read of the lock when a try ended, and the expiry looks; at most
:data:`WAKES_PER_MINUTE` wakes a minute per key whatever the records say (a record is a claim: a
forged one can cost a few looks, never a release). A release is seen within a second or so of Airflow
recording the end of the holder's try. So while Airflow says the watched try runs (asked within the
last :data:`REPORTED_WITHIN` seconds), the watch vouches for its fencing token
(:func:`volcano_locks.waiting.vouch`): the waiters' own looks at that holder come only every
:data:`VOUCHED_LOOKS_EVERY` seconds, as the safety net for an end Airflow does not see (a lease lost
while the task still runs, a worker host gone until Airflow's heartbeat timeout), however long the
hold; a holder that stops renewing is still looked at when its lease ends.

:class:`HolderWatch` decides (no I/O, time passed in); :func:`look_at_holder` is its driver in a
trigger's event loop (Airflow calls through :func:`airflow_provider_volcano.runtime.airflow_calls.ask`,
bounded and off the loop).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from airflow_provider_volcano import _handoff
from airflow_provider_volcano.runtime.airflow_calls import ask
from volcano_locks import VolcanoError
from volcano_locks.integration import GRACE, vouch, wake

if TYPE_CHECKING:
    from airflow_provider_volcano.records.holder import HolderRecord
    from volcano_locks import AsyncVolcanoLocks, LockState

__all__ = [
    "EXPIRY_LOOKS",
    "REPORTED_WITHIN",
    "VOUCHED_LOOKS_EVERY",
    "WAKES_PER_MINUTE",
    "WATCH_EVERY",
    "HolderWatch",
    "look_at_holder",
]

WATCH_EVERY = 1.0
"""Seconds between two looks of a waiter at its lock's holder (records and task states, through Airflow)."""
WAKES_PER_MINUTE = 12
"""The most wakes a watch gives its key's waiters in a minute, whatever the records say."""
EXPIRY_LOOKS = 3
"""Wakes at a dead holder's expiry plus the grace second, one second apart."""
VOUCHED_LOOKS_EVERY = 60.0
"""Seconds between the waiters' own looks at a holder whose running try the watch vouches for."""
REPORTED_WITHIN = 30.0
"""The watch vouches for a running try only if Airflow reported its state this recently (seconds)."""
RUNNING = "running"

_Try = tuple[str, str, str, int, int, int]  # dag, run, task, map index, try, fencing token


def _try_of(record: HolderRecord) -> _Try:
    return (
        record.dag_id,
        record.run_id,
        record.task_id,
        record.map_index,
        record.try_number,
        record.fencing_token,
    )


class HolderWatch:
    """When to wake a key's waiters, from what Airflow says of the holder's try (no I/O).

    :param wakes_per_minute: the most wakes in any 60 s.
    """

    def __init__(self, *, wakes_per_minute: int = WAKES_PER_MINUTE) -> None:
        self._try: _Try | None = None
        self._running = False
        self._ended = False  # the watched try left running (its lease, if any, ends by release or expiry)
        self._wants_lock = False  # a read of the lock would say when a lease left behind expires
        self._expiry_looks: list[float] = []  # wall-clock times of planned wakes
        self._wakes: deque[float] = deque()
        self._wakes_per_minute = wakes_per_minute
        self._state: object = ...
        self._reported_at = -math.inf  # when Airflow last reported the watched try's state

    @property
    def ended(self) -> bool:
        """Whether the watched holder's try has left ``running`` (what the waiting lines say)."""
        return self._ended

    @property
    def ended_state(self) -> object:
        """The state the watched try ended in (``None``: cleared), or ``...`` while it has not ended."""
        return self._state if self._ended else ...

    def vouched(self, now: float) -> int | None:
        """The watched try's fencing token while Airflow says it runs (its end will be seen), else ``None``.

        :param now: the wall-clock time (epoch seconds): a state older than :data:`REPORTED_WITHIN`
            vouches for nothing (Airflow calls that keep failing must not slow the waiters' looks).
        """
        if self._try is None or not self._running or self._ended or now - self._reported_at > REPORTED_WITHIN:
            return None
        return self._try[-1]

    @property
    def wants_lock(self) -> bool:
        """Whether the driver should read the lock once (the holder's try ended: when does its lease?)."""
        return self._wants_lock

    def saw(self, record: HolderRecord | None, state: object, now: float) -> bool:
        """Fold in one look at the holder record and its try's state; ``True``: wake the waiters now.

        :param record: the holder record (``None``: none).
        :param state: the record's task instance state from Airflow; anything but a ``str`` or
            ``None`` means Airflow did not report it (nothing is concluded).
        :param now: the wall-clock time (epoch seconds).
        """
        if record is None:
            return False
        reported = state is None or isinstance(state, str)
        if reported:
            self._state, self._reported_at = state, now
        running = state == RUNNING
        watched = _try_of(record)
        if watched != self._try:
            known = self._try is not None
            self._try, self._running, self._ended, self._expiry_looks = watched, running, False, []
            self._wants_lock = False
            if reported and not running:
                self._ended = self._wants_lock = True
                return self._allowed(now)  # a holder whose try is over already: one look
            return known and self._allowed(now)  # the lock changed hands: the backoff learns it
        if not reported:
            return False
        if self._running and not running:
            self._running, self._ended, self._wants_lock = False, True, True
            return self._allowed(now)
        self._running = self._running or running
        return False

    def saw_lock(self, lock: LockState | None, now: float) -> None:
        """Fold in the lock read after the watched try ended: plan wakes at its lease's expiry.

        Only a lease with the watched record's fencing token is the ended try's; any other holder is
        the waiters' business (their own looks follow it).
        """
        self._wants_lock = False
        if self._try is None or lock is None or not lock.held or lock.expires_at is None:
            return
        if lock.fencing_token != self._try[-1]:
            return
        first = lock.expires_at.timestamp() + GRACE + 0.1
        self._expiry_looks = [max(now, first) + i for i in range(EXPIRY_LOOKS)]

    def due(self, now: float) -> bool:
        """Whether a planned expiry wake is due at ``now`` (each is given once)."""
        if not self._expiry_looks or self._expiry_looks[0] > now:
            return False
        while self._expiry_looks and self._expiry_looks[0] <= now:
            self._expiry_looks.pop(0)
        return self._allowed(now)

    def _allowed(self, now: float) -> bool:
        while self._wakes and now - self._wakes[0] >= 60.0:
            self._wakes.popleft()
        if len(self._wakes) >= self._wakes_per_minute:
            return False
        self._wakes.append(now)
        return True


async def look_at_holder(
    watch: HolderWatch,
    key: str,
    record: HolderRecord | None,
    client: AsyncVolcanoLocks,
    *,
    state_of: Callable[[HolderRecord], object] | None = None,
    clock: Callable[[], float] | None = None,
) -> bool:
    """One look of a trigger's watch at ``key``'s holder: ask Airflow its try's state, wake if due.

    :param watch: the key's :class:`HolderWatch` (one per key and event loop).
    :param key: the lock key.
    :param record: the holder record just read (``None``: none).
    :param client: the triggers' client (one read of the lock when the holder's try ended).
    :param state_of: the try's task instance state (default: Airflow's, through the Task SDK).
    :param clock: wall-clock time (default: :func:`time.time`).
    :return: whether the key's waiters were woken.
    """
    now = clock or time.time
    state: object = _handoff._NOT_REPORTED
    if record is not None:
        state = await ask(
            f"the state of {record.names()}", state_of or _handoff.task_instance_state, record, default=state
        )
    woken = watch.saw(record, state, now())
    # Its end will be seen here: the waiters' own looks at it are the safety net only (or withdrawn).
    vouch(
        key,
        watch.vouched(now()),
        cap=VOUCHED_LOOKS_EVERY,
        api_url=client.api_url,
        credential_id=client.credential_id,
    )
    if watch.wants_lock:
        try:
            lock = await client.get(key)
        except VolcanoError:
            lock = None
        watch.saw_lock(lock, now())
    if watch.due(now()):
        woken = True
    if woken:
        wake(key)
    return woken
