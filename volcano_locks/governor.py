"""One request governor per process and credential: the project's 600 requests a minute, spent in order.

Volcano gives a project 600 lock requests a minute, shared by every holder, waiter, read and release of
every process using it. A holder's renewal is the one request that must never be refused; a waiter's
look is the one that can always wait. So every request of the core clients is accounted here, per
``(API URL, service-key fingerprint)``, and requests are admitted in this order:

1. **keeping** a lease (renew, release) and any direct call a user makes: sent at once, never delayed;
2. **acquiring for a waiter** (its first attempt, or when the lock was just seen free or announced
   released): drawn from the waiting budget ahead of reads;
3. **reading for waiting** (``get`` while a lock is held): drawn from the waiting budget, a token bucket
   filled at the process's *waiting rate* (below), handed out first come, first served. Each waiting
   key has at most one request outstanding (the wait engine in :mod:`volcano_locks.waiting` keeps one
   poll per key), so the budget is spread round-robin over the keys being waited on, and the process's
   waiting cost is flat in the number of waiting keys and waiters.

**The waiting rate adapts to the whole project.** Waiters in other processes cannot be seen; a 429 is
the one signal every process gets of them. The contract's window is fixed and aligned to clock minutes,
and ``Retry-After`` is the whole seconds left in it, so a 429 with ``Retry-After`` ``R`` says the
project spent its 600 in ``60 - R`` seconds: everything together ran ``60 / (60 - R)`` times too fast.
On the first 429 of a window (only the first: one window, one cut) the waiting rate ``w`` becomes::

    f     = (60 - R) / 60                     the share of the window that the 600 lasted
    used  = min(w, waiting sent this window * 60 / (60 - R))    what this process really spent waiting
    keep  = keeping sent this window * 60 / (60 - R)            what its holders spend a minute
    w'    = max(MIN_WAIT_RATE, CUT_MARGIN * (f * used - (1 - f) * keep))

that is, the process's whole rate (``used + keep``) is scaled by ``f`` and its holders, who cannot slow
down, keep theirs: the waiting share pays for both. If every process does this, the project's next
window totals about ``f * 600 / f = 600``; :data:`CUT_MARGIN` (0.7) puts it under the edge by enough
for a few quiet windows (a short blackout is seen only by the processes that send in it, so those
that do cut for those that do not).

After each *quiet* window (this process waited and saw no 429) the rate climbs back by
``min(ceiling / 40, max(0.5, w / 20))`` (:data:`RECOVERY_SHARE`, :data:`MIN_RECOVERY`): a twentieth
of itself, so N waiting processes sharing ``W`` a minute climb about ``W / 20`` a window together
whatever N is (at most 3 a minute each at the default budget of 120, at least half a request each).
The window that finds the edge overshoots by about that climb and runs out ``60 * climb / (600 +
climb)`` seconds early: 1 to 2 s when holders leave 300 a minute to 3-12 waiting processes, up to 5 s
for 24 (the simulated fleets in ``tests/core/test_governor.py``). A holder renewing at a third of
its TTL ``t`` whose renewal is refused retries at ``Retry-After`` (:mod:`volcano_locks.renewal`), so
it rides out a blackout of ``R`` seconds while ``R < 2 t / 3 - 1`` (less one request's time):
2.3 s at ``ttl=5``, 9 s at ``ttl=15``, 19 s at ``ttl=30``.

**Cold start.** A process knows nothing of the fleet when it starts, and a fleet whose budgets and
holders sum past 600 would find the edge in its first window by the whole excess: six processes
starting at the default 120 beside holders spending 100 ran the window out 15 s early and every
holder at ``ttl=15`` lost its lock. So a process starts at half its ceiling (:data:`START_SHARE`:
60 a minute at the default budget, one look a second: what a triggerer needs to notice a release on
one key as quickly as before) and, until its first 429, grows by :data:`START_GROWTH` (15 %) after
each window in which it used at least half its rate: a fleet growing together crosses the edge by at
most 15 % of what it then spends,
so the window that finds the edge runs out at most ``60 * 0.15 / 1.15`` = 7.8 s early, inside what a
holder at ``ttl=15`` survives (9 s, below). The bucket holds at least :data:`MIN_BURST` requests,
so a fresh process's first attempts and looks go at once; a waiter's first attempt is billed like any
waiting request (a triggerer restarting with 500 deferred tasks must not spend the project's minute on
their first attempts), though a 429's blackout does not hold it.
A window in which the process waited little (under half its rate) does not raise the rate: a rate
is earned by use, so a process that idled at a high rate cannot spend it all at once later.

The rate never exceeds the ceiling: ``min(wait_budget, 600 - keep)``, where ``keep``
is what this process's own keeping requests (renewals, releases, direct calls) cost in the last whole
window. Each keeper renewing at a third of a TTL of ``t`` seconds costs ``180 / t`` a minute, so five
holders at ``ttl=15`` leave ``600 - 60`` for waiting; the governor measures this instead of asking the
keepers, because it already counts every request the process sends.

After a 429 anywhere in the process, waiting requests stop until ``Retry-After`` has passed, however
they were booked: the wait engine checks :attr:`Governor.blocked_until` again just before it sends.
``Retry-After`` is rounded up to whole seconds, so the blackout already ends at or after the window's
boundary; the new window counts afresh however many processes arrive in its first second. Only a small
random spread (:data:`BLACKOUT_SPREAD`, half a second) remains, to stagger the server's load and let the
holders' renewals, which retry at exactly ``Retry-After`` (:mod:`volcano_locks.renewal`), go first.

Arithmetic (written down in the README): one holder renewing at a third of a TTL of ``t`` seconds costs
``max(180 / t, 1)`` requests a minute; the waiting rate caps what one process spends waiting, whatever
the number of keys; a waiting process on one key costs at most ``60 / cap`` looks a minute once its
backoff has grown (:class:`volcano_locks.waiting.WaitPolicy`). Windows are located by the wall clock
(injectable, like the lease clock): a client clock off by a few seconds miscounts that many seconds of
a window, no more.
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from volcano_locks.clock import lease_clock
from volcano_locks.errors import InvalidRequest

__all__ = [
    "BLACKOUT_SPREAD",
    "BUSY_SHARE",
    "CUT_MARGIN",
    "DEFAULT_WAIT_BUDGET",
    "ENV_WAIT_BUDGET",
    "MIN_BURST",
    "MIN_RECOVERY",
    "MIN_WAIT_RATE",
    "QUOTA",
    "RECOVERY_SHARE",
    "START_GROWTH",
    "START_SHARE",
    "WINDOW",
    "Governor",
    "GovernorStats",
    "validate_wait_budget",
]

DEFAULT_WAIT_BUDGET = 120
"""Requests a minute one process may spend waiting (a fifth of the project's 600), unless configured."""
ENV_WAIT_BUDGET = "VOLCANO_WAIT_BUDGET"
"""Environment variable that sets the waiting budget for clients that are not given one."""
QUOTA = 600
"""The contract's lock requests per project per window."""
WINDOW = 60.0
"""The contract's quota window in seconds, aligned to clock minutes."""
MAX_WAIT_BUDGET = QUOTA
BLACKOUT_SPREAD = 0.5
"""Up to this many seconds of random spread after a ``Retry-After`` (which already ends the window)."""
CUT_MARGIN = 0.7
"""After a 429 the waiting rate lands this far under the edge the window showed."""
RECOVERY_SHARE = 1 / 40
"""A quiet window raises the waiting rate by twice this share of itself, at most this share of its ceiling."""
START_SHARE = 0.5
"""A process starts waiting at this share of its ceiling (see "Cold start" in the module docstring)."""
START_GROWTH = 1.15
"""Until its first 429, each busy quiet window multiplies the waiting rate by this, up to the ceiling."""
BUSY_SHARE = 0.5
"""A window raises the rate only if the process's waiting used at least this share of it."""
MIN_BURST = 10.0
"""The waiting bucket holds at least this many requests, whatever the rate."""
MIN_RECOVERY = 0.5
"""... and by at least this many requests a minute."""
MIN_WAIT_RATE = 2.0
"""The waiting rate never falls below this many requests a minute (one look every 30 s), or the budget."""
_BURST_SECONDS = 5.0  # the bucket holds five seconds' worth of the rate (at least MIN_BURST requests)


def validate_wait_budget(value: object, *, source: str = "wait_budget") -> int:
    """Check a waiting budget: a whole number of requests a minute, 1 to 600.

    Args:
        value: The budget (an int, or a string of one when read from the environment or a form).
        source: Where it came from, for the message.

    Raises:
        InvalidRequest: It is not a whole number from 1 to 600.
    """
    number: object = value
    if isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            number = value
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= MAX_WAIT_BUDGET:
        raise InvalidRequest(
            f"invalid {source} {value!r}: expected a whole number of requests a minute, 1..{MAX_WAIT_BUDGET}"
        )
    return number


def _budget_from_env(environ: Mapping[str, str]) -> int | None:
    raw = environ.get(ENV_WAIT_BUDGET)
    if raw is None or not raw.strip():
        return None
    return validate_wait_budget(raw, source=ENV_WAIT_BUDGET)


@dataclass(frozen=True)
class GovernorStats:
    """What a governor has seen so far (for tests, benchmarks and diagnostics).

    Attributes:
        sent: Requests sent, by operation (``acquire``, ``renew``, ``release``, ``get``, ``force_release``).
        waiting: Of those, the requests the wait engine sent.
        rate_limited: Replies that were 429, by operation.
        wait_budget: The waiting budget in force, requests a minute.
        blocked_until: The lease-clock time until which waiting requests are held after a 429.
        wait_rate: The adaptive waiting rate in force now, requests a minute (at most ``wait_ceiling``).
        wait_ceiling: What the rate may climb back to: the budget, less the keeping requests of the
            last whole window, at most the quota.
        keeping: Keeping requests (everything but waiting) sent in the last whole window.
        limited_seen: 429s seen, all operations together.
        windows_cut: Windows in which a 429 cut the waiting rate (at most one cut a window).
    """

    sent: Mapping[str, int]
    waiting: int
    rate_limited: Mapping[str, int]
    wait_budget: int
    blocked_until: float
    wait_rate: float = 0.0
    wait_ceiling: float = 0.0
    keeping: int = 0
    limited_seen: int = 0
    windows_cut: int = 0


class Governor:
    """The request governor of one credential in this process (use :meth:`for_credential`).

    Args:
        wait_budget: Requests a minute the wait engine may spend, for every key together (the ceiling
            of the adaptive waiting rate).
        clock: The lease clock (injectable for tests): when requests may be sent.
        rng: Uniform [0, 1) draws, for the spread after a 429.
        wall: Wall-clock seconds since the epoch (injectable for tests): where the quota's
            clock-aligned windows begin and end.
        start_rate: The waiting rate to start at, requests a minute (default: half the budget, see
            the module docstring; a process that knows its share of the fleet may start at it).
    """

    _registry_lock: ClassVar[threading.Lock] = threading.Lock()
    _registry: ClassVar[dict[tuple[str, str], Governor]] = {}

    def __init__(
        self,
        wait_budget: int = DEFAULT_WAIT_BUDGET,
        *,
        clock: Callable[[], float] = lease_clock,
        rng: Callable[[], float] = random.random,
        wall: Callable[[], float] = time.time,
        start_rate: float | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._rng = rng
        self._wall = wall
        self._budget = validate_wait_budget(wait_budget)
        self._start_rate = start_rate
        self._start()

    def _start(self) -> None:
        """Everything a governor learns, as a fresh process knows it (no lock: construction or reset)."""
        start = self._budget * START_SHARE if self._start_rate is None else self._start_rate
        self._rate = max(self._floor(), min(float(self._budget), start))
        self._tokens = self._capacity()
        self._updated = self._clock()
        self._blocked_until = -math.inf
        self._cut_until = -math.inf  # lease-clock end of the window whose 429 cut the rate
        self._sent: Counter[str] = Counter()
        self._waiting = 0
        self._limited: Counter[str] = Counter()
        self._windows_cut = 0
        # The current window (by the wall clock) and what this process sent in it.
        self._window = self._window_of(self._wall())
        self._window_sent = 0
        self._window_waiting = 0
        self._window_limited = False
        self._keeping = 0  # keeping requests of the last whole window

    @classmethod
    def for_credential(
        cls,
        api_url: str,
        credential_id: str,
        wait_budget: int | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> Governor:
        """Return this process's governor for the credential, creating it on first use.

        A budget given explicitly (or, failing that, by ``VOLCANO_WAIT_BUDGET``) replaces the budget in
        force: the latest configured client decides.
        """
        explicit = (
            validate_wait_budget(wait_budget)
            if wait_budget is not None
            else _budget_from_env(os.environ if environ is None else environ)
        )
        with cls._registry_lock:
            governor = cls._registry.get((api_url, credential_id))
            if governor is None:
                governor = cls._registry[(api_url, credential_id)] = cls(explicit or DEFAULT_WAIT_BUDGET)
            elif explicit is not None:
                governor.set_wait_budget(explicit)
        return governor

    @classmethod
    def reset_all(cls) -> None:
        """Make every governor of this process start afresh: rate, bucket, blackout and counts.

        For test suites, where each test stands for a new process; the governors stay the same
        objects, so clients already built keep theirs. Budgets set so far are kept.
        """
        with cls._registry_lock:
            governors = list(cls._registry.values())
        for governor in governors:
            with governor._lock:
                governor._start()

    @property
    def wait_budget(self) -> int:
        """The waiting budget in force, requests a minute (the ceiling of the adaptive rate)."""
        return self._budget

    @property
    def wait_rate(self) -> float:
        """The adaptive waiting rate in force now, requests a minute."""
        with self._lock:
            self._roll(self._wall())
            return self._rate

    @property
    def blocked_until(self) -> float:
        """Lease-clock time until which waiting requests are held after a 429 (``-inf``: not held)."""
        return self._blocked_until

    def set_wait_budget(self, wait_budget: int) -> None:
        """Change the waiting budget (requests a minute); the rate moves by as much, within the ceiling."""
        budget = validate_wait_budget(wait_budget)
        with self._lock:
            self._refill(self._clock())
            self._rate, self._budget = self._rate + budget - self._budget, budget
            self._rate = max(self._floor(), min(self._rate, self._ceiling()))
            self._tokens = min(self._tokens, self._capacity())

    @staticmethod
    def _window_of(wall: float) -> int:
        return math.floor(wall / WINDOW)

    def _floor(self) -> float:
        return min(MIN_WAIT_RATE, float(self._budget))

    def _ceiling(self) -> float:
        return max(self._floor(), float(min(self._budget, QUOTA - self._keeping)))

    def _capacity(self) -> float:
        return max(MIN_BURST, self._rate / 60 * _BURST_SECONDS)

    def _refill(self, now: float) -> None:
        rate = self._rate / 60
        self._tokens = min(self._capacity(), self._tokens + max(0.0, now - self._updated) * rate)
        self._updated = max(self._updated, now)

    def _roll(self, wall: float) -> None:
        """Close the windows that ended before ``wall``: a quiet one with waiting in it raises the rate."""
        window = self._window_of(wall)
        if window <= self._window:
            return
        self._refill(self._clock())  # tokens earned at the old rate stay earned
        quiet = self._window_waiting >= BUSY_SHARE * self._rate and not self._window_limited
        self._keeping = self._window_sent - self._window_waiting if window == self._window + 1 else 0
        ceiling = self._ceiling()
        if quiet and not self._windows_cut:
            self._rate *= START_GROWTH  # no edge found yet: probe for it, 15 % more a busy window
        elif quiet:
            self._rate += min(ceiling * RECOVERY_SHARE, max(MIN_RECOVERY, self._rate * RECOVERY_SHARE * 2))
        self._rate = min(self._rate, ceiling)
        self._tokens = min(self._tokens, self._capacity())
        self._window = window
        self._window_sent = self._window_waiting = 0
        self._window_limited = False

    def reserve(self, *, priority: bool = False, honour_blackout: bool = True) -> float:
        """Reserve one waiting request; return the lease-clock time at which it may be sent.

        Reads are served in the order they are reserved, at the waiting rate. A ``priority`` request
        (an acquisition for a waiter that has reason to expect success) goes ahead of them: it may be
        sent now, and its cost delays the reads that come after it. ``honour_blackout`` (every waiting
        request but a waiter's very first attempt) also keeps it until a 429's ``Retry-After`` has
        passed; a 429 that arrives after the booking is honoured at send time by the wait engine
        (:attr:`blocked_until`). An unused reservation is handed back with :meth:`refund`.
        """
        with self._lock:
            now = self._clock()
            self._roll(self._wall())
            self._refill(now)
            at = now if priority or self._tokens >= 1 else now + (1 - self._tokens) / (self._rate / 60)
            self._tokens -= 1
            if honour_blackout:
                at = max(at, self._blocked_until)
            return at

    def refund(self) -> None:
        """Hand back a reservation that was not used (the wait ended or was cancelled first)."""
        with self._lock:
            self._tokens = min(self._capacity(), self._tokens + 1)

    def note_sent(self, op: str) -> None:
        """Count one request attempt of ``op``."""
        with self._lock:
            self._roll(self._wall())
            self._sent[op] += 1
            self._window_sent += 1

    def window_share(self) -> float:
        """This process's requests in the current minute (this credential) as a share of the :data:`QUOTA`."""
        with self._lock:
            self._roll(self._wall())
            return self._window_sent / QUOTA

    def note_waiting(self) -> None:
        """The next request counted is the wait engine's (reported as ``waiting`` in :meth:`stats`)."""
        with self._lock:
            self._roll(self._wall())
            self._waiting += 1
            self._window_waiting += 1

    def note_rate_limited(self, op: str, retry_after: float | None) -> None:
        """A 429 answered ``op``: hold waiting requests until ``Retry-After``; cut the rate once a window.

        Without a ``Retry-After`` the seconds left in the window are read off the wall clock.
        """
        with self._lock:
            now, wall = self._clock(), self._wall()
            self._roll(wall)
            left = (self._window + 1) * WINDOW - wall
            pause = left if retry_after is None else retry_after
            self._limited[op] += 1
            self._window_limited = True
            until = now + pause + BLACKOUT_SPREAD * self._rng()
            self._blocked_until = max(self._blocked_until, until)
            if now >= self._cut_until:
                self._cut_until = now + pause
                self._cut(min(max(pause, 1.0), WINDOW - 1.0), now)

    def _cut(self, left: float, now: float) -> None:
        """Scale the process's whole rate by the share of the window the quota lasted (module docstring)."""
        self._refill(now)
        spent = WINDOW - left
        share = spent / WINDOW
        used = min(self._rate, self._window_waiting * WINDOW / spent)
        keep = (self._window_sent - self._window_waiting) * WINDOW / spent
        self._rate = max(self._floor(), CUT_MARGIN * (share * used - (1 - share) * keep))
        self._tokens = min(self._tokens, self._capacity())
        self._windows_cut += 1

    def stats(self) -> GovernorStats:
        """A snapshot of what this governor has seen."""
        with self._lock:
            self._roll(self._wall())
            return GovernorStats(
                sent=dict(self._sent),
                waiting=self._waiting,
                rate_limited=dict(self._limited),
                wait_budget=self._budget,
                blocked_until=self._blocked_until,
                wait_rate=self._rate,
                wait_ceiling=self._ceiling(),
                keeping=self._keeping,
                limited_seen=sum(self._limited.values()),
                windows_cut=self._windows_cut,
            )
