"""The project's lock-request budget: what holders and waiters cost within Volcano's quota.

Every lock request counts against a fixed window of 600 requests a minute per project. A holder that
renews at a third of its TTL (at least once a minute) spends ``max(180 / ttl, 1)`` requests a minute,
so the TTL decides how many holders a project can keep alive at once. A waiting process spends at
most its waiting budget (:mod:`volcano_locks.governor`), and once its backoff has settled one look per
``cap`` seconds per key it waits on (:class:`volcano_locks.waiting.WaitPolicy`), whichever is less.
These are the figures the CLI's ``quota`` planner and the README use, written once.
"""

from __future__ import annotations

from dataclasses import dataclass

from volcano_locks.governor import DEFAULT_WAIT_BUDGET
from volcano_locks.waiting import WaitPolicy

__all__ = ["DEFAULT_QUOTA", "HolderBudget", "holder_budget", "renewals_per_minute", "waiting_per_minute"]

DEFAULT_QUOTA = 600
"""Volcano's lock requests per project per one-minute window."""


def renewals_per_minute(ttl: int) -> float:
    """Requests a minute one holder spends renewing at a third of ``ttl`` seconds, at least once a minute."""
    if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 5:
        raise ValueError(f"ttl must be an integer number of seconds >= 5, got {ttl!r}")
    return max(180 / ttl, 1.0)


@dataclass(frozen=True)
class HolderBudget:
    """How many concurrent holders a TTL supports within a quota, after a reserve for other requests."""

    ttl: int
    renewals_per_minute: float
    quota: int
    reserve: int
    holders: int


def holder_budget(ttl: int, *, quota: int = DEFAULT_QUOTA, reserve: int = 0) -> HolderBudget:
    """Return the holders that ``ttl`` supports, keeping ``reserve`` requests a minute for reads and waits."""
    if isinstance(quota, bool) or not isinstance(quota, int) or quota < 1:
        raise ValueError(f"quota must be a positive integer, got {quota!r}")
    if isinstance(reserve, bool) or not isinstance(reserve, int) or not 0 <= reserve < quota:
        raise ValueError(f"reserve must be an integer from 0 to {quota - 1}, got {reserve!r}")
    per_holder = renewals_per_minute(ttl)
    # Floor, with a small tolerance so that exact quotients (600 / 18 = 33.33.., 600 / 6 = 100) are not
    # pushed down by binary rounding.
    holders = int((quota - reserve) / per_holder + 1e-9)
    return HolderBudget(
        ttl=ttl, renewals_per_minute=per_holder, quota=quota, reserve=reserve, holders=holders
    )


def waiting_per_minute(
    processes: int, keys_per_process: int = 1, *, wait_budget: int = DEFAULT_WAIT_BUDGET
) -> float:
    """Requests a minute that ``processes`` waiting processes spend once their backoff has settled.

    Each process looks at each key it waits on once per ``WaitPolicy.cap`` seconds, and never spends
    more than its waiting budget, however many keys it waits on.
    """
    for name, value in (("processes", processes), ("keys_per_process", keys_per_process)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
    per_key = 60 / WaitPolicy().cap
    return processes * min(float(wait_budget), keys_per_process * per_key)
