"""Fenced writes: the store itself refuses a write whose fencing token is older than the newest it accepted.

A lease cannot stop a holder whose renewal stalled past ``expires_at``: it may still be running when the
next holder takes over. The protected store is what keeps its late writes out. Three stores here:

- :class:`FencedSQL` (``volcano_locks.fencing.sql``, extra ``fencing-sql``): your own tables through
  SQLAlchemy, PostgreSQL or SQLite; a guard row per resource updated in the same transaction as your
  statements.
- :class:`FencedS3Prefix` (``volcano_locks.fencing.s3``, extra ``fencing-s3``): an S3 prefix whose
  current version is named by a manifest replaced with conditional ``PutObject`` (``If-Match``).
- :class:`FencedTable`: a ready-made ``(resource, value)`` table for SQLite and PostgreSQL (the examples,
  the demo and the chaos suite write through it).

Each takes the lease in whatever form it reaches your code (:func:`fence_of`) and refuses with
:class:`StaleFencingToken`. SQLAlchemy and boto3 are imported only when their adapter is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from volcano_locks.fencing._fence import Fence, StaleFencingToken, fence_of
from volcano_locks.fencing._table import FencedTable, FencedWrite

if TYPE_CHECKING:
    from volcano_locks.fencing.s3 import FencedS3Prefix, Manifest, SwapContended
    from volcano_locks.fencing.sql import FencedSQL

__all__ = [
    "Fence",
    "FencedS3Prefix",
    "FencedSQL",
    "FencedTable",
    "FencedWrite",
    "Manifest",
    "StaleFencingToken",
    "SwapContended",
    "fence_of",
]

_LAZY = {
    "FencedSQL": "volcano_locks.fencing.sql",
    "FencedS3Prefix": "volcano_locks.fencing.s3",
    "Manifest": "volcano_locks.fencing.s3",
    "SwapContended": "volcano_locks.fencing.s3",
}


def __getattr__(name: str) -> Any:
    """Import an adapter on first use: ``import volcano_locks.fencing`` needs neither SQLAlchemy nor boto3."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
