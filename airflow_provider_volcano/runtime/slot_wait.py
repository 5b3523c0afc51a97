"""Waiting for a held lock in the task's worker slot (``on_contention="wait"``, not deferrable).

The wait is the core's wait engine (:func:`volcano_locks.waiting.wait_acquire`, as in the trigger).
Beside it, this module says so in the task log (and how to defer instead), tells the lock board the
try waits, looks at the lock's handoff record every few seconds (a handoff lease whose try can no
longer use it is released, see :mod:`airflow_provider_volcano._handoff`) and writes a "Still waiting"
line a minute.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow_provider_volcano._handoff import LOOK_EVERY
from airflow_provider_volcano.records.handoff import HandoffRecord
from airflow_provider_volcano.records.holder import read_holder
from airflow_provider_volcano.records.in_slot import WAITING_XCOM_KEY
from airflow_provider_volcano.runtime.acquiring import holder_facts, read_state
from airflow_provider_volcano.runtime.handoff_look import look, waiting_facts
from volcano_locks.integration import WaitPolicy, expected_start, reported, wait_acquire, wake

if TYPE_CHECKING:
    from airflow_provider_volcano._tokens import TaskIdentity
    from airflow_provider_volcano.hooks.volcano import VolcanoHook
    from volcano_locks import LockLease, LockState, VolcanoLocks

__all__ = ["REPORT_EVERY", "SlotWait", "wait_policy"]

REPORT_EVERY = 60.0
"""Seconds between two "Still waiting" lines of a wait in the worker slot."""


def wait_policy() -> WaitPolicy:
    """The core's default wait policy, reporting (and so looking for a stranded handoff) every 5 s."""
    return WaitPolicy(report_every=LOOK_EVERY)


class SlotWait:
    """One try's wait for ``lock_key`` in its worker slot.

    :param hook: the task's hook (a client of its own for the looks: the waiting one is mid-call).
    :param lock_key: the lock waited for.
    :param waiter: the waiting try (its own handoff record is never freed by its wait).
    :param ti: the running task instance (for the board's in-slot waiting marker), or ``None``.
    :param log: the task's logger.
    """

    def __init__(
        self, hook: VolcanoHook, lock_key: str, waiter: TaskIdentity | None, ti: Any, log: Any
    ) -> None:
        self.hook, self.lock_key, self.waiter, self.ti, self.log = hook, lock_key, waiter, ti, log
        self._reported_at = 0.0  # when the last "Still waiting" line was written (seconds waited)
        self._look_client: VolcanoLocks | None = None

    def wait(
        self, client: VolcanoLocks, ttl: int, token: str, timeout: float | None, poll: float
    ) -> LockLease:
        """Announce the wait and wait in the core's engine; the lease, or ``WaitTimeout``."""

        try:
            return wait_acquire(
                client,
                self.lock_key,
                ttl,
                timeout=timeout,
                token=token,
                poll=poll,
                on_waiting=self.on_waiting,
                policy=wait_policy(),
            )
        finally:
            self.close()

    def announce(self, holder: LockState | None) -> None:
        """Say in the task log that the try waits here (and how to defer), and tell the lock board."""

        self.log.info(
            "Lock %r is %s; waiting for it in this worker slot (deferrable=False; the default "
            "follows [operators] default_deferrable, off unless set). To wait in the "
            "triggerer without holding a slot, pass deferrable=True or set "
            "[operators] default_deferrable = True.",
            self.lock_key,
            holder_facts(holder, self.lock_key, self.hook.keyring),
        )
        if self.ti is None:
            return
        try:
            self.ti.xcom_push(
                key=WAITING_XCOM_KEY,
                value={"lock_key": self.lock_key, "since": datetime.now(UTC).isoformat(timespec="seconds")},
            )
        except Exception as exc:
            self.log.warning(
                "Could not tell the lock board that this task waits for %r: %s", self.lock_key, exc
            )

    def on_waiting(self, holder: LockState | None, waited: float) -> None:
        """Look for a stranded handoff every few seconds of the wait; write a line every minute.

        The line names the lock, the holder's fencing token, until when its lease runs and whether it
        is a handoff to a task that has not resumed yet.
        """
        if waited < 1.0:
            return  # the wait's start is announced by announce(), with how to defer instead
        if self._look_client is None:
            self._look_client = self.hook.get_client()
        client = self._look_client
        try:
            record, state = self._look_at_handoff(client)
        except Exception as exc:  # never let a look end the wait; say so and wait on
            self.log.warning("Looking at the handoff record of lock %r failed: %s", self.lock_key, exc)
            record, state = None, None
        if waited - self._reported_at < REPORT_EVERY:
            return
        self._reported_at = waited
        when = expected_start(reported())  # the engine's estimate, inside its report (issue 30)
        # Issue 28: a fresh read (a refusal says neither who nor when; the engine's last look may be old).
        holder = read_state(client, self.lock_key, self.log)

        self.log.info(
            "Still waiting for lock %r in this worker slot after %.0f s; it is %s; %s",
            self.lock_key,
            waited,
            waiting_facts(
                holder,
                record,
                state,
                read_holder(self.hook.keyring, self.lock_key, logger=self.log),
                age=0.0,
            ),
            when,
        )

    def _look_at_handoff(self, client: VolcanoLocks) -> tuple[HandoffRecord | None, object]:
        """Free the lock's handoff lease if the try it was acquired for can no longer use it.

        Returns the record still standing (or ``None``) and its owner's state, for the waiting lines.
        """
        seen = look(self.lock_key, (self.waiter,), client, self.hook, self.log)
        if seen.warning is not None:
            self.log.warning("%s", seen.warning)
        if seen.freed:
            wake(self.lock_key)
        return seen.record, seen.state

    def close(self) -> None:
        """Close the looks' client (the end of the wait)."""
        client, self._look_client = self._look_client, None
        if client is not None:
            client.close()
