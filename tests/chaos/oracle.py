"""Did a lease survive? Decided from the server's own request log, independently of the client.

The integrations (Airflow operator, Prefect ``locked_task``) promise that no task reports success after
its lock was lost. To check that promise without trusting the client's keeper, this module reads the
server's ``/__admin/requests`` log (method, path, op, status, arrival time, the ownership token's
sha256 prefix) and decides, per ownership token, whether the server-side lease was certainly lost
before the holder released it:

- a renew (or a re-acquire) by that token was answered 409 after it had held the lock and before its
  release was processed;
- a force release of the key was processed while the token held it;
- the release arrived more than ``ttl`` (plus slack, plus any injected delay that may have postponed the
  last successful renewal's processing) after the last successful acquire or renew: the lease lapsed.

Entries are taken in the order the server finished them (``seq``), not by arrival ``time``: a request
held up by an injected delay is processed long after it arrived (say, a renewal that finally answers 409
after the holder had already renewed by a retry and released). Only certain losses are claimed (each
rule errs towards "not lost"), so asserting "success implies not lost" can only fail for a real broken
promise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

__all__ = ["LeaseVerdict", "lease_verdicts"]

SLACK = 0.5


@dataclass
class LeaseVerdict:
    """What the server saw of one ownership token on one key."""

    token_sha256: str
    held_from: float | None = None
    last_success: float | None = None
    last_success_delayed: bool = False
    released_at: float | None = None
    lost: bool = False
    reasons: list[str] = field(default_factory=list)

    def lapsed_by(self, t: float, ttl: int, *, max_delay: float = 0.0) -> bool:
        """Whether the lease had certainly lapsed by ``t`` (e.g. when its task ended with no release)."""
        if self.last_success is None:
            return False
        allowance = ttl + SLACK + (max_delay if self.last_success_delayed else 0.0)
        return t - self.last_success > allowance

    def _lose(self, reason: str) -> None:
        self.lost = True
        self.reasons.append(reason)


def lease_verdicts(
    entries: Iterable[Mapping[str, Any]], key: str, ttl: int, *, max_delay: float = 0.0
) -> dict[str, LeaseVerdict]:
    """Return a verdict per ownership token seen on ``key``.

    Args:
        entries: one server process's request log (each with seq, time, path, op, status, token_sha256,
            fault).
        key: the lock key.
        ttl: the TTL the holder used.
        max_delay: the longest delay an injected fault can add before a request is processed.
    """
    lease_path = "/locks/" + quote(key, safe="") + "/lease"
    lock_path = "/locks/" + quote(key, safe="")
    verdicts: dict[str, LeaseVerdict] = {}
    for e in sorted(entries, key=lambda e: e["seq"]):  # one server process: its completion order
        t = float(e["time"])
        if e["path"] == lock_path and e["op"] == "force_release" and e["status"] == 204:
            for v in verdicts.values():
                if v.held_from is not None and v.released_at is None:
                    v._lose(f"force released at {t:.3f}")
            continue
        if e["path"] != lease_path or not e.get("token_sha256"):
            continue
        v = verdicts.setdefault(e["token_sha256"], LeaseVerdict(e["token_sha256"]))
        op, status = e["op"], e["status"]
        delayed = "delay" in (e.get("fault") or "")
        if op in ("acquire", "renew") and status in (200, 201):
            if v.held_from is None:
                v.held_from = t
            v.last_success, v.last_success_delayed = t, delayed
        elif (
            op in ("acquire", "renew") and status == 409 and v.held_from is not None and v.released_at is None
        ):
            v._lose(f"{op} answered 409 at {t:.3f}")
        elif op == "release" and v.held_from is not None and v.released_at is None:
            v.released_at = t
            if v.lapsed_by(t, ttl, max_delay=max_delay) and not v.lost:
                v._lose(f"released {t - v.last_success:.2f} s after its last renewal (ttl {ttl})")
    return verdicts
