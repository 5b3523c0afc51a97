"""The handoff record: the lease a trigger acquired for a task try that has not resumed yet.

Variable ``volcano_lock_handoff:<lock key>``, written by the trigger when it acquires for its task and
deleted by the resumed task once it holds the lease. Sealed and bound to its lease: the lock key, the
fencing token, the owner try (nonce included) and the lease's kind (``task``, or ``group`` when the
owner is a lock group's acquire task, whose lease outlives it; then the group's release task too).
A waiter decides on it (:mod:`airflow_provider_volcano._handoff`) only once it is opened.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from airflow_provider_volcano._tokens import TaskIdentity
from airflow_provider_volcano.records.opened import Opened, as_int, as_kind
from airflow_provider_volcano.records.seal import Keyring
from airflow_provider_volcano.records.store import delete_variable, open_variable, set_sealed

__all__ = [
    "HANDOFF_PREFIX",
    "HandoffRecord",
    "clear_handoff",
    "handoff_variable",
    "read_handoff",
    "write_handoff",
]

log = logging.getLogger(__name__)

HANDOFF_PREFIX = "volcano_lock_handoff:"


def handoff_variable(lock_key: str) -> str:
    """The Variable that holds the handoff record of ``lock_key``."""
    return HANDOFF_PREFIX + lock_key


@dataclass(frozen=True)
class HandoffRecord:
    """A lease a trigger acquired for a task try that has not resumed yet (all public facts).

    :param lock_key: the lock.
    :param fencing_token: the lease's fencing token.
    :param expires_at: the lease's expiry (the handoff allowance from the acquisition).
    :param owner: the task try the lease is for, nonce included.
    :param kind: ``task``, or ``group`` for a lock group's acquire task (the lease outlives it).
    :param release_task_id: a group's release task (``group`` only; ``None`` if it has none).
    """

    RECORD: ClassVar[str] = "handoff"

    lock_key: str
    fencing_token: int
    expires_at: datetime | None
    owner: TaskIdentity
    kind: str = "task"
    release_task_id: str | None = None

    def facts(self) -> dict[str, Any]:
        """The record's facts (what the seal covers)."""
        return {
            "lock_key": self.lock_key,
            "fencing_token": self.fencing_token,
            "expires_at": self.expires_at.isoformat() if self.expires_at is not None else None,
            "owner": self.owner.as_dict(),
            "kind": self.kind,
            "release_task_id": self.release_task_id,
        }

    @classmethod
    def from_facts(cls, facts: Mapping[str, Any]) -> HandoffRecord:
        """Rebuild the record from its facts."""
        expires, release = facts.get("expires_at"), facts.get("release_task_id")
        return cls(
            lock_key=str(facts["lock_key"]),
            fencing_token=as_int(facts["fencing_token"]),
            expires_at=datetime.fromisoformat(expires) if isinstance(expires, str) else None,
            owner=TaskIdentity.from_dict(facts["owner"]),
            kind=as_kind(facts["kind"]),
            release_task_id=release if isinstance(release, str) else None,
        )

    def names(self) -> str:
        """The owner try, as the task log names it."""
        owner = self.owner
        mapped = f", map index {owner.map_index}" if owner.map_index >= 0 else ""
        return f"{owner.dag_id}.{owner.task_id} (run {owner.run_id!r}{mapped}, try {owner.try_number})"


def read_handoff(keys: Keyring, lock_key: str, logger: logging.Logger | Any = log) -> Opened[HandoffRecord]:
    """The handoff record of ``lock_key`` opened (best effort: Airflow not answering is no record)."""
    return open_variable(keys, HandoffRecord, handoff_variable(lock_key), lock_key, logger)


def write_handoff(keys: Keyring, record: HandoffRecord, logger: logging.Logger | Any = log) -> bool:
    """Write the sealed handoff record (best effort: without it a stranded handoff lasts its allowance)."""
    written = set_sealed(
        keys,
        handoff_variable(record.lock_key),
        record,
        "volcano-locks: a lease acquired for a task that has not resumed yet (sealed)",
        logger,
    )
    if not written:
        logger.warning(
            "Without the handoff record of lock %r, waiters wait for the lease's expiry if the task "
            "never resumes",
            record.lock_key,
        )
    return written


def clear_handoff(
    keys: Keyring,
    lock_key: str,
    fencing_token: int | None,
    logger: logging.Logger | Any = log,
    *,
    owner: TaskIdentity | None = None,
) -> None:
    """Delete the handoff record of ``lock_key`` if it names ``fencing_token`` or ``owner`` (best effort).

    The resumed task passes itself as ``owner`` too: after a lapsed handoff it holds a newer lease than
    the record names, and the record must not outlive its resume. A record that did not open (a claim
    nobody sealed, or one sealed under a key no longer listed) is left alone: it decides nothing.
    A failed delete changes nothing either: the record stays bound to its lease, and a waiter checks
    the live fencing token and the owner's state before releasing.
    """
    record = read_handoff(keys, lock_key, logger).record
    if record is None or (record.fencing_token != fencing_token and record.owner != owner):
        return
    delete_variable(handoff_variable(lock_key), logger)
