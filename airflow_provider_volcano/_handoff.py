"""Handoff records: which task try a lease the trigger acquired is waiting for, so waiters can tell.

A deferred task's trigger acquires the lock *for* its task with ``handoff_ttl`` (300 s by default) and
ends; the task resumes later in a worker. Until it does, the lease belongs to a task try that may never
run: a user marks it failed or success, clears it, or the resumed try dies before its body. Airflow tells
no provider code of those on the components that run every user action (the API server calls listeners
for a state set through the UI or REST, not for a clear; nothing runs for a try that dies on the worker
before the task code), so the waiters do the looking: the trigger writes a record at the handoff, an
Airflow Variable ``volcano_lock_handoff:<lock key>`` (JSON: the lock key, the fencing token, the lease's
expiry and the owner try's public identity, nonce included), and the resumed task deletes it once it
holds the lease. A waiter that finds a record for the lock asks Airflow for the owner try's state and,
if that try can no longer use the lease, releases exactly that lease: with the token derived from the
record's identity and the service key, so the server refuses (409) the release of any other lease,
whoever wrote the record (Variables are writable by users: a forged record can at most free a lease
whose try is over). The same record tells the waiting lines which holder is a handoff.

A try can no longer use its handoff lease when Airflow says its task instance is ``failed``,
``success``, ``skipped``, ``upstream_failed``, ``removed``, ``up_for_retry`` or has no state (cleared),
or, for the task instance's own next try, as soon as that try waits for the lock. A task instance
Airflow does not report is treated as alive (safety over liveness).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from airflow_provider_volcano._tokens import TaskIdentity

__all__ = [
    "DEAD_STATES",
    "HandoffRecord",
    "TriggerHandoff",
    "clear_record",
    "describe",
    "owner_state",
    "read_record",
    "record_key",
    "unusable_because",
    "write_record",
]

log = logging.getLogger(__name__)

VARIABLE_PREFIX = "volcano_lock_handoff:"
LOOK_EVERY = 5.0
"""Seconds between two looks of a waiter at its lock's handoff record (the bound waiters keep to)."""
HANDOFF_GROWTH_CAP = 4
"""A lapsed handoff is retried with a longer allowance, at most this many times ``handoff_ttl``."""
DEAD_STATES = frozenset({"failed", "success", "skipped", "upstream_failed", "removed", "up_for_retry", None})
"""Task instance states in which the try a handoff lease was acquired for will never run its body."""
_NOT_REPORTED = object()


def record_key(lock_key: str) -> str:
    """The Variable that holds the handoff record of ``lock_key``."""
    return VARIABLE_PREFIX + lock_key


