"""One request governor per process and credential: the project's 600 requests a minute, spent in order.

Volcano gives a project 600 lock requests a minute, shared by every holder, waiter, read and release of
every process using it. A holder's renewal is the one request that must never be refused; a waiter's
look is the one that can always wait. So every request of the core clients is accounted here, per
``(API URL, service-key fingerprint)``, and requests are admitted in this order:

1. **keeping** a lease (renew, release) and any direct call a user makes: sent at once, never delayed;
2. **acquiring for a waiter** (its first attempt, or when the lock was just seen free or announced
   released): drawn from the waiting budget ahead of reads;
3. **reading for waiting** (``get`` while a lock is held): drawn from the waiting budget, a token bucket
   of ``wait_budget`` requests a minute for the whole process (default :data:`DEFAULT_WAIT_BUDGET`),
   handed out first come, first served. Each waiting key has at most one request outstanding (the
   wait engine in :mod:`volcano_locks.waiting` keeps one poll per key), so the budget is spread
   round-robin over the keys being waited on, and the process's waiting cost is flat in the number of
   waiting keys and waiters.

After a 429 anywhere in the process, waiting requests stop until ``Retry-After`` has passed, plus a
random spread of up to :data:`BLACKOUT_SPREAD` seconds so that processes do not all come back in the
window's first second. Renewals keep their own retry policy inside their safe window
(:mod:`volcano_locks.renewal`).

Arithmetic (written down in the README): one holder renewing at a third of a TTL of ``t`` seconds costs
``max(180 / t, 1)`` requests a minute; the waiting budget caps what one process spends waiting,
whatever the number of keys; a waiting process on one key costs at most ``60 / cap`` looks a minute
once its backoff has grown (:class:`volcano_locks.waiting.WaitPolicy`).
"""

from __future__ import annotations

import math
import os
import random
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from volcano_locks.clock import lease_clock
from volcano_locks.errors import InvalidRequest

__all__ = [
    "BLACKOUT_SPREAD",
    "DEFAULT_WAIT_BUDGET",
    "ENV_WAIT_BUDGET",
    "Governor",
    "GovernorStats",
    "validate_wait_budget",
]

DEFAULT_WAIT_BUDGET = 120
"""Requests a minute one process may spend waiting (a fifth of the project's 600), unless configured."""
ENV_WAIT_BUDGET = "VOLCANO_WAIT_BUDGET"
"""Environment variable that sets the waiting budget for clients that are not given one."""
MAX_WAIT_BUDGET = 600
BLACKOUT_SPREAD = 5.0
"""Up to this many seconds of random spread after a ``Retry-After``."""
_BURST_SECONDS = 5.0  # the bucket holds five seconds' worth of budget (at least one request)


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
    """

    sent: Mapping[str, int]
    waiting: int
    rate_limited: Mapping[str, int]
    wait_budget: int
    blocked_until: float


class Governor:
    """The request governor of one credential in this process (use :meth:`for_credential`).

    Args:
        wait_budget: Requests a minute the wait engine may spend, for every key together.
        clock: The lease clock (injectable for tests).
        rng: Uniform [0, 1) draws, for the spread after a 429.
    """

    _registry_lock: ClassVar[threading.Lock] = threading.Lock()
    _registry: ClassVar[dict[tuple[str, str], Governor]] = {}

    def __init__(
        self,
        wait_budget: int = DEFAULT_WAIT_BUDGET,
        *,
        clock: Callable[[], float] = lease_clock,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._rng = rng
        self._budget = validate_wait_budget(wait_budget)
        self._tokens = self._capacity()
        self._updated = clock()
        self._blocked_until = -math.inf
        self._sent: Counter[str] = Counter()
        self._waiting = 0
        self._limited: Counter[str] = Counter()

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

    @property
    def wait_budget(self) -> int:
        """The waiting budget in force, requests a minute."""
        return self._budget

    @property
    def blocked_until(self) -> float:
        """Lease-clock time until which waiting requests are held after a 429 (``-inf``: not held)."""
        return self._blocked_until

    def set_wait_budget(self, wait_budget: int) -> None:
        """Change the waiting budget (requests a minute)."""
        budget = validate_wait_budget(wait_budget)
        with self._lock:
            self._refill(self._clock())
            self._budget = budget
            self._tokens = min(self._tokens, self._capacity())

    def _capacity(self) -> float:
        return max(1.0, self._budget / 60 * _BURST_SECONDS)

    def _refill(self, now: float) -> None:
        rate = self._budget / 60
        self._tokens = min(self._capacity(), self._tokens + max(0.0, now - self._updated) * rate)
        self._updated = max(self._updated, now)

    def reserve(self, *, priority: bool = False, honour_blackout: bool = True) -> float:
        """Reserve one waiting request; return the lease-clock time at which it may be sent.

        Reads are served in the order they are reserved, at the budget's rate. A ``priority`` request
        (an acquisition for a waiter that has reason to expect success) goes ahead of them: it may be
        sent now, and its cost delays the reads that come after it. ``honour_blackout`` (every waiting
        request but a waiter's very first attempt) also keeps it until a 429's ``Retry-After`` has
        passed. An unused reservation is handed back with :meth:`refund`.
        """
        with self._lock:
            now = self._clock()
            self._refill(now)
            at = now if priority or self._tokens >= 1 else now + (1 - self._tokens) / (self._budget / 60)
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
            self._sent[op] += 1

    def note_waiting(self) -> None:
        """The next request counted is the wait engine's (reported as ``waiting`` in :meth:`stats`)."""
        with self._lock:
            self._waiting += 1

    def note_rate_limited(self, op: str, retry_after: float | None) -> None:
        """A 429 answered ``op``: hold waiting requests until ``Retry-After`` (plus spread) has passed."""
        pause = 1.0 if retry_after is None else retry_after
        with self._lock:
            self._limited[op] += 1
            until = self._clock() + pause + BLACKOUT_SPREAD * self._rng()
            self._blocked_until = max(self._blocked_until, until)

    def stats(self) -> GovernorStats:
        """A snapshot of what this governor has seen."""
        with self._lock:
            return GovernorStats(
                sent=dict(self._sent),
                waiting=self._waiting,
                rate_limited=dict(self._limited),
                wait_budget=self._budget,
                blocked_until=self._blocked_until,
            )
