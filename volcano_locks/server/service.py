"""The contract's lock rules as a sans-I/O service over a store and an injected wall clock."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from .clock import Clock, system_clock
from .errors import ApiError
from .store import LockRow, LockStore

__all__ = ["Lease", "LockService", "LockView", "format_timestamp", "hash_token"]

_US = 1_000_000
GRACE_US = 1 * _US  # takeover waits one second after expires_at
RENEW_MARGIN_US = 1 * _US  # renewals must arrive more than one second before expires_at
MAX_LEASE_US = 7_776_000 * _US  # the absolute 90-day deadline of every acquisition
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def hash_token(token: str) -> str:
    """Return the SHA-256 hex digest of an ownership token (what the store and the request log keep)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def format_timestamp(us: int) -> str:
    """Format microseconds since the epoch as RFC 3339 UTC with a `Z` suffix."""
    return (_EPOCH + timedelta(microseconds=us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class Lease:
    """A granted or renewed lease: when it expires and its fencing token."""

    expires_us: int
    fencing_token: int

    def to_json(self) -> dict[str, object]:
        """Return the contract's acquire/renew response body."""
        return {"expires_at": format_timestamp(self.expires_us), "fencing_token": self.fencing_token}


@dataclass(frozen=True, slots=True)
class LockView:
    """What a read returns: held (by takeover eligibility), and the live lease's expiry and token."""

    held: bool
    expires_us: int | None = None
    fencing_token: int | None = None

    def to_json(self) -> dict[str, object]:
        """Return the contract's read response body (a free lock is only `{"held": false}`)."""
        if not self.held or self.expires_us is None:
            return {"held": False}
        return {
            "held": True,
            "expires_at": format_timestamp(self.expires_us),
            "fencing_token": self.fencing_token,
        }


def _ownership_lost(message: str) -> ApiError:
    return ApiError(409, "lock_ownership_lost", message)


def _holds(row: LockRow | None, now: int) -> bool:
    """Whether a lease blocks takeover at `now` (live, or inside its one-second grace window)."""
    return row is not None and row.token_hash is not None and now < row.expires_us + GRACE_US


class LockService:
    """Acquire, renew, release, read and force-release locks per the contract, scoped by project."""

    def __init__(self, store: LockStore, clock: Clock = system_clock) -> None:
        """Serve locks from `store`, taking every 'now' from `clock` (seconds since the epoch)."""
        self.store = store
        self.clock = clock
        self._decided = threading.local()

    def _now_us(self) -> int:
        now = round(self.clock() * _US)
        self._decided.at = now
        return now

    def decision_time(self) -> int | None:
        """The clock reading (microseconds) this thread's last decision was made at, then forget it.

        The request log records it beside the answer, so a model of the contract can replay each
        decision at the time the server made it (see the chaos suite's checker).
        """
        at: int | None = getattr(self._decided, "at", None)
        self._decided.at = None
        return at

    def acquire(self, project: str, key: str, token: str, ttl: int, *, ignore_holder: bool = False) -> Lease:
        """Grant a new lease, or reset the expiry of the caller's own live lease (idempotent re-acquire).

        `ignore_holder` is a deliberate bug for fault injection (`grant_held`): decide as if no live
        lease held the key.
        """
        token_hash = hash_token(token)
        ttl_us = ttl * _US

        def decide(row: LockRow | None) -> tuple[LockRow | None, Lease]:
            now = self._now_us()
            if row is not None and _holds(row, now) and not ignore_holder:
                if row.token_hash != token_hash:
                    raise ApiError(409, "lock_held", f"lock {key!r} is held by another owner")
                if now >= row.expires_us - RENEW_MARGIN_US:
                    raise _ownership_lost(
                        f"your lease on {key!r} lapsed (re-acquire must arrive more than 1 s before"
                        " expires_at); stop protected work and acquire again with a new token"
                    )
                new = replace(row, expires_us=min(now + ttl_us, row.deadline_us))
            else:
                deadline = now + MAX_LEASE_US
                fencing = (row.fencing if row is not None else 0) + 1
                new = LockRow(token_hash, fencing, min(now + ttl_us, deadline), deadline)
            return new, Lease(new.expires_us, new.fencing)

        return self.store.update(project, key, decide)

    def renew(self, project: str, key: str, token: str, ttl: int) -> Lease:
        """Set the owner's expiry to `ttl` from now; only more than 1 s before the current expiry."""
        token_hash = hash_token(token)
        ttl_us = ttl * _US

        def decide(row: LockRow | None) -> tuple[LockRow | None, Lease]:
            now = self._now_us()
            if row is None or row.token_hash is None or not _holds(row, now):
                raise _ownership_lost(f"no live lease on {key!r} for this token")
            if row.token_hash != token_hash:
                raise _ownership_lost(f"lock {key!r} is owned by another token")
            if now >= row.expires_us - RENEW_MARGIN_US:
                raise _ownership_lost(
                    f"renewal of {key!r} arrived too late (must be more than 1 s before expires_at)"
                )
            new = replace(row, expires_us=min(now + ttl_us, row.deadline_us))
            return new, Lease(new.expires_us, new.fencing)

        return self.store.update(project, key, decide)

    def release(self, project: str, key: str, token: str) -> None:
        """Drop the caller's lease; succeed when absent or past grace; refuse another owner's lease."""
        token_hash = hash_token(token)

        def decide(row: LockRow | None) -> tuple[LockRow | None, None]:
            now = self._now_us()
            if row is None or not _holds(row, now):
                return None, None
            if row.token_hash != token_hash:
                raise _ownership_lost(f"lock {key!r} is owned by another token; not released")
            return replace(row, token_hash=None), None

        self.store.update(project, key, decide)

    def force_release(self, project: str, key: str) -> None:
        """Drop whatever lease holds the key (a no-op when absent); the fencing sequence is kept."""

        def decide(row: LockRow | None) -> tuple[LockRow | None, None]:
            if row is None or row.token_hash is None:
                return None, None
            return replace(row, token_hash=None), None

        self.store.update(project, key, decide)

    def read(self, project: str, key: str) -> LockView:
        """Report whether the key is held (by takeover eligibility) and the live lease's details."""
        row = self.store.read(project, key)
        now = self._now_us()
        if row is None or not _holds(row, now):
            return LockView(held=False)
        return LockView(held=True, expires_us=row.expires_us, fencing_token=row.fencing)
