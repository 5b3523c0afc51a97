"""Run once per business key: a duplicate run's effect is a no-op that names the first run.

A lock makes work run alone; it does not stop it running twice (a DAG run cleared and re-run, a backfill
over done days, a retry after the effect committed, the same rollup from Airflow and Prefect). The ledger
records, in the same transaction or publication as the effect, that a business key is done: the key, the
lock key and fencing token it was done under, when, who (:class:`Who`), and a small JSON result.

- :class:`SQLLedger` / :class:`AsyncSQLLedger` (``volcano_locks.once.sql``, extra ``fencing-sql``): a
  ledger table beside your data, written in your fenced transaction: exactly once.
- :class:`S3Ledger` (``volcano_locks.once.s3``, extra ``fencing-s3``): the fenced prefix's manifest records
  the key with the publication it makes current: exactly once per prefix.

``with_lock(..., once=ledger.once(key))`` looks the key up once the lock is held: ``guard.duplicate`` is
the first run's :class:`OnceRecord` (skip the work, return its ``result``), else ``guard.once.begin()`` /
``guard.once.publish(...)`` does the effect and records it. A duplicate that gets past the look-up (no
lock, a lapsed lease) is still refused when it commits: :class:`AlreadyDone`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from volcano_locks._lazy import lazy_names
from volcano_locks.once._record import (
    MAX_BUSINESS_KEY,
    MAX_RESULT_BYTES,
    AlreadyDone,
    AuditEntry,
    OnceRecord,
    Who,
    validate_business_key,
)

if TYPE_CHECKING:
    from volcano_locks.once.s3 import S3Ledger, S3Once
    from volcano_locks.once.sql import AsyncSQLLedger, AsyncSQLOnce, Effect, SQLLedger, SQLOnce

__all__ = [
    "MAX_BUSINESS_KEY",
    "MAX_RESULT_BYTES",
    "AlreadyDone",
    "AsyncSQLLedger",
    "AsyncSQLOnce",
    "AuditEntry",
    "Effect",
    "OnceRecord",
    "S3Ledger",
    "S3Once",
    "SQLLedger",
    "SQLOnce",
    "Who",
    "validate_business_key",
]

_LAZY = {
    "AsyncSQLLedger": "volcano_locks.once.sql",
    "AsyncSQLOnce": "volcano_locks.once.sql",
    "Effect": "volcano_locks.once.sql",
    "SQLLedger": "volcano_locks.once.sql",
    "SQLOnce": "volcano_locks.once.sql",
    "S3Ledger": "volcano_locks.once.s3",
    "S3Once": "volcano_locks.once.s3",
}


__getattr__ = lazy_names(__name__, _LAZY, globals())
