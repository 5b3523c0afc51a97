"""The per-key queues of waiters and what they know of the lock, shared in a process; and :func:`wake`."""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import ClassVar

from volcano_locks.clock import lease_clock
from volcano_locks.errors import InvalidRequest
from volcano_locks.eta import TENURES_KEPT, Eta, estimate
from volcano_locks.models import LockState
from volcano_locks.waiting.policy import FLOOR, until_ended
from volcano_locks.waiting.waiter import _Waiter

__all__ = ["SharedPolls", "inform", "vouch", "wake"]

logger = logging.getLogger("volcano_locks.waiting")


@dataclass(frozen=True)
class _Recall:
    """A key's turnover knowledge, kept a while after its last waiter left."""

    holder: LockState | None
    changed_at: float | None
    tenure: float | None
    left_at: float  # lease-clock time the last waiter left
    tenures: tuple[float, ...] = ()


@dataclass(eq=False)
class _KeyWait:
    """One key's queue of waiters and what they know about the lock (shared by its waiters)."""

    key: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    waiters: deque[_Waiter] = field(default_factory=deque)
    holder: LockState | None = None
    renewing: bool = False
    moved: bool = False  # the last look found the lock changed hands since the one before
    delay: float | None = None
    next_look_at: float = -math.inf
    free_seen: bool = False
    woken: bool = False
    changed_at: float | None = None  # lease-clock time the current holder was first seen
    tenure: float | None = None  # how long the holder before it held, as seen from here
    behind: float = 0.0  # seconds this queue leaves past a holder's expiry to the first in line (`inform`)
    tenures: deque[float] = field(default_factory=lambda: deque(maxlen=TENURES_KEPT))  # the last ones
    looked_at: float | None = None  # lease-clock time ``holder`` was last read (a look, an announcement)
    vouched: tuple[int, float] | None = None  # (fencing token, cap): that holder's end is announced (`vouch`)

    def vouched_cap(self, holder: LockState | None) -> float | None:
        """The backoff's cap while ``holder`` is the one vouched for (:func:`vouch`), else ``None``."""
        vouched = self.vouched
        if vouched is None or holder is None or holder.fencing_token != vouched[0]:
            return None
        return vouched[1]

    def changed_hands(self, now: float) -> None:
        """The lock has a new holder since the last look: remember how long the previous one held."""
        if self.changed_at is not None:
            self.tenure = now - self.changed_at
            self.tenures.append(self.tenure)
        self.changed_at = now

    def eta(self, waiter: _Waiter, now: float) -> Eta | None:
        """``waiter``'s expected start (:mod:`volcano_locks.eta`), from the tenures seen here."""
        with self.lock:
            position = next((i for i, w in enumerate(self.waiters, 1) if w is waiter), len(self.waiters) + 1)
            tenures = list(self.tenures)
        elapsed = None if self.changed_at is None else now - self.changed_at
        return estimate(tenures, elapsed, position)

    def in_turnover(self, now: float, slack: float) -> bool:
        """The lock is passing a line: its holder has held under twice (or ``slack`` s over) the last tenure.

        The slack covers a holder that is slow to start its work (an Airflow task resuming from
        its trigger can take twenty seconds of scheduling before it holds for its few seconds).
        """
        if self.tenure is None or self.changed_at is None:
            return False
        return now - self.changed_at < max(2 * self.tenure, self.tenure + slack)

    def recall(self) -> _Recall:
        """What this key's poll learnt of the lock's turnover, to outlive its queue (:class:`SharedPolls`)."""
        return _Recall(self.holder, self.changed_at, self.tenure, lease_clock(), tuple(self.tenures))

    def restore(self, recall: _Recall) -> None:
        """Start from what an earlier queue on this key learnt: the holder seen, when it took over, its
        predecessor's tenure. The backoff starts afresh (the first look comes at ``poll``)."""
        self.holder, self.changed_at, self.tenure = recall.holder, recall.changed_at, recall.tenure
        self.tenures.extend(recall.tenures)

    def head(self) -> _Waiter | None:
        with self.lock:
            return self.waiters[0] if self.waiters else None

    def wake_head(self) -> bool:
        with self.lock:
            self.woken = True
            head = self.waiters[0] if self.waiters else None
        if head is not None:
            head.signal.set()
        return head is not None

    def leave(self, waiter: _Waiter) -> None:
        with self.lock:
            was_head = bool(self.waiters) and self.waiters[0] is waiter
            if waiter in self.waiters:
                self.waiters.remove(waiter)
            head = self.waiters[0] if self.waiters else None
        if was_head and head is not None:
            head.signal.set()

    def heard(self, state: LockState, now: float, until: float, behind: float) -> bool:
        """Fold in a holder announced elsewhere (:func:`inform`); look ``until`` + ``behind`` s from now.

        Returns whether it was taken in: an announcement of an older lease than the one known says
        nothing now (events may arrive late or out of order).
        """
        with self.lock:
            known = self.holder.fencing_token if self.holder is not None else None
            if known is not None and state.fencing_token is not None and state.fencing_token < known:
                return False
            self.seen_held(state, now)
            self.looked_at = now
            self.renewing = False  # a new lease: its expiry is when it ends unless it renews
            self.behind = behind
            self.next_look_at = now + max(FLOOR, until + behind)
            head = self.waiters[0] if self.waiters else None
        if head is not None:
            head.signal.set()  # it may be sleeping towards an earlier look
        return True

    def seen_held(self, state: LockState, now: float) -> None:
        """Fold in a look (or a refusal) that found the lock held: renewing? changed hands?"""
        old = self.holder
        self.moved = old is not None and (
            not old.held
            or (
                old.fencing_token is not None
                and state.fencing_token is not None
                and state.fencing_token != old.fencing_token
            )
        )
        if self.moved:
            self.delay = None  # the lock changed hands since the last look: a line is passing
            self.changed_hands(now)
        self.renewing = (
            old is not None
            and old.fencing_token is not None
            and old.fencing_token == state.fencing_token
            and old.expires_at is not None
            and state.expires_at is not None
            and state.expires_at > old.expires_at
        )
        self.holder = state
        self.free_seen = False


