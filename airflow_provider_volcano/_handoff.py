"""Handoff records: which task try a lease the trigger acquired is waiting for, so waiters can tell.

A deferred task's trigger acquires the lock *for* its task with ``handoff_ttl`` (300 s by default) and
ends; the task resumes later in a worker. Until it does, the lease belongs to a task try that may never
run: a user marks it failed or success, clears it, or the resumed try dies before its body. Airflow tells
no provider code of a clear, nor of a try that dies on the worker before the task code, so the record is
looked at where those show: by the waiters, and by the API server right after a user's clear or state
set (:mod:`airflow_provider_volcano.plugins.actions`). The trigger writes a record at the handoff, an
Airflow Variable ``volcano_lock_handoff:<lock key>`` (JSON: the lock key, the fencing token, the lease's
expiry and the owner try's public identity, nonce included), and the resumed task deletes it once it
holds the lease. The record is sealed under the service key and bound to its lease (lock key,
fencing token, owner, kind; :mod:`airflow_provider_volcano.records`): Variables are writable by users
and by every task's code, and a record whose seal fails is ignored. A waiter that opens a record for
the lock asks Airflow for the owner's state and, if the owner can no longer use the lease and Volcano's
live fencing token is still the record's, releases exactly that lease: with the token derived from
the record's identity and the key that sealed it, so the server refuses (409) the release of any
other lease. The same record tells the waiting lines which holder is a handoff.

A try can no longer use its handoff lease when Airflow says its task instance is ``failed``,
``success``, ``skipped``, ``upstream_failed``, ``removed``, ``up_for_retry`` or has no state (cleared),
or, for the task instance's own next try, as soon as that try waits for the lock. A task instance
Airflow does not report is treated as alive (safety over liveness).

A lock group's lease outlives its acquire task by design, so a record of kind ``group`` is never
decided on the acquire task's state: only when the group's DAG run is over (``success`` or
``failed``) or its release task is in a terminal state can the group no longer use the lease.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

from airflow_provider_volcano._tokens import TaskIdentity
from airflow_provider_volcano.records.handoff import HandoffRecord
from volcano_locks import LeaseRef
from volcano_locks.integration import MAX_TTL

if TYPE_CHECKING:
    from volcano_locks import LockState

__all__ = [
    "DEAD_STATES",
    "GroupState",
    "TriggerHandoff",
    "describe",
    "live_is",
    "owner_state",
    "shown_state",
    "task_instance_state",
    "unusable_because",
]

log = logging.getLogger(__name__)

LOOK_EVERY = 5.0
"""Seconds between two looks of a waiter at its lock's handoff record (the bound waiters keep to)."""
HANDOFF_GROWTH_CAP = 4
"""A lapsed handoff is retried with a longer allowance, at most this many times ``handoff_ttl``."""
DEAD_STATES = frozenset({"failed", "success", "skipped", "upstream_failed", "removed", "up_for_retry", None})
"""Task instance states in which the try a handoff lease was acquired for will never run its body."""
GROUP_OVER_RUN_STATES = frozenset({"success", "failed"})
"""DAG run states in which a lock group's tasks no longer run."""
RELEASE_OVER_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})
"""Release-task states after which a lock group no longer uses its lease."""
_NOT_REPORTED = object()


@dataclass(frozen=True)
class GroupState:
    """What Airflow says of a lock group's run: the DAG run's state and its release task's state.

    Either is the module's ``_NOT_REPORTED`` when Airflow did not report it.
    """

    run: object
    release: object


def _same_task_instance(a: TaskIdentity, b: TaskIdentity) -> bool:
    return (a.dag_id, a.task_id, a.run_id, a.map_index) == (b.dag_id, b.task_id, b.run_id, b.map_index)


def unusable_because(record: HandoffRecord, state: object, waiter: TaskIdentity | None) -> str | None:
    """Why the owner ``record`` names can no longer use its lease, or ``None`` if it may.

    :param record: the handoff record (opened: its seal verified).
    :param state: what Airflow reports of the owner (:func:`owner_state`): the task instance's state,
        or a :class:`GroupState` for a group's lease; the module's ``_NOT_REPORTED`` when not reported.
    :param waiter: the try that is waiting (its own later try makes an earlier one's lease useless).
    """
    if record.kind == "group":
        # Never the acquire task's state nor its later try: the lease is the group's, not that try's.
        if not isinstance(state, GroupState):
            return None
        if state.run in GROUP_OVER_RUN_STATES:
            return f"its lock group's DAG run is {state.run}"
        if state.release in RELEASE_OVER_STATES:
            return f"its lock group's release task {record.release_task_id!r} is {state.release}"
        return None
    owner = record.owner
    if waiter is not None and _same_task_instance(owner, waiter) and waiter.try_number > owner.try_number:
        return f"its task instance is on try {waiter.try_number} now"
    if state is _NOT_REPORTED or isinstance(state, GroupState):
        return None
    if state in DEAD_STATES:
        return "its task instance was cleared" if state is None else f"its task instance is {state}"
    return None