@dataclass(frozen=True)
class HandoffRecord:
    """A lease a trigger acquired for a task try that has not resumed yet (all public facts).

    :param lock_key: the lock.
    :param fencing_token: the lease's fencing token.
    :param expires_at: the lease's expiry (the handoff allowance from the acquisition).
    :param owner: the task try the lease is for, nonce included.
    """

    lock_key: str
    fencing_token: int
    expires_at: datetime | None
    owner: TaskIdentity

    def to_json(self) -> str:
        """The record as the Variable's value."""
        return json.dumps(
            {
                "lock_key": self.lock_key,
                "fencing_token": self.fencing_token,
                "expires_at": self.expires_at.isoformat() if self.expires_at is not None else None,
                "owner": self.owner.as_dict(),
            },
            sort_keys=True,
        )

    @classmethod
    def parse(cls, lock_key: str, text: object) -> HandoffRecord | None:
        """Read a Variable's value; ``None`` for anything that is not a record of ``lock_key``."""
        try:
            data = json.loads(text) if isinstance(text, str) else None
            if not isinstance(data, Mapping) or data.get("lock_key") != lock_key:
                return None
            fencing = data["fencing_token"]
            if not isinstance(fencing, int) or isinstance(fencing, bool):
                return None
            expires = data.get("expires_at")
            return cls(
                lock_key=lock_key,
                fencing_token=fencing,
                expires_at=datetime.fromisoformat(expires) if isinstance(expires, str) else None,
                owner=TaskIdentity.from_dict(data["owner"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def names(self) -> str:
        """The owner try, as the task log names it."""
        owner = self.owner
        mapped = f", map index {owner.map_index}" if owner.map_index >= 0 else ""
        return f"{owner.dag_id}.{owner.task_id} (run {owner.run_id!r}{mapped}, try {owner.try_number})"


def _same_task_instance(a: TaskIdentity, b: TaskIdentity) -> bool:
    return (a.dag_id, a.task_id, a.run_id, a.map_index) == (b.dag_id, b.task_id, b.run_id, b.map_index)


def unusable_because(record: HandoffRecord, state: object, waiter: TaskIdentity | None) -> str | None:
    """Why the try ``record`` was acquired for can no longer use its lease, or ``None`` if it may.

    :param record: the handoff record.
    :param state: the owner task instance's state as Airflow reports it (:func:`owner_state`; the
        module's ``_NOT_REPORTED`` when Airflow did not report it).
    :param waiter: the try that is waiting (its own later try makes an earlier one's lease useless).
    """
    owner = record.owner
    if waiter is not None and _same_task_instance(owner, waiter) and waiter.try_number > owner.try_number:
        return f"its task instance is on try {waiter.try_number} now"
    if state is _NOT_REPORTED:
        return None
    if state in DEAD_STATES:
        return "its task instance was cleared" if state is None else f"its task instance is {state}"
    return None


def owner_state(owner: TaskIdentity) -> object:
    """The owner task instance's state from Airflow (Task SDK), or ``_NOT_REPORTED``."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    try:
        states = RuntimeTaskInstance.get_task_states(
            dag_id=owner.dag_id, task_ids=[owner.task_id], run_ids=[owner.run_id]
        )
    except Exception as exc:  # no supervisor to ask (outside a task or trigger), API errors
        log.debug("could not read the state of %s.%s: %s", owner.dag_id, owner.task_id, exc)
        return _NOT_REPORTED
    run = states.get(owner.run_id) if isinstance(states, Mapping) else None
    if not isinstance(run, Mapping):
        return _NOT_REPORTED
    name = owner.task_id if owner.map_index < 0 else f"{owner.task_id}_{owner.map_index}"
    return run.get(name, _NOT_REPORTED)


def read_record(lock_key: str) -> HandoffRecord | None:
    """The handoff record of ``lock_key``, if this deployment has one (best effort)."""
    from airflow.sdk import Variable

    try:
        text = Variable.get(record_key(lock_key), default=None)
    except Exception as exc:
        log.debug("could not read the handoff record of lock %r: %s", lock_key, exc)
        return None
    return HandoffRecord.parse(lock_key, text)


def write_record(record: HandoffRecord, logger: logging.Logger | Any = log) -> bool:
    """Write the handoff record (best effort: without it a stranded handoff lasts its allowance)."""
    from airflow.sdk import Variable

    try:
        Variable.set(
            record_key(record.lock_key),
            record.to_json(),
            description="volcano-locks: a lease acquired for a task that has not resumed yet",
        )
    except Exception as exc:
        logger.warning(
            "Could not record the handoff of lock %r (%s); if the task never resumes, waiters wait "
            "for the lease's expiry",
            record.lock_key,
            exc,
        )
        return False
    return True


def clear_record(
    lock_key: str,
    fencing_token: int | None,
    logger: logging.Logger | Any = log,
    *,
    owner: TaskIdentity | None = None,
) -> None:
    """Delete the handoff record of ``lock_key`` if it names ``fencing_token`` or ``owner`` (best effort).

    The resumed task passes itself as ``owner`` too: after a lapsed handoff it holds a newer lease than
    the record names, and the record must not outlive its resume.
    """
    from airflow.sdk import Variable

    record = read_record(lock_key)
    if record is None or (record.fencing_token != fencing_token and record.owner != owner):
        return
    try:
        Variable.delete(record_key(lock_key))
    except Exception as exc:
        logger.warning("Could not delete the handoff record of lock %r: %s", lock_key, exc)


def describe(record: HandoffRecord | None, fencing_token: int | None, state: object) -> str:
    """What the waiting lines say of the holder beyond its fencing token and expiry."""
    if record is None or fencing_token is None or record.fencing_token != fencing_token:
        return "not a handoff (a running holder, or one outside this deployment)"
    shown = "not reported" if state is _NOT_REPORTED else ("none (cleared)" if state is None else state)
    return f"a handoff to {record.names()}, which has not resumed yet (task state: {shown})"


def lease_of(record: HandoffRecord, token: str) -> Any:
    """A lease object for releasing the record's lease with ``token`` (release sends only the token)."""
    from datetime import UTC

    from volcano_locks import LockLease

    expires = record.expires_at or datetime.now(UTC)
    return LockLease(
        key=record.lock_key,
        token=token,
        expires_at=expires,
        fencing_token=record.fencing_token,
        ttl=5,
        acquired_at=expires,
        local_deadline=0.0,
        absolute_deadline=0.0,
    )


def released_line(record: HandoffRecord, reason: str) -> str:
    """The task-log line of a waiter that released a stranded handoff lease (%-free, no secret)."""
    return (
        f"Released lock {record.lock_key!r} (fencing token {record.fencing_token}): it was held for the "
        f"handoff to {record.names()}, which can no longer use it ({reason}); waiting no longer behind it"
    )


@dataclass(frozen=True)
class TriggerHandoff:
    """What the trigger's event says about the lease it acquired for its task (all public facts)."""

    fencing_token: int | None
    acquired_at: datetime | None
    allowance: int

    @classmethod
    def from_event(cls, event: Mapping[str, Any], default_allowance: int) -> TriggerHandoff:
        """Read the event's facts; a missing or malformed one is unknown (``allowance``: the default)."""
        acquired_at = None
        if isinstance(event.get("acquired_at"), str):
            with contextlib.suppress(ValueError):
                acquired_at = datetime.fromisoformat(event["acquired_at"])
        allowance = event.get("handoff_ttl")
        fencing = event.get("fencing_token")
        return cls(
            fencing_token=fencing if isinstance(fencing, int) and not isinstance(fencing, bool) else None,
            acquired_at=acquired_at,
            allowance=allowance if isinstance(allowance, int) and allowance > 0 else default_allowance,
        )

    def delay(self) -> float | None:
        """Seconds from the trigger's acquisition to now (triggerer and worker clocks may differ)."""
        if self.acquired_at is None:
            return None
        return time.time() - self.acquired_at.timestamp()

    def describe_delay(self) -> str:
        """The resume delay as a log line says it."""
        delay = self.delay()
        return "an unknown time" if delay is None else f"{delay:.1f} s"

    def next_allowance(self, handoff_ttl: int) -> int:
        """The allowance of the next handoff: twice the resume delay measured, within a bound.

        Resume delays recur, so after a lapse the next trigger acquires for longer, never more than
        ``HANDOFF_GROWTH_CAP`` times ``handoff_ttl`` nor the contract's longest TTL.
        """
        from volcano_locks.protocol import MAX_TTL

        delay = self.delay()
        if delay is None:
            return handoff_ttl
        return min(MAX_TTL, HANDOFF_GROWTH_CAP * handoff_ttl, max(self.allowance, math.ceil(2 * delay)))

    def lapsed_line(self, lock_key: str, then: str) -> str:
        """The one line that says what a lapsed handoff means, and ``then`` what the task does now.

        The resumed task came later than the lease the trigger acquired for it lasted: the lease is
        gone, and the fix is a ``handoff_ttl`` above the executor's resume delay.
        """
        return (
            f"The handoff of lock {lock_key!r} lapsed: this task resumed {self.describe_delay()} after "
            f"its trigger acquired the lock (fencing token {self.fencing_token}), beyond "
            f"handoff_ttl={self.allowance} s, so that lease is gone. {then} Raise handoff_ttl above "
            "your executor's resume delay (queueing, pod start, pool slots)."
        )
