"""One hold for every locked task: the decisions of a locked task's life, in one place.

The operator (and the TaskFlow decorator, which is the operator), a lock group's acquire task and a
group member each hold their lease through a :class:`TaskHold`; they differ only in how they came by
the lease (the first answer, a wait, the trigger's handoff, the group's lease checked) and in whether
the lease ends with the task:

* **keep, with interrupt**: the core's keeper (:func:`volcano_locks.integration.keep`) renews the lease
  while the body runs and, on loss, raises in the body's thread at once: no kind of locked task writes
  on after its loss (a member used to, for the rest of its body);
* **the body** is called with the lease; its result is the task's;
* **release or leave held**: a task's own lease is released through the core's
  :func:`~volcano_locks.integration.release_or_lapse` (a refusal is retried while the lease lives, then
  left to lapse: it never fails finished work); a group's acquire task and its members leave the
  group's lease held for the group's next task;
* **loss** (while the body ran, or found by the release) fails the task with
  :class:`~airflow_provider_volcano.exceptions.VolcanoLockLost` naming why: the board's force release
  (its record), the task's kill, or the server's refusal;
* **kill** (``on_kill``): the lease is released at once and the body, if it runs in the killing
  thread, stopped.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from airflow.sdk.exceptions import AirflowException

from airflow_provider_volcano._compat import AirflowFailException, AirflowSkipException
from airflow_provider_volcano._handoff import TriggerHandoff
from airflow_provider_volcano._once import bound_once, skip_duplicate
from airflow_provider_volcano._tokens import TaskIdentity, new_nonce
from airflow_provider_volcano.exceptions import VolcanoLockContended, VolcanoLockLost
from airflow_provider_volcano.records.forced import forced_line, read_forced
from airflow_provider_volcano.records.handoff import clear_handoff
from airflow_provider_volcano.records.holder import write_holder
from airflow_provider_volcano.records.tenure import now_iso, write_tenure
from airflow_provider_volcano.runtime.acquiring import acquire_answered, holder_facts, read_state, remaining
from airflow_provider_volcano.runtime.beside import beside
from airflow_provider_volcano.runtime.body import call_with_lease
from airflow_provider_volcano.runtime.handoff_look import first_answer
from airflow_provider_volcano.runtime.member import group_lease
from airflow_provider_volcano.runtime.slot_wait import SlotWait
from airflow_provider_volcano.runtime.supervision import SupervisorGone, supervised
from airflow_provider_volcano.triggers.lock import VolcanoLockTrigger
from volcano_locks import ConflictError, InvalidRequest, OwnershipLost, VolcanoError, WaitTimeout
from volcano_locks.integration import keep, release_or_lapse
from volcano_locks.once import AlreadyDone

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from airflow.sdk import Context

    from airflow_provider_volcano.hooks.volcano import VolcanoHook
    from volcano_locks import LockGuard, LockLease, VolcanoLocks

__all__ = ["LockedTask", "TaskHold"]


class LockedTask(Protocol):
    """What a hold reads of its task: the operator's settings (``VolcanoLockOperator``'s arguments)."""

    lock_key: str
    ttl: int
    on_contention: str
    deferrable: bool
    wait_timeout: float | None
    poll_interval: float
    handoff_ttl: int
    volcano_conn_id: str
    python_callable: Callable[..., Any]
    op_args: Collection[Any]
    op_kwargs: Mapping[str, Any]
    once_key: str | None
    ledger: Any

    @property
    def hook(self) -> VolcanoHook: ...
    @property
    def log(self) -> Any: ...
    def defer(self, *, trigger: Any, method_name: str, kwargs: dict[str, Any] | None = ...) -> NoReturn: ...
    def _lease_kind(self) -> tuple[str, str | None]: ...


class TaskHold:
    """One locked task's life with its lock, from its first answer to its release (or not).

    :param task: the task's settings (the operator).
    :param context: the running task's context.
    :param leaves_held: leave the lease held when the task ends (a lock group's tasks), instead of
        releasing it.
    :param what: how lines name the lock: ``"lock"``, or ``"the group's lock"``.
    :param body: what runs under the lease (default: the task's callable, given the lease's facts).
    """

    def __init__(
        self,
        task: LockedTask,
        context: Context,
        *,
        leaves_held: bool = False,
        what: str = "lock",
        body: Callable[[LockLease], Any] | None = None,
    ) -> None:
        self.task, self.context, self.log = task, context, task.log
        self.lock_key, self.task_id = task.lock_key, context["ti"].task_id
        self.leaves_held, self.what = leaves_held, what
        self.body = body if body is not None else self.call
        self.owner: TaskIdentity | None = None  # this try, once known (its nonce drawn or resumed)
        self._guard: LockGuard | None = None
        self._body_thread: int | None = None
        self._killed = False
        self._ending: str | None = None  # how the hold ended, for the board's history (set by run, kill)

    # -- coming by the lease -------------------------------------------------------------------------

    def acquire_and_run(
        self, deadline: float | None, nonce: str | None = None, handoff: TriggerHandoff | None = None
    ) -> Any:
        """Acquire (or wait, skip, fail, defer), then hold and run, while the task's supervisor lives."""
        task, context = self.task, self.context
        # This try's owner nonce: drawn once (here), carried to the trigger and the resumed execution.
        nonce = nonce if nonce is not None else new_nonce()
        owner = self.owner = TaskIdentity.from_task_instance(context["ti"], nonce)
        gone = (
            f"The task's supervisor is gone: the task stopped its body and gave up lock {self.lock_key!r} "
            "(see the line before)"
        )
        with (
            supervised(context["ti"], self.log, self.holding, lambda: gone),
            contextlib.closing(task.hook.get_client()) as client,
        ):
            lease = self._acquire(client, owner, deadline, handoff)
            if handoff is not None and lease.fencing_token != handoff.fencing_token:
                self.log.warning(
                    "%s",
                    handoff.lapsed_line(
                        self.lock_key,
                        "The lock was still free, so it was acquired anew "
                        f"(fencing token {lease.fencing_token}).",
                    ),
                )
            # The board's holder and tenure records, and the end of the handoff record: beside the body,
            # not before. The tenure's end is written after that thread is joined, so it lands last.
            keys, (kind, _release) = task.hook.keyring, task._lease_kind()
            token, acquired_at = lease.fencing_token, now_iso()
            bookkeeping = [
                partial(write_holder, keys, context, self.lock_key, token, task.ttl, kind, self.log)
            ]
            if not self.leaves_held:  # a lock group's lease has no tenure of one task
                bookkeeping.append(partial(write_tenure, keys, context, self.lock_key, token, acquired_at))
            if handoff is not None:
                bookkeeping.insert(
                    0, partial(clear_handoff, keys, self.lock_key, token, self.log, owner=owner)
                )
            try:
                with beside(*bookkeeping, logger=self.log):
                    if not self.leaves_held:  # a group's acquire task says what it holds for the group
                        self.log.info(
                            "Holding lock %r (fencing token %s, ttl %s s, owner %s)",
                            self.lock_key,
                            token,
                            task.ttl,
                            nonce,  # public: the token is derived from it and the service key
                        )
                    return self.run(client, lease, self.body)
            finally:
                if self._ending is not None and not self.leaves_held:
                    write_tenure(keys, context, self.lock_key, token, acquired_at, self._ending, self.log)

    def run_member(self, acquire_task_id: str, poll: float) -> Any:
        """A group member: check the group's lease, hold it while the body runs, leave it held."""
        task, context, log = self.task, self.context, self.log
        with contextlib.closing(task.hook.get_client()) as client:
            lease = group_lease(
                context, client, hook=task.hook, acquire_task_id=acquire_task_id, poll=poll, log=log
            )
            key, fencing = lease.key, lease.fencing_token
            self.lock_key = key
            gone = (
                f"The task's supervisor is gone: task {self.task_id!r} stopped its body and stopped renewing "
                f"the group's lock {key!r} (fencing token {fencing}); the group's release task or its ttl "
                "ends the lease"
            )
            with (
                # The member running now is the one the board names.
                beside(
                    partial(write_holder, task.hook.keyring, context, key, fencing, lease.ttl, "group", log),
                    logger=log,
                ),
                supervised(context["ti"], log, self.holding, lambda: gone),
            ):
                result = self.run(client, lease, self.body)
        log.info("Kept the group's lock %r (fencing token %s) for the group's next task", key, fencing)
        return result

    def _acquire(
        self,
        client: VolcanoLocks,
        owner: TaskIdentity,
        deadline: float | None,
        handoff: TriggerHandoff | None,
    ) -> LockLease:
        """The lease, from the first answer or a wait in the slot; else skip, fail or defer (raises)."""
        task = self.task
        key = None
        if handoff is not None and handoff.key_id is not None:
            key = task.hook.keyring.find(handoff.key_id)
            if key is None:
                self.log.warning(
                    "The trigger acquired lock %r under another service key than the connection lists "
                    "now (was the service key rotated? add the old key to previous_service_keys): this "
                    "try cannot take that lease over, which lapses by its handoff allowance at most",
                    self.lock_key,
                )
        token = task.hook.ownership_token(owner, self.lock_key, key)
        attempt = partial(
            acquire_answered,
            client,
            self.lock_key,
            task.ttl,
            token,
            deadline=deadline,
            bound=f"wait_timeout={task.wait_timeout}",
            poll=task.poll_interval,
            log=self.log,
        )
        try:
            try:
                # Issue 28: a handoff stranded by a user action is freed at this first refusal.
                return first_answer(attempt, task.hook, client, self.lock_key, owner, self.log)
            except ConflictError as exc:  # either 409: contention (or our own lapsed handoff)
                if task.on_contention != "wait" or task.deferrable:
                    self._contended(client, deadline, owner, handoff)
                slot = SlotWait(task.hook, self.lock_key, owner, self.context["ti"], self.log)
                slot.announce(
                    exc.holder if exc.holder is not None else read_state(client, self.lock_key, self.log)
                )
                return slot.wait(client, task.ttl, token, remaining(deadline), task.poll_interval)
        except WaitTimeout as exc:
            raise VolcanoLockContended(
                f"Timed out after {task.wait_timeout} s waiting for lock {self.lock_key!r}, "
                f"{holder_facts(exc.holder, self.lock_key, task.hook.keyring)}"
            ) from None
        except InvalidRequest as exc:
            raise AirflowFailException(f"Invalid lock request for {self.lock_key!r}: {exc}") from None

    def _contended(
        self,
        client: VolcanoLocks,
        deadline: float | None,
        owner: TaskIdentity,
        handoff: TriggerHandoff | None,
    ) -> NoReturn:
        """Skip, fail, time out or defer on a held lock (after a lapsed handoff: say so first)."""
        task = self.task
        facts = holder_facts(read_state(client, self.lock_key, self.log), self.lock_key, task.hook.keyring)
        allowance = task.handoff_ttl
        if handoff is not None:
            allowance = handoff.next_allowance(task.handoff_ttl)
            self.log.warning(
                "%s",
                handoff.lapsed_line(
                    self.lock_key,
                    f"The lock is now {facts}; waiting again with a handoff allowance of {allowance} s.",
                ),
            )
        kind, release_task_id = task._lease_kind()
        if task.on_contention == "skip":
            raise AirflowSkipException(f"Lock {self.lock_key!r} is {facts}; skipping (on_contention='skip')")
        if task.on_contention == "fail":
            raise VolcanoLockContended(f"Lock {self.lock_key!r} is {facts} (on_contention='fail')")
        if deadline is not None and time.time() >= deadline:
            raise VolcanoLockContended(
                f"Timed out after {task.wait_timeout} s waiting for lock {self.lock_key!r}, {facts}"
            )

        self.log.info(
            "Lock %r is %s; deferring until it is free (owner %s)", self.lock_key, facts, owner.nonce
        )
        task.defer(
            trigger=VolcanoLockTrigger(
                volcano_conn_id=task.volcano_conn_id,
                lock_key=self.lock_key,
                ttl=task.ttl,
                identity=owner.as_dict(),
                deadline=deadline,
                poll=task.poll_interval,
                handoff_ttl=allowance,
                kind=kind,
                release_task_id=release_task_id,
            ),
            method_name="execute_complete",
            kwargs={"deadline": deadline, "nonce": owner.nonce},
        )

    def resume(self, event: Mapping[str, Any], deadline: float | None, nonce: str | None) -> Any:
        """After the trigger's event: hold and run if it acquired, else fail with its reason."""
        status, message = event.get("status"), event.get("message") or ""
        if deadline is None and isinstance(event.get("deadline"), int | float):
            deadline = float(event["deadline"])
        # Echoed by the trigger too, where the deferral's method kwargs are not carried over (dag.test()).
        nonce = nonce or event.get("nonce")
        if status == "acquired":
            handoff = TriggerHandoff.from_event(event, self.task.handoff_ttl)
            self.log.info(
                "Trigger acquired lock %r (fencing token %s) %s before this resume (handoff allowance %s s); "
                "resuming",
                self.lock_key,
                event.get("fencing_token"),
                handoff.describe_delay(),
                handoff.allowance,
            )
            if not isinstance(nonce, str):
                raise AirflowException(
                    f"Resumed for lock {self.lock_key!r} without this try's owner nonce; cannot "
                    "prove ownership of the lease the trigger acquired"
                )
            return self.acquire_and_run(deadline, nonce, handoff)
        if status == "timeout":
            raise VolcanoLockContended(
                f"Timed out waiting for lock {self.lock_key!r} "
                f"(held with fencing token {event.get('fencing_token')}): {message}"
            )
        raise AirflowException(
            f"Waiting for lock {self.lock_key!r} failed: {message or 'the trigger gave no reason'}"
        )

    def call(self, lease: LockLease) -> Any:
        """The task's callable, given the lease's public facts (and XCom ``volcano_lease``); with a
        ``once_key``, skipped when the business key is already done (naming the first run)."""
        task, context = self.task, self.context
        if task.once_key is None:
            return call_with_lease(task.python_callable, task.op_args, task.op_kwargs, context, lease)
        once = bound_once(task.ledger, task.once_key, context, lease)
        done = once.lookup()
        if done is not None:
            raise skip_duplicate(context, done)
        try:
            return call_with_lease(task.python_callable, task.op_args, task.op_kwargs, context, lease, once)
        except AlreadyDone as exc:  # recorded first by a run the look-up did not see
            raise skip_duplicate(context, exc.record) from None

    # -- holding it ----------------------------------------------------------------------------------

    def run(self, client: VolcanoLocks, lease: LockLease, body: Callable[[LockLease], Any]) -> Any:
        """Keep ``lease`` while ``body(lease)`` runs (interrupted on loss), then release it or leave it held.

        :raises VolcanoLockLost: the lease was lost while the body ran, or found taken by the release.
        """
        try:
            with keep(client, lease, interrupt=True) as guard:
                self._guard, self._body_thread = guard, threading.get_ident()
                result = body(lease)
        except OwnershipLost as exc:
            if not self.leaves_held:
                self._give_back(client, self.latest(lease))
            raise self.lost(exc, lease) from None
        except BaseException as exc:
            if self._killed or self.leaves_held:
                raise
            released = self._give_back(client, self.latest(lease))
            # Without a supervisor no Variable can be written: the board calls that tenure expired.
            self._ending = None if isinstance(exc, SupervisorGone) else "released" if released else "lapsed"
            if released:
                skipped = isinstance(exc, AirflowSkipException)  # a run-once duplicate, or the callable's
                self.log.info(
                    "Released %s %r (fencing token %s) %s",
                    self.what,
                    self.lock_key,
                    lease.fencing_token,
                    "as the task is skipped" if skipped else "after the callable failed",
                )
            raise
        finally:
            latest = self.latest(lease)
            self._guard = self._body_thread = None
        if self.leaves_held:
            return result
        try:
            outcome = release_or_lapse(client, latest, log=self.log)
        except OwnershipLost as exc:  # found taken on the way out: the body may have run unprotected
            raise self.lost(exc, lease) from None
        self._ending = "released" if outcome.released else "lapsed"
        if outcome.released:
            self.log.info("Released %s %r (fencing token %s)", self.what, self.lock_key, lease.fencing_token)
        return result

    def latest(self, lease: LockLease) -> LockLease:
        """The latest renewal of ``lease`` while the body runs (``lease`` itself otherwise)."""
        guard = self._guard
        return guard.lease if guard is not None and guard.lease is not None else lease

    def holding(self) -> str:
        """What the supervision watch names: the lock, and the fencing token once held."""
        lease = self._guard.lease if self._guard is not None else None
        held = f" (fencing token {lease.fencing_token})" if lease is not None else ""
        return f"{self.what} {self.lock_key!r}{held}"

    def lost(self, exc: BaseException | None, lease: LockLease | None = None) -> VolcanoLockLost:
        """The task's failure on a loss, naming why (the board's force release, a kill, or ``exc``)."""
        fencing = f" (fencing token {lease.fencing_token})" if lease is not None else ""
        forced = (
            None
            if self._killed or lease is None
            else read_forced(self.task.hook.keyring, self.lock_key, lease.fencing_token, self.log)
        )
        if not self._killed:
            self._ending = "force-released" if forced is not None else "lost"
        if forced is not None:
            self.log.error("Lock %r was force-released: %s", self.lock_key, forced_line(forced))
        why = (
            "the task was killed and released it"
            if self._killed
            else (forced_line(forced) if forced is not None else str(exc))
        )
        return VolcanoLockLost(
            f"Lost ownership of {self.what} {self.lock_key!r}{fencing} while task {self.task_id!r} ran "
            f"({why}); its body was stopped and the task is failed because its work is no longer "
            "protected by the lock"
        )

    def kill(self) -> None:
        """``on_kill``: release the lease now and stop the body if it runs in this thread.

        Airflow answers SIGTERM by calling ``on_kill`` in the task's main thread, which is where the
        body runs: raising :class:`VolcanoLockLost` there stops the protected work at once instead of
        letting it run unprotected until the keeper's next renewal notices the release.
        """
        guard, body_thread = self._guard, self._body_thread
        if guard is None:
            return
        self._killed = True
        lease = guard.lease
        if lease is not None and not self.leaves_held:
            try:
                with self.task.hook.get_client() as releaser:  # the task's own client is mid-call
                    releaser.release(self.lock_key, lease)
                self._ending = "released"
                self.log.info(
                    "Released %s %r (fencing token %s) on kill", self.what, self.lock_key, lease.fencing_token
                )
            except VolcanoError as exc:
                self.log.warning("Could not release %s %r on kill: %s", self.what, self.lock_key, exc)
        if threading.get_ident() == body_thread:
            raise self.lost(None)

    def _give_back(self, client: VolcanoLocks, lease: LockLease) -> bool:
        """Release ``lease`` after a failure or a loss, quietly: a refusal is logged, never raised."""
        try:
            client.release(self.lock_key, lease)
        except VolcanoError as exc:
            self.log.warning("Could not release %s %r: %s", self.what, self.lock_key, exc)
            return False
        return True
