"""Lock provenance: which task try holds a lock, who waits in a slot, and who force-released it.

Three records, all public facts (never a lock's ownership token or the service key), read by the lock
board (:mod:`airflow_provider_volcano.plugins.board`) and by waiting tasks' log lines:

- the **holder record**, Airflow Variable ``volcano_lock_holder:<lock key>``, written by a task when it
  acquires: the lock key, fencing token, TTL, acquired at, hostname and the task try (dag, run, task,
  map index, try). It is never deleted on release: a reader trusts it only while Volcano's live
  fencing token for the lock is the record's (tokens only grow, so a stale record cannot match);
- the **in-slot waiter** XCom ``volcano_waiting`` of a task waiting in its worker slot (lock key and
  since when), pushed when the wait starts; XComs are cleared at each try, and the board lists it only
  while its task instance runs without holding the lock;
- the **force-release record**, Variable ``volcano_lock_forced:<lock key>``, written by the board before
  it force-releases: the fencing token it ended, by whom and when. The holder that loses that lease
  reads it and fails naming the force release and its author.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Self

__all__ = [
    "FORCED_PREFIX",
    "HOLDER_PREFIX",
    "WAITING_XCOM_KEY",
    "ForcedRecord",
    "HolderRecord",
    "forced_line",
    "read_forced",
    "read_holder",
    "write_holder",
]

log = logging.getLogger(__name__)

HOLDER_PREFIX = "volcano_lock_holder:"
FORCED_PREFIX = "volcano_lock_forced:"
WAITING_XCOM_KEY = "volcano_waiting"


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Record:
    """A record stored as a Variable's JSON value: written whole, read back only for its own lock."""

    def to_json(self) -> str:
        """The record as the Variable's value."""
        return json.dumps(asdict(self), sort_keys=True)  # type: ignore[call-overload]

    @classmethod
    def parse(cls, lock_key: str, text: object) -> Self | None:
        """Read a Variable's value; ``None`` for anything that is not such a record of ``lock_key``."""
        data = _record_of(lock_key, text)
        return None if data is None else cls._from(lock_key, data)

    @classmethod
    def _from(cls, lock_key: str, data: Mapping[str, Any]) -> Self | None:
        raise NotImplementedError


@dataclass(frozen=True)
class HolderRecord(_Record):
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
    """

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

    @classmethod
    def _from(cls, lock_key: str, data: Mapping[str, Any]) -> HolderRecord | None:
        ints = {name: _int(data.get(name)) for name in ("fencing_token", "ttl", "map_index", "try_number")}
        strs = {name: data.get(name) for name in ("acquired_at", "hostname", "dag_id", "run_id", "task_id")}
        if any(v is None for v in ints.values()) or not all(isinstance(v, str) for v in strs.values()):
            return None
        return cls(lock_key=lock_key, **ints, **strs)  # type: ignore[arg-type]

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


@dataclass(frozen=True)
class ForcedRecord(_Record):
    """A force release done from the lock board: which lease, by whom, when (all public)."""

    lock_key: str
    fencing_token: int | None
    by: str
    at: str

    @classmethod
    def _from(cls, lock_key: str, data: Mapping[str, Any]) -> ForcedRecord | None:
        by, at = data.get("by"), data.get("at")
        if not isinstance(by, str) or not isinstance(at, str):
            return None
        return cls(lock_key=lock_key, fencing_token=_int(data.get("fencing_token")), by=by, at=at)


def _record_of(lock_key: str, text: object) -> Mapping[str, Any] | None:
    """A Variable's value as a JSON object naming ``lock_key``; ``None`` for anything else."""
    try:
        data = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    if not isinstance(data, Mapping) or data.get("lock_key") != lock_key:
        return None
    return data


def _get_variable(name: str) -> object:
    from airflow.sdk import Variable

    try:
        return Variable.get(name, default=None)
    except Exception as exc:  # no supervisor to ask, API errors: provenance is best effort
        log.debug("could not read Variable %r: %s", name, exc)
        return None


def write_holder(context: Mapping[str, Any], lock_key: str, fencing_token: int, ttl: int) -> None:
    """Record the running task try as the holder of ``lock_key`` (best effort: the lock works without)."""
    from airflow.sdk import Variable

    ti = context["ti"]
    record = HolderRecord(
        lock_key=lock_key,
        fencing_token=fencing_token,
        ttl=ttl,
        acquired_at=datetime.now(UTC).isoformat(timespec="seconds"),
        hostname=str(getattr(ti, "hostname", None) or socket.getfqdn()),
        dag_id=ti.dag_id,
        run_id=ti.run_id,
        task_id=ti.task_id,
        map_index=int(getattr(ti, "map_index", -1) if getattr(ti, "map_index", None) is not None else -1),
        try_number=int(ti.try_number),
    )
    try:
        Variable.set(
            HOLDER_PREFIX + lock_key,
            record.to_json(),
            description="volcano-locks: the task try that last acquired this lock (public facts)",
        )
    except Exception as exc:
        log.warning("Could not record the holder of lock %r for the lock board: %s", lock_key, exc)


def read_holder(lock_key: str, fencing_token: int | None = None) -> HolderRecord | None:
    """The holder record of ``lock_key`` (if ``fencing_token`` is given: only if it names that token)."""
    record = HolderRecord.parse(lock_key, _get_variable(HOLDER_PREFIX + lock_key))
    if record is None or (fencing_token is not None and record.fencing_token != fencing_token):
        return None
    return record


def read_forced(lock_key: str, fencing_token: int | None) -> ForcedRecord | None:
    """The force-release record of ``lock_key`` if it ended the lease with ``fencing_token``."""
    record = ForcedRecord.parse(lock_key, _get_variable(FORCED_PREFIX + lock_key))
    if record is None or record.fencing_token != fencing_token:
        return None
    return record


def forced_line(record: ForcedRecord) -> str:
    """What a holder's failure says of the force release that ended its lease."""
    return (
        f"it was force-released by {record.by} at {record.at} from the Airflow UI's Volcano locks page "
        f"(fencing token {record.fencing_token})"
    )