def live_is(record: HandoffRecord, live: LockState | None) -> bool:
    """Whether Volcano's live answer still shows the record's lease (checked before any release)."""
    return live is not None and live.held and live.fencing_token == record.fencing_token


class TaskInstanceNamed(Protocol):
    """Whatever names a task instance: a :class:`TaskIdentity`, a holder record (issue 28's watch)."""

    @property
    def dag_id(self) -> str: ...
    @property
    def task_id(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def map_index(self) -> int: ...


def _task_states(owner: TaskInstanceNamed, task_ids: list[str]) -> Mapping[str, object] | None:

    try:
        states = RuntimeTaskInstance.get_task_states(
            dag_id=owner.dag_id, task_ids=task_ids, run_ids=[owner.run_id]
        )
    except Exception as exc:  # no supervisor to ask (outside a task or trigger), API errors
        log.debug("could not read task states of %s: %s", owner.dag_id, exc)
        return None
    run = states.get(owner.run_id) if isinstance(states, Mapping) else None
    return run if isinstance(run, Mapping) else None


def _group_state(record: HandoffRecord) -> GroupState:

    owner = record.owner
    try:
        run: object = RuntimeTaskInstance.get_dagrun_state(dag_id=owner.dag_id, run_id=owner.run_id)
    except Exception as exc:
        log.debug("could not read the state of run %r of %s: %s", owner.run_id, owner.dag_id, exc)
        run = _NOT_REPORTED
    release: object = _NOT_REPORTED
    if record.release_task_id is not None:
        states = _task_states(owner, [record.release_task_id])
        if states is not None:
            name = record.release_task_id
            release = states.get(name if owner.map_index < 0 else f"{name}_{owner.map_index}", _NOT_REPORTED)
    return GroupState(str(getattr(run, "value", run)) if run is not _NOT_REPORTED else run, release)


def owner_state(record: HandoffRecord) -> object:
    """What Airflow (Task SDK) says of the record's owner: its task instance's state (``task``), a
    :class:`GroupState` (``group``), or ``_NOT_REPORTED``."""
    if record.kind == "group":
        return _group_state(record)
    return task_instance_state(record.owner)


def task_instance_state(owner: TaskInstanceNamed) -> object:
    """A task instance's state from Airflow (Task SDK), or ``_NOT_REPORTED``."""
    run = _task_states(owner, [owner.task_id])
    if run is None:
        return _NOT_REPORTED
    name = owner.task_id if owner.map_index < 0 else f"{owner.task_id}_{owner.map_index}"
    return run.get(name, _NOT_REPORTED)


def shown_state(state: object) -> str:
    """A task instance state as a line shows it (``None``: cleared; not a string: not reported)."""
    if state is None:
        return "none (cleared)"
    return state if isinstance(state, str) else "not reported"


def describe(record: HandoffRecord | None, fencing_token: int | None, state: object) -> str:
    """What the waiting lines say of the holder beyond its fencing token and expiry."""
    if record is None or fencing_token is None or record.fencing_token != fencing_token:
        return "not a handoff this deployment recorded (a running holder, or one outside this deployment)"
    if isinstance(state, GroupState):
        run, release = (("not reported" if s is _NOT_REPORTED else s) for s in (state.run, state.release))
        return (
            f"a lock group's lease, acquired for {record.names()} (group run: {run}, release task: {release})"
        )
    if state == "running":  # resumed, and about to take its record down: never "not resumed yet"
        return f"a handoff to {record.names()}, which has resumed (task state: running) and holds it now"
    return f"a handoff to {record.names()}, which has not resumed yet (task state: {shown_state(state)})"


def lease_of(record: HandoffRecord, token: str) -> LeaseRef:
    """A reference to the record's lease for releasing it with ``token`` (release sends only the token)."""
    return LeaseRef(record.lock_key, token, record.fencing_token)


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
    key_id: str | None = None
    """The fingerprint of the service key the trigger derived the token with (``None``: not said)."""

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
            key_id=event["key_id"] if isinstance(event.get("key_id"), str) else None,
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