class SharedPolls:
    """Registry of the per-key queues, scoped by ``(scope, API URL, credential fingerprint, key)``.

    The scope is ``"thread"`` for sync waiters (one process) and the running event loop for async
    waiters. Keying by URL and credential fingerprint means waiters share a poll only when the server
    would see them as the same project asking about the same lock, which is exactly when sharing is
    safe. Several clients built from one connection (many Airflow triggers in one triggerer, each with
    its own client) do share, which is the point. An entry lives only while waiters use it.

    What an entry learnt of the lock's turnover (the holder seen, when it took over, how long its
    predecessor held) is recalled for :attr:`recall_for` seconds after its last waiter left, for at
    most :attr:`recall_keys` keys: waiters that come back (an Airflow triggerer that restarts its
    triggers, a task deferred again) still know a line is passing and keep looking often, instead
    of backing off towards the cap as if the lock had one long holder.
    """

    recall_for: ClassVar[float] = 300.0
    recall_keys: ClassVar[int] = 1024
    _guard: ClassVar[threading.Lock] = threading.Lock()
    _entries: ClassVar[dict[tuple[object, str, str, str], _KeyWait]] = {}
    _users: ClassVar[dict[tuple[object, str, str, str], int]] = {}
    _recalls: ClassVar[OrderedDict[tuple[object, str, str, str], _Recall]] = OrderedDict()

    @classmethod
    @contextmanager
    def join(
        cls, scope: object, api_url: str, credential_id: str, waiter: _Waiter, *, recall: bool = True
    ) -> Iterator[_KeyWait]:
        """Queue ``waiter`` on its key's shared poll for the duration of the block.

        ``recall=False`` for a queue of one that nobody joins again (a ``contention="raise"`` waiter
        in a scope of its own): what it learnt is not kept.
        """
        ident = (scope, api_url, credential_id, waiter.key)
        with cls._guard:
            entry = cls._entries.get(ident)
            if entry is None:
                entry = cls._entries[ident] = _KeyWait(waiter.key)
                known = cls._recalls.pop(ident, None)
                if known is not None and lease_clock() - known.left_at <= cls.recall_for:
                    entry.restore(known)
            cls._users[ident] = cls._users.get(ident, 0) + 1
        with entry.lock:
            entry.waiters.append(waiter)
        try:
            yield entry
        finally:
            entry.leave(waiter)
            with cls._guard:
                cls._users[ident] -= 1
                if cls._users[ident] == 0:
                    del cls._users[ident]
                    cls._entries.pop(ident, None)
                    if recall:
                        cls._recalls[ident] = entry.recall()
                    while len(cls._recalls) > cls.recall_keys:
                        cls._recalls.popitem(last=False)

    @classmethod
    def active(cls) -> int:
        """How many keys currently have a shared poll (for tests and diagnostics)."""
        with cls._guard:
            return len(cls._entries)

    @classmethod
    def matching(cls, key: str, api_url: str | None, credential_id: str | None) -> list[_KeyWait]:
        """The queues waiting on ``key`` (of that API URL and credential, where given)."""
        with cls._guard:
            return [
                entry
                for (_, url, cred, k), entry in cls._entries.items()
                if k == key
                and (api_url is None or url == api_url)
                and (credential_id is None or cred == credential_id)
            ]


