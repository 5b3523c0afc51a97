"""The holder record: which task try acquired a lock, for the lock board and waiting lines.

Variable ``volcano_lock_holder:<lock key>``, written by a task when it acquires (a group member when
it starts): the lock key, fencing token, TTL, acquired at, hostname, the task try (dag, run, task,
map index, try) and the lease's kind (``task`` or ``group``). Sealed and bound to its lease: the
board authorises a force release against the DAG it names, so a record nobody sealed names nobody.
It is never deleted on release: a reader trusts it only while Volcano's live fencing token for the
lock is the record's (tokens only grow, so a stale record cannot match).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

from airflow_provider_volcano.records.opened import as_int, as_kind, as_str
from airflow_provider_volcano.records.seal import Keyring
from airflow_provider_volcano.records.store import open_variable, set_sealed

__all__ = [
    "HOLDER_PREFIX",
    "HolderRecord",
    "holder_variable",
    "read_holder",
    "task_try",
    "try_from_facts",
    "write_holder",
]

log = logging.getLogger(__name__)

HOLDER_PREFIX = "volcano_lock_holder:"


def holder_variable(lock_key: str) -> str:
    """The Variable that holds the holder record of ``lock_key``."""
    return HOLDER_PREFIX + lock_key


@dataclass(frozen=True)
class HolderRecord:
    """The task try that acquired a lock (all public).

    :param lock_key: the lock.
    :param fencing_token: the lease's fencing token.
    :param ttl: the lease TTL in seconds (the last renewal is the live expiry less this).
    :param acquired_at: when the task acquired (ISO 8601, UTC).
    :param hostname: the worker the task ran on.
    :param dag_id: the holder's DAG.
    :param run_id: the holder's DAG run.
    :param task_id: the holder's task.
    :param map_index: the holder's map index (-1: not mapped).
    :param try_number: the holder's try.
    :param kind: ``task``, or ``group`` when the task runs under a lock group's lease.
    """

    RECORD: ClassVar[str] = "holder"

    lock_key: str
    fencing_token: int
    ttl: int
    acquired_at: str
    hostname: str
    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    kind: str = "task"

    def facts(self) -> dict[str, Any]:
        """The record's facts (what the seal covers)."""
        return asdict(self)

    @classmethod
    def from_facts(cls, facts: Mapping[str, Any]) -> HolderRecord:
        """Rebuild the record from its facts."""
        return cls(
            lock_key=as_str(facts["lock_key"]),
            fencing_token=as_int(facts["fencing_token"]),
            ttl=as_int(facts["ttl"]),
            acquired_at=as_str(facts["acquired_at"]),
            kind=as_kind(facts["kind"]),
            **try_from_facts(facts),
        )

    def names(self) -> str:
        """The holder try as a waiting line names it."""
        mapped = f" [{self.map_index}]" if self.map_index >= 0 else ""
        return f"{self.dag_id} / {self.run_id} / {self.task_id}{mapped} try {self.try_number}"

    def describe(self) -> str:
        """The holder with its fencing token and since when, for waiting lines."""
        return (
            f"held by {self.names()} on {self.hostname}, fencing token {self.fencing_token}, "
            f"since {self.acquired_at}"
        )


def task_try(context: Mapping[str, Any]) -> dict[str, Any]:
    """The running task try as the records name it: dag, run, task, map index, try and hostname."""
    ti = context["ti"]
    map_index = getattr(ti, "map_index", None)
    return {
        "dag_id": ti.dag_id,
        "run_id": ti.run_id,
        "task_id": ti.task_id,
        "map_index": -1 if map_index is None else int(map_index),
        "try_number": int(ti.try_number),
        "hostname": str(getattr(ti, "hostname", None) or socket.getfqdn()),
    }


def try_from_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The task try a record's facts name (what :func:`task_try` wrote), each fact checked."""
    return {
        "dag_id": as_str(facts["dag_id"]),
        "run_id": as_str(facts["run_id"]),
        "task_id": as_str(facts["task_id"]),
        "map_index": as_int(facts["map_index"]),
        "try_number": as_int(facts["try_number"]),
        "hostname": as_str(facts["hostname"]),
    }


def write_holder(
    keys: Keyring,
    context: Mapping[str, Any],
    lock_key: str,
    fencing_token: int,
    ttl: int,
    kind: str = "task",
    logger: logging.Logger | Any = log,
) -> None:
    """Record the running task try as the holder of ``lock_key`` (best effort: the lock works without)."""
    record = HolderRecord(
        lock_key=lock_key,
        fencing_token=fencing_token,
        ttl=ttl,
        acquired_at=datetime.now(UTC).isoformat(timespec="seconds"),
        kind=kind,
        **task_try(context),
    )
    if not set_sealed(
        keys,
        holder_variable(lock_key),
        record,
        "volcano-locks: the task try that last acquired this lock (public facts, sealed)",
        logger,
    ):
        logger.warning("The lock board will not name the holder of lock %r", lock_key)


def read_holder(
    keys: Keyring, lock_key: str, fencing_token: int | None = None, logger: logging.Logger | Any = log
) -> HolderRecord | None:
    """The holder record of ``lock_key`` if its seal verifies (and, given ``fencing_token``, it names it)."""
    record = open_variable(keys, HolderRecord, holder_variable(lock_key), lock_key, logger).record
    if record is None or (fencing_token is not None and record.fencing_token != fencing_token):
        return None
    return record
