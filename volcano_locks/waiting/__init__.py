"""The one wait engine: ``wait_acquire`` for the core clients, the Airflow trigger and Prefect alike.

A waiter wants a held lock. Every request it makes is paid from the project's 600 a minute, so the
engine spends deliberately:

* **One poll per key.** Waiters on the same key in one process (sync: every thread; async: one event
  loop) queue first come, first served behind one *head*. Only the head looks at the lock, and when
  it is free only the head acquires, with its own ownership token and TTL: one release wakes one
  waiter, not the herd. When the head leaves (acquired, timed out, cancelled), the next one takes over
  the key's knowledge (holder, backoff) and carries on.
* **Backoff that learns from what it sees.** The first attempt goes straight to ``acquire`` (an
  uncontended lock costs one request). While the lock stays held, the head looks (``get``) after
  ``poll`` seconds, then longer each time up to ``cap`` (jittered ±35 %, :data:`JITTER`). Each look tells it
  something: the **fencing token moved** since the last look (or the lock was seen free and then
  taken by someone else) means the lock is changing hands, a line of short jobs is passing, so the
  backoff resets to ``poll``, grows by ``factor`` only, and the next handoff is seen within about
  ``poll`` seconds; the **same holder seen again** (same token) means the holder is not passing the
  lock on soon, so the backoff grows twice as fast (``factor`` squared) and a long holder costs little.
  When the holder's ``expires_at`` comes sooner and it is
  *not* seen renewing, the look is moved to ``expires_at`` plus the server's one-second takeover
  grace: a crashed holder is taken over on time, a renewing one is not polled at its (ever-moving)
  expiry. See :func:`poll_delay`. Arithmetic of a line: ``n`` waiting processes, each holding for ``h``
  seconds in turn, pass in about ``n * (h + poll / 2)`` seconds once they have seen the token move
  (each backing off towards ``cap`` on its own would leave gaps that grow towards ``cap`` as the line
  thins), and while the line passes each waiter costs about ``60 / poll`` looks a minute.
* **Governed.** Every look and attempt draws from the process's waiting budget in
  :class:`volcano_locks.governor.Governor`, shared by every key and waiter of the credential and
  handed out in order, so a process waiting on 1,000 keys costs what one waiting on 10 does (its keys
  are simply looked at less often); the budget's rate adapts to the whole project's 429s (see the
  governor's docstring). After a 429 anywhere in the process, looks stop until ``Retry-After`` has
  passed: the flow checks the blackout again at send time, so a look booked before the 429 is not
  sent inside it. Only a waiter's very first attempt ignores a blackout: it is an acquisition like
  any direct call (an uncontended lock costs one request), not yet a waiting request.
* **Woken, not only polling.** :func:`wake` makes the heads waiting on a key try to acquire at once.
  The clients call it when they release a lock in this process; integrations call it when they are
  told of a release elsewhere (Prefect events). Polling stays as the safety net. Where releases are
  announced, :func:`inform` also tells the waiters of each new holder, and a policy with
  :attr:`~WaitPolicy.at_expiry` looks only when a known holder's lease would end unrenewed (its
  ``expires_at`` plus the grace) or, for a longer lease, about ``cap`` seconds on (its holder may
  release early where no event announces it): a line of short holds costs no looks, a crashed holder
  is taken over about a second after its lease ends. Where something watches the holder itself at no
  lock request (the Airflow triggerer asks Airflow for the holder's task state), :func:`vouch` tells
  the waiters that this holder's end will be announced: while the looks find it, they come only every
  vouched ``cap`` seconds (and at its lease's end if it stops renewing), however long it holds.

The engine's decisions are one sans-I/O generator (:func:`~volcano_locks.waiting.flow._wait_flow`) that
yields "wait until" and "send" steps (:mod:`volcano_locks._steps`); :func:`wait_acquire` drives it with
threads and :func:`async_wait_acquire` with asyncio, through one shared run.
The waiter keeps one ownership token for all its attempts, so an acquisition whose outcome was
uncertain (no answer twice, or 503s) is recovered by the next attempt with the same token and request id.

The parts, one module each:

* :mod:`~volcano_locks.waiting.policy`: the backoff's bounds and the next look's delay (:class:`WaitPolicy`,
  :func:`poll_delay`, :data:`FLOOR`, :data:`GRACE`, :data:`JITTER`);
* :mod:`~volcano_locks.waiting.waiter`: one waiter and its state (:class:`WaiterState`);
* :mod:`~volcano_locks.waiting.registry`: the per-key queues shared in a process (:class:`SharedPolls`),
  :func:`wake`, :func:`inform` and :func:`vouch`;
* :mod:`~volcano_locks.waiting.flow`: the sans-I/O flow;
* :mod:`~volcano_locks.waiting.drivers`: the sync and async drivers.
"""

from __future__ import annotations

from volcano_locks.waiting.drivers import AsyncWaitClient, SyncWaitClient, async_wait_acquire, wait_acquire
from volcano_locks.waiting.flow import _wait_flow as _wait_flow  # the tests drive the flow itself
from volcano_locks.waiting.policy import (
    FLOOR,
    GRACE,
    JITTER,
    Contention,
    OnWaiting,
    WaitPolicy,
    poll_delay,
    until_ended,
)
from volcano_locks.waiting.registry import SharedPolls, inform, vouch, wake
from volcano_locks.waiting.registry import _KeyWait as _KeyWait
from volcano_locks.waiting.waiter import WaiterState
from volcano_locks.waiting.waiter import _Waiter as _Waiter

__all__ = [
    "FLOOR",
    "GRACE",
    "JITTER",
    "AsyncWaitClient",
    "Contention",
    "OnWaiting",
    "SharedPolls",
    "SyncWaitClient",
    "WaitPolicy",
    "WaiterState",
    "async_wait_acquire",
    "inform",
    "poll_delay",
    "until_ended",
    "vouch",
    "wait_acquire",
    "wake",
]