def wake(key: str, *, api_url: str | None = None, credential_id: str | None = None) -> int:
    """Make every queue in this process waiting on ``key`` try to acquire it at once.

    Callable from any thread. The woken head still spends its request from the waiting budget (ahead
    of reads) and still honours a 429's ``Retry-After``.

    Args:
        key: The lock key that was released.
        api_url: Only waiters of this API URL (``None``: any).
        credential_id: Only waiters of this credential fingerprint (``None``: any).

    Returns:
        How many key queues had a waiter to wake.
    """
    woken = sum(1 for entry in SharedPolls.matching(key, api_url, credential_id) if entry.wake_head())
    if woken:
        logger.debug("woke %d waiting queue(s) for lock %r", woken, key)
    return woken


def inform(
    key: str,
    holder: LockState,
    *,
    api_url: str | None = None,
    credential_id: str | None = None,
    behind: float = 0.0,
) -> int:
    """Tell every queue in this process waiting on ``key`` who holds it now, as announced elsewhere.

    For waiters that are also woken by releases (:func:`wake`, :attr:`WaitPolicy.at_expiry`): their
    next look is at the holder's ``expires_at`` plus the server's grace, when the lease ends if its
    holder dies without releasing it, and not before. A line of short holds announced this way costs
    no looks at all. Callable from any thread.

    Args:
        key: The lock key.
        holder: The new holder's public facts (its ``expires_at`` is needed).
        api_url: Only waiters of this API URL (``None``: any).
        credential_id: Only waiters of this credential fingerprint (``None``: any).
        behind: Seconds past that moment this process leaves to the first in a line of processes,
            which will take the lock then and announce it (``0``: this process is first, or cannot tell).

    Returns:
        How many key queues took it in.

    Raises:
        InvalidRequest: ``holder`` has no ``expires_at``, or ``behind`` is negative or not finite.
    """
    if holder.expires_at is None or not holder.held:
        raise InvalidRequest(f"inform needs a held lock's expires_at, got {holder!r}")
    if not (math.isfinite(behind) and behind >= 0):
        raise InvalidRequest(f"invalid behind {behind!r}: expected finite seconds >= 0")
    until = until_ended(holder, now=datetime.now(UTC), draw=0.0)
    assert until is not None
    now = lease_clock()
    told = sum(
        1
        for entry in SharedPolls.matching(key, api_url, credential_id)
        if entry.heard(holder, now, until, behind)
    )
    if told:
        logger.debug(
            "told %d waiting queue(s) for lock %r of fencing token %s", told, key, holder.fencing_token
        )
    return told


def vouch(
    key: str,
    fencing_token: int | None,
    *,
    cap: float = 60.0,
    api_url: str | None = None,
    credential_id: str | None = None,
) -> int:
    """Tell the queues waiting on ``key`` that the holder with ``fencing_token`` is watched elsewhere.

    Something that costs no lock request (an orchestrator that runs the holder: the Airflow triggerer
    asks Airflow for the holder's task state) will :func:`wake` the waiters the moment that holder
    ends, so their own looks are only the safety net while it holds: they back off straight to
    ``cap`` seconds (jittered), instead of growing from ``poll`` towards the policy's cap. A holder
    that is not renewing is still looked at when its lease would end (a crash nobody reported). The
    vouch applies only while the looks find that fencing token; ``None`` withdraws it. Callable from
    any thread.

    Args:
        key: The lock key.
        fencing_token: The watched holder's fencing token (``None``: no holder is vouched for).
        cap: Seconds between the safety-net looks at the vouched holder (at least :data:`FLOOR`).
        api_url: Only waiters of this API URL (``None``: any).
        credential_id: Only waiters of this credential fingerprint (``None``: any).

    Returns:
        How many key queues took it in.

    Raises:
        InvalidRequest: ``cap`` is not a finite number of seconds of at least :data:`FLOOR`.
    """
    if not (math.isfinite(cap) and cap >= FLOOR):
        raise InvalidRequest(f"invalid cap {cap!r}: expected finite seconds >= {FLOOR}")
    vouched = None if fencing_token is None else (fencing_token, float(cap))
    entries = SharedPolls.matching(key, api_url, credential_id)
    for entry in entries:
        with entry.lock:
            entry.vouched = vouched
    return len(entries)
