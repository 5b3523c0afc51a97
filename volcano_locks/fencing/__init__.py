"""Fenced writes: the store itself refuses a write whose fencing token is older than the newest it accepted.

A lease cannot stop a holder whose renewal stalled past ``expires_at``: it may still be running when the
next holder takes over. The protected store is what keeps its late writes out. Three stores here:

- :class:`FencedSQL` and :class:`AsyncFencedSQL` (``volcano_locks.fencing.sql``, extra ``fencing-sql``):
  your own tables through SQLAlchemy's sync or asyncio engines, PostgreSQL or SQLite; a guard row per
  resource, claimed first in every transaction of the work.
- :class:`FencedS3Prefix` (``volcano_locks.fencing.s3``, extra ``fencing-s3``): an S3 prefix whose
  current version is named by a manifest replaced with conditional ``PutObject`` (``If-Match``); readers
  take a :class:`Snapshot` (one publication for many files).
- :class:`FencedTable`: a ready-made ``(resource, value)`` table for SQLite and PostgreSQL (the examples,
  the demo and the chaos suite write through it).

Each takes the lease in whatever form it reaches your code (:func:`fence_of`) and refuses with
:class:`StaleFencingToken`; a write that waited its bound behind a stalled writer raises
:class:`FenceBusy`. SQLAlchemy and boto3 are imported only when their adapter is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from volcano_locks._lazy import lazy_names
from volcano_locks.fencing._fence import Fence, FenceBusy, StaleFencingToken, fence_of
from volcano_locks.fencing._table import FencedTable, FencedWrite

if TYPE_CHECKING:
    from volcano_locks.fencing.s3 import FencedS3Prefix, Manifest, Snapshot, SwapContended
    from volcano_locks.fencing.sql import AsyncFencedSQL, Claim, FencedSQL

__all__ = [
    "AsyncFencedSQL",
    "Claim",
    "Fence",
    "FenceBusy",
    "FencedS3Prefix",
    "FencedSQL",
    "FencedTable",
    "FencedWrite",
    "Manifest",
    "Snapshot",
    "StaleFencingToken",
    "SwapContended",
    "fence_of",
]

_LAZY = {
    "AsyncFencedSQL": "volcano_locks.fencing.sql",
    "Claim": "volcano_locks.fencing.sql",
    "FencedSQL": "volcano_locks.fencing.sql",
    "FencedS3Prefix": "volcano_locks.fencing.s3",
    "Manifest": "volcano_locks.fencing.s3",
    "Snapshot": "volcano_locks.fencing.s3",
    "SwapContended": "volcano_locks.fencing.s3",
}


__getattr__ = lazy_names(__name__, _LAZY, globals())
