"""The tenure record: one lease's life under one fencing token, for the lock board's history and ETAs.

Variable ``volcano_lock_tenure:<lock key>:<slot>``, where the slot is the fencing token modulo
:data:`TENURES_KEPT`: each lock keeps its latest tenures in a ring of Variables that a task writes
without listing anything (tokens only grow, so a new tenure overwrites the oldest). The holder task
writes it twice, sealed and bound to its lease: when it acquires (``holding``) and when its hold ends
(``released``, ``lost``, ``force-released``, or ``lapsed`` when the release did not go through and the
lease was left to its TTL). A holder that never wrote its end (killed, its worker gone) is shown
``expired`` by the board once the lock has moved on. Display only: no lock decision rests on it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

from airflow_provider_volcano.records.holder import task_try, try_from_facts
from airflow_provider_volcano.records.opened import as_int, as_kind, as_str
from airflow_provider_volcano.records.seal import Keyring
from airflow_provider_volcano.records.store import set_sealed

__all__ = ["ENDINGS", "TENURES_KEPT", "TENURE_PREFIX", "TenureRecord", "tenure_variable", "write_tenure"]

log = logging.getLogger(__name__)

TENURE_PREFIX = "volcano_lock_tenure:"
TENURES_KEPT = 20
"""How many of a lock's latest tenures are kept (the ring's size; the ETA rests on as many)."""
ENDINGS = ("holding", "released", "lost", "force-released", "lapsed")
"""What a tenure record may say of its end (``holding``: not ended when last written)."""


def tenure_variable(lock_key: str, fencing_token: int) -> str:
    """The Variable that holds the record of lease ``fencing_token`` of ``lock_key`` (its ring slot)."""
    return f"{TENURE_PREFIX}{lock_key}:{fencing_token % TENURES_KEPT:02d}"


@dataclass(frozen=True)
class TenureRecord:
    """One tenure of a lock by a task try (all public).

    :param lock_key: the lock.
    :param fencing_token: the lease's fencing token.
    :param acquired_at: when the task acquired (ISO 8601, UTC).
    :param ended_at: when its hold ended (ISO 8601, UTC; ``""`` while ``holding``).
    :param ending: one of :data:`ENDINGS`.
    :param dag_id: the holder's DAG.
    :param run_id: the holder's DAG run.
    :param task_id: the holder's task.
    :param map_index: the holder's map index (-1: not mapped).
    :param try_number: the holder's try.
    :param hostname: the worker the task ran on.
    :param kind: ``task`` (lock groups' leases are not recorded).
    """

    RECORD: ClassVar[str] = "tenure"

    lock_key: str
    fencing_token: int
    acquired_at: str
    ended_at: str
    ending: str
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    hostname: str
    kind: str = "task"

    def facts(self) -> dict[str, Any]:
        """The record's facts (what the seal covers)."""
        return asdict(self)

    @classmethod
    def from_facts(cls, facts: Mapping[str, Any]) -> TenureRecord:
        """Rebuild the record from its facts."""
        ending = as_str(facts["ending"])
        if ending not in ENDINGS:
            raise ValueError("not a tenure ending")
        return cls(
            lock_key=as_str(facts["lock_key"]),
            fencing_token=as_int(facts["fencing_token"]),
            acquired_at=as_str(facts["acquired_at"]),
            ended_at=as_str(facts["ended_at"]),
            ending=ending,
            kind=as_kind(facts["kind"]),
            **try_from_facts(facts),
        )

    def held_for(self) -> float | None:
        """Seconds from acquisition to the end (``None`` while holding, or if a time does not parse)."""
        if not self.ended_at:
            return None
        try:
            held = datetime.fromisoformat(self.ended_at) - datetime.fromisoformat(self.acquired_at)
        except ValueError:
            return None
        return max(0.0, held.total_seconds())


def now_iso() -> str:
    """The time now as the records write it (UTC, milliseconds)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def write_tenure(
    keys: Keyring,
    context: Mapping[str, Any],
    lock_key: str,
    fencing_token: int,
    acquired_at: str,
    ending: str = "holding",
    logger: logging.Logger | Any = log,
) -> None:
    """Record the running task try's tenure of ``lock_key`` (best effort: the lock works without)."""
    record = TenureRecord(
        lock_key=lock_key,
        fencing_token=fencing_token,
        acquired_at=acquired_at,
        ended_at="" if ending == "holding" else now_iso(),
        ending=ending,
        **task_try(context),
    )
    if not set_sealed(
        keys,
        tenure_variable(lock_key, fencing_token),
        record,
        "volcano-locks: one tenure of this lock, for the lock board's history (public facts, sealed)",
        logger,
    ):
        logger.warning("The lock board's history will miss lease %s of lock %r", fencing_token, lock_key)
