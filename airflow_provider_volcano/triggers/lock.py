"""VolcanoLockTrigger: waits in the triggerer for a Volcano lock and acquires it for its task.

The trigger is the trigger: its arguments, its serialisation, its one event. The wait itself (the core's
wait engine, the looks at the lock's handoff record, the waiting lines) is
:func:`airflow_provider_volcano.runtime.trigger_wait.wait_for_lock`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_volcano._tokens import TaskIdentity
from airflow_provider_volcano.hooks.volcano import VolcanoConnectionError, VolcanoHook
from airflow_provider_volcano.records.handoff import HandoffRecord, write_handoff
from airflow_provider_volcano.records.opened import LEASE_KINDS
from airflow_provider_volcano.runtime.airflow_calls import ask, awaited
from airflow_provider_volcano.runtime.trigger_wait import STATUS_ACQUIRED, STATUS_ERROR, wait_for_lock

__all__ = ["VolcanoLockTrigger"]

logger = logging.getLogger(__name__)


class VolcanoLockTrigger(BaseTrigger):
    """Waits without a worker slot until a Volcano lock is free, then acquires it for its task.

    It acquires with the ownership token derived from the service key and the task try's identity
    and random nonce, so nothing secret is stored in the trigger row and the resumed task
    re-acquires that same lease (same fencing token). It acquires for the *handoff*: with
    ``handoff_ttl`` (at least ``ttl``), so the lease outlives a resume that takes longer than the
    task's TTL (executor queueing, pod start, a busy pool); the resumed task's idempotent
    re-acquire then sets the lease to its own ``ttl`` from that moment. Fires one event whose
    ``status`` is ``acquired``, ``timeout`` or ``error``; the payload holds the lock key, the
    fencing token, ``expires_at``, ``acquired_at`` (when the trigger's acquisition was sent), the
    handoff allowance and a message, never a key or an ownership token.

    :param volcano_conn_id: the Volcano connection id.
    :param lock_key: the lock to wait for.
    :param ttl: the task's lease TTL in seconds.
    :param identity: the task instance try with its nonce (``TaskIdentity.as_dict()``).
    :param deadline: give up at this wall-clock time (epoch seconds); ``None`` waits without bound.
    :param poll: seconds between reads of a held lock.
    :param handoff_ttl: the TTL the trigger acquires with, the time its task has to resume (``None``
        or less than ``ttl``: ``ttl``).
    :param kind: what the lease is for: ``task``, or ``group`` for a lock group's acquire task (the
        handoff record says so, and waiters never free a group's lease because that task ended).
    :param release_task_id: the group's release task (``group`` only).
    """

    def __init__(
        self,
        *,
        volcano_conn_id: str,
        lock_key: str,
        ttl: int,
        identity: dict[str, Any],
        deadline: float | None = None,
        poll: float = 2.0,
        handoff_ttl: int | None = None,
        kind: str = "task",
        release_task_id: str | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        if kind not in LEASE_KINDS:
            raise ValueError(f"kind must be one of {LEASE_KINDS}, got {kind!r}")
        self.kind = kind
        self.release_task_id = release_task_id if kind == "group" else None
        self.volcano_conn_id = volcano_conn_id
        self.lock_key = lock_key
        self.ttl = int(ttl)
        self.identity = TaskIdentity.from_dict(identity).as_dict()
        self.deadline = None if deadline is None else float(deadline)
        self.poll = float(poll)
        self.handoff_ttl = max(self.ttl, int(handoff_ttl or 0))
        self._key_id: str | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return the classpath and JSON-primitive kwargs (no key, no token)."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "volcano_conn_id": self.volcano_conn_id,
                "lock_key": self.lock_key,
                "ttl": self.ttl,
                "identity": dict(self.identity),
                "deadline": self.deadline,
                "poll": self.poll,
                # Only when it differs: trigger rows written before the handoff allowance existed
                # (no such kwarg) keep deserialising to the same trigger.
                **({"handoff_ttl": self.handoff_ttl} if self.handoff_ttl != self.ttl else {}),
                **(
                    {"kind": self.kind, "release_task_id": self.release_task_id}
                    if self.kind != "task"
                    else {}
                ),
            },
        )

    def _event(self, status: str, message: str, state: Any = None) -> TriggerEvent:
        expires_at = getattr(state, "expires_at", None)
        acquired_at = getattr(state, "acquired_at", None)
        return TriggerEvent(  # type: ignore[no-untyped-call]
            {
                "status": status,
                "lock_key": self.lock_key,
                "fencing_token": getattr(state, "fencing_token", None),
                "expires_at": expires_at.isoformat() if expires_at is not None else None,
                # When the trigger's acquisition was sent: the resumed task measures its resume delay.
                "acquired_at": acquired_at.isoformat() if acquired_at is not None else None,
                "handoff_ttl": self.handoff_ttl,
                "message": message,
                # Echoed so a resumed task can defer again within the same bound, even where the
                # deferral's method kwargs are not carried over (dag.test()).
                "deadline": self.deadline,
                "nonce": self.identity["nonce"],
                # Which service key derived the token (a public fingerprint): the resumed task derives
                # the same token with it even if the connection's key was rotated meanwhile.
                "key_id": self._key_id,
            }
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Wait for the lock in the core's wait engine and yield one event."""
        hook = VolcanoHook(self.volcano_conn_id)
        try:
            # Parsed once: the token below and the client use it. Nothing to wait for without it,
            # but never in silence.
            await awaited(
                f"the lookup of connection {self.volcano_conn_id!r}", hook.aget_config(), logger=self.log
            )
        except VolcanoConnectionError as exc:
            yield self._event(STATUS_ERROR, str(exc))
            return
        # The handoff allowance, not the task's TTL: the lease must outlive the task's resume.
        identity = TaskIdentity.from_dict(self.identity)
        token = hook.ownership_token(identity, self.lock_key)
        self._key_id = hook.keyring.current.key_id
        outcome = await wait_for_lock(
            hook, self.lock_key, token, self.handoff_ttl, self.deadline, self.poll, self.log, identity
        )
        if outcome.status == STATUS_ACQUIRED and outcome.lease is not None:
            # Written before the event, so a waiter can tell whose handoff this lease is, and free
            # it if that try never gets to use it; the resumed task deletes it once it holds. Best
            # effort and bounded: a slow Airflow never holds the handoff (the write, if still on its
            # way, reaches the supervisor before the event, on the same channel).
            record = HandoffRecord(
                self.lock_key,
                outcome.lease.fencing_token,
                outcome.lease.expires_at,
                identity,
                self.kind,
                self.release_task_id,
            )
            await ask(
                f"the handoff record of lock {self.lock_key!r}",
                write_handoff,
                hook.keyring,
                record,
                self.log,
                default=False,
                logger=self.log,
            )
            self.log.info(
                "Acquired lock %r for the task (fencing token %s); it holds for the handoff "
                "(%s s) until the task resumes and renews it at its own ttl (%s s)",
                self.lock_key,
                outcome.lease.fencing_token,
                self.handoff_ttl,
                self.ttl,
            )
            yield self._event(STATUS_ACQUIRED, f"acquired lock {self.lock_key!r}", outcome.lease)
        else:
            yield self._event(outcome.status, outcome.message, outcome.holder)
