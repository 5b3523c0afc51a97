"""The run-once ledger of a fenced S3 prefix: the publication's manifest records the business key.

:meth:`S3Ledger.publish` is :meth:`~volcano_locks.fencing.FencedS3Prefix.publish` with a run-once record:
the manifest that makes the upload current also records the business key (who, under which token, the
small result), and carries every earlier key forward. The record and the publication become current in
one conditional ``PutObject``, or neither does: a publish whose manifest already records the key (read
first, or read again after a lost swap race) raises :class:`~volcano_locks.once.AlreadyDone` and deletes
what it uploaded. So within one prefix a key's publication happens exactly once.

:meth:`S3Ledger.forget` removes a key from the manifest (conditional on its ETag, the publication itself
untouched) and appends the audit entry (who, when, why, the record) to the manifest's ``forgotten`` list.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from volcano_locks.fencing._fence import fence_of
from volcano_locks.fencing._s3_manifest import LINEAGE, Manifest
from volcano_locks.fencing.s3 import FencedS3Prefix, SwapContended, is_race
from volcano_locks.once._record import (
    AuditEntry,
    OnceRecord,
    Who,
    bound_lease,
    check_forget,
    check_list,
    check_result,
    validate_business_key,
)

__all__ = ["S3Ledger", "S3Once"]


class S3Ledger:
    """A run-once ledger in a fenced S3 prefix's manifest.

    Args:
        prefix: the :class:`~volcano_locks.fencing.FencedS3Prefix` the effects publish to; its clock dates
            the records.

    Example:
        >>> ledger = S3Ledger(FencedS3Prefix(s3, "lake", "marts/rollup"))  # doctest: +SKIP
        >>> with locks.with_lock("rollup", ttl=60, once=ledger.once("rollup:2026-12-01")) as guard:
        ...     if guard.duplicate is None:
        ...         guard.once.publish({"part-0.json": data}, result={"rows": 42})
    """

    def __init__(self, prefix: FencedS3Prefix) -> None:
        if not isinstance(prefix, FencedS3Prefix):
            raise TypeError(f"S3Ledger takes a FencedS3Prefix, got {type(prefix).__name__}")
        self.prefix = prefix
        self.clock: Callable[[], datetime] = prefix.clock

    def __repr__(self) -> str:
        return f"S3Ledger(bucket={self.prefix.bucket!r}, prefix={self.prefix.prefix!r})"

    def once(self, business_key: str, *, who: Who | None = None) -> S3Once:
        """``business_key`` in this prefix, done by ``who`` (this process when ``None``)."""
        return S3Once(self, validate_business_key(business_key), who or Who.here())

    def publish(
        self,
        business_key: str,
        lease: object,
        files: Mapping[str, bytes],
        *,
        who: Who | None = None,
        result: Any = None,
    ) -> OnceRecord:
        """Publish ``files`` as ``business_key``'s effect, once; returns the record the manifest holds.

        Raises:
            AlreadyDone: the manifest records the key; nothing was published.
            StaleFencingToken: a newer token published here; nothing was published.
        """
        key = validate_business_key(business_key)
        fence = fence_of(lease)
        who = who or Who.here()
        record = OnceRecord(key, fence.lock_key, fence.fencing_token, self.clock(), who, check_result(result))
        self.prefix.publish(lease, files, writer=who.describe(), once=record)
        return record

    def lookup(self, business_key: str) -> OnceRecord | None:
        """The record of ``business_key`` in the current manifest, or ``None``."""
        key = validate_business_key(business_key)
        manifest = self.prefix.current()
        if manifest is None or key not in manifest.once:
            return None
        return OnceRecord.from_dict(manifest.once[key])

    def records(self, *, prefix: str | None = None, limit: int = 100) -> list[OnceRecord]:
        """The records, newest first: those whose key starts with ``prefix``, at most ``limit``."""
        check_list(prefix, limit)
        manifest = self.prefix.current()
        records = [OnceRecord.from_dict(body) for body in (manifest.once.values() if manifest else ())]
        records = [r for r in records if not prefix or r.business_key.startswith(prefix)]
        records.sort(key=lambda r: (-r.done_at.timestamp(), r.business_key))
        return records[:limit]

    def forget(self, business_key: str, *, by: str, why: str) -> OnceRecord | None:
        """Remove ``business_key`` from the manifest so a run may publish it again; audited in the manifest.

        The publication stays current (forgetting undoes nothing); the swap is conditional on the manifest
        read, and retried on a race. Returns the record forgotten, or ``None`` if there was none.
        """
        key, by, why = check_forget(business_key, by, why)
        for _ in range(self.prefix.max_swaps):
            manifest = self.prefix.current()
            if manifest is None or key not in manifest.once:
                return None
            record = OnceRecord.from_dict(manifest.once[key])
            entry = AuditEntry(record, by, why, self.clock()).to_dict()
            new: Manifest = replace(
                manifest,
                once={k: v for k, v in manifest.once.items() if k != key},
                forgotten=(entry, *manifest.forgotten)[:LINEAGE],
            )
            try:
                self.prefix._swap(new, manifest)
            except Exception as exc:
                if is_race(exc):
                    continue
                raise
            return record
        raise SwapContended(f"forget of {key!r} in {self.prefix.prefix!r} kept losing the manifest swap")

    def audit(self, business_key: str | None = None, *, limit: int = 100) -> list[AuditEntry]:
        """The audit trail of forgets in this prefix (of one key, or all), newest first."""
        check_list(None, limit)
        manifest = self.prefix.current()
        entries = [AuditEntry.from_dict(e) for e in (manifest.forgotten if manifest else ())]
        return [e for e in entries if business_key is None or e.record.business_key == business_key][:limit]


@dataclass(frozen=True)
class S3Once:
    """One business key in an :class:`S3Ledger`, as one run sees it: what ``with_lock(once=...)`` takes."""

    ledger: S3Ledger
    business_key: str
    who: Who
    lease: object | None = None

    def lookup(self) -> OnceRecord | None:
        """The key's record, or ``None``."""
        return self.ledger.lookup(self.business_key)

    def bound(self, lease: object) -> S3Once:
        """This run under ``lease``."""
        return replace(self, lease=lease)

    def publish(self, files: Mapping[str, bytes], *, result: Any = None) -> OnceRecord:
        """:meth:`S3Ledger.publish` for this key under the bound lease."""
        return self.ledger.publish(
            self.business_key, bound_lease(self.lease), files, who=self.who, result=result
        )
