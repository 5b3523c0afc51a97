"""VolcanoLockOperator: runs a callable while holding a Volcano project lock.

The operator holds behaviour only: ``execute`` acquires through the core (the first try never waits,
see :mod:`airflow_provider_volcano._acquiring`; a wait in the worker slot is
:mod:`airflow_provider_volcano._slot_wait`) or defers to
:class:`~airflow_provider_volcano.triggers.lock.VolcanoLockTrigger`, and ``execute_complete`` resumes
with the lease the trigger acquired. The body runs under the lease kept by the core
(:func:`volcano_locks.keeping.keep`); a group member runs under its group's lease
(:mod:`airflow_provider_volcano._member`). Nothing of the core, the hook or httpx is imported here
until a task runs: parsing a DAG stays cheap.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import timedelta
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from airflow_provider_volcano._body import LEASE_KWARG, LEASE_XCOM_KEY
from airflow_provider_volcano._compat import AirflowFailException, AirflowSkipException, conf
from airflow_provider_volcano.exceptions import VolcanoLockContended, VolcanoLockLost

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_volcano._handoff import TriggerHandoff
    from airflow_provider_volcano._tokens import TaskIdentity
    from airflow_provider_volcano.hooks.volcano import VolcanoHook
    from volcano_locks.client import VolcanoLocks
    from volcano_locks.guard import LockGuard
    from volcano_locks.models import LockLease

__all__ = [
    "DEFAULT_HANDOFF_TTL",
    "LEASE_KWARG",
    "LEASE_XCOM_KEY",
    "ON_CONTENTION",
    "VolcanoLockContended",
    "VolcanoLockLost",
    "VolcanoLockOperator",
]

ON_CONTENTION = ("wait", "skip", "fail")
DEFAULT_HANDOFF_TTL = 300
"""Seconds a lease the trigger acquired waits for its task to resume (see the operator's docstring)."""


class VolcanoLockOperator(BaseOperator):
    """Runs ``python_callable`` while holding the Volcano lock ``lock_key`` for the whole run.

    The lease is renewed by the core keeper while the callable runs and released afterwards,
    also on failure. If ownership is lost the callable is interrupted and the task fails
    (:class:`VolcanoLockLost`); it is never marked successful for work done after the loss.
    The callable receives the lease's public facts (``lock_key``, ``fencing_token``,
    ``acquired_at``, ``expires_at``) if it has a ``volcano_lease`` parameter; they also go to
    XCom under ``volcano_lease``. The ownership token never leaves the worker.

    :param lock_key: the lock to hold (templated; e.g. per map index).
    :param python_callable: the callable to run while holding the lock.
    :param op_args: positional arguments for the callable (templated).
    :param op_kwargs: keyword arguments for the callable (templated).
    :param ttl: the lease TTL in seconds (5 to 7,776,000); it bounds how long a crashed worker
        keeps the lock.
    :param on_contention: ``wait`` (default), ``skip`` (AirflowSkipException naming the holder's
        fencing token) or ``fail``. Where ``wait`` waits follows ``deferrable``. ``skip`` and
        ``fail`` decide on real contention only: an unreachable API (no response, 503, 429) is
        waited out first, up to ``wait_timeout``.
    :param wait_timeout: give up waiting after this many seconds (or timedelta); ``None`` waits
        without bound.
    :param deferrable: wait in the triggerer instead of a worker slot. The default follows Airflow's
        ``[operators] default_deferrable`` option, which is off unless set: a plain
        ``on_contention="wait"`` then waits in its worker slot (and says so in the task log).
    :param poll_interval: seconds between reads of a held lock while waiting.
    :param handoff_ttl: seconds the lease the trigger acquired for this task survives until the
        task resumes (default 300, and never less than ``ttl``). The resumed task re-acquires it
        idempotently, which sets it to ``ttl`` from then on, and renews it at ``ttl``. Set it above
        your executor's worst resume delay (queueing, pod start, a busy pool slot); it is also how
        long the lock stays idle if a resumed task never starts. A handoff that lapsed anyway is
        logged with the measured delay, and the task waits again with a longer allowance.
    :param lock_group: run inside a :class:`~airflow_provider_volcano.operators.group.VolcanoLockGroup`
        (the group, its acquire task or that task's id) under the group's lease instead of a lock
        of its own; ``lock_key`` is then taken from the group and must not be given.
    :param volcano_conn_id: the Volcano connection id.
    """

    template_fields: Sequence[str] = ("lock_key", "op_args", "op_kwargs")
    template_fields_renderers: ClassVar[dict[str, str]] = {"op_args": "py", "op_kwargs": "py"}
    shallow_copy_attrs: Sequence[str] = ("python_callable",)
    ui_color = "#f2c6b4"

    def __init__(
        self,
        *,
        lock_key: str | None = None,
        python_callable: Callable[..., Any],
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        ttl: int = 30,
        on_contention: str = "wait",
        wait_timeout: float | timedelta | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 2.0,
        handoff_ttl: int = DEFAULT_HANDOFF_TTL,
        lock_group: Any = None,
        volcano_conn_id: str = "volcano_default",
        **kwargs: Any,
    ) -> None:
        # The core's rules, each in one place; imported here, not at module level (DAG parsing).
        from volcano_locks.protocol import validate_key, validate_poll, validate_ttl, validate_wait_timeout

        super().__init__(**kwargs)
        if not callable(python_callable):
            raise TypeError(f"python_callable must be callable, got {python_callable!r}")
        self.lock_group_task_id = _group_task_id(lock_group)
        if self.lock_group_task_id is not None:
            if lock_key is not None:
                raise ValueError(
                    f"lock_key {lock_key!r} must not be given with lock_group: a group member runs "
                    "under the group's lock"
                )
            lock_key = ""  # a member holds no lock of its own: the key is its group's
        elif not isinstance(lock_key, str) or not lock_key:
            raise ValueError(f"lock_key must be a non-empty string, got {lock_key!r}")
        elif "{{" not in lock_key and "{%" not in lock_key:
            validate_key(lock_key)  # a literal key is checked at parse time; a template when rendered
        if on_contention not in ON_CONTENTION:
            raise ValueError(f"on_contention must be one of {ON_CONTENTION}, got {on_contention!r}")
        validate_poll(poll_interval, name="poll_interval")
        self.lock_key = lock_key
        self.python_callable = python_callable
        self.op_args: Collection[Any] = list(op_args or [])
        self.op_kwargs: Mapping[str, Any] = dict(op_kwargs or {})
        self.ttl = validate_ttl(ttl)
        self.handoff_ttl = max(self.ttl, validate_ttl(handoff_ttl, name="handoff_ttl"))
        self.on_contention = on_contention
        self.wait_timeout = validate_wait_timeout(wait_timeout)
        self.deferrable = bool(deferrable)
        self.poll_interval = float(poll_interval)
        self.volcano_conn_id = volcano_conn_id
        self._active: LockGuard | None = None  # the guard of the running body, for on_kill
        self._body_thread: int | None = None
        self._killed = False

    @cached_property
    def hook(self) -> VolcanoHook:
        """The hook for ``volcano_conn_id`` (built on first use): the one path to a client."""
        from airflow_provider_volcano.hooks.volcano import VolcanoHook

        return VolcanoHook(self.volcano_conn_id)

    # -- execution -------------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        """Acquire the lock (or wait, skip, fail per ``on_contention``) and run the callable."""
        if self.lock_group_task_id is not None:
            from airflow_provider_volcano._member import run_member

            return run_member(
                context,
                hook=self.hook,
                acquire_task_id=self.lock_group_task_id,
                body=partial(self._call, context),
                log=self.log,
                poll=self.poll_interval,
            )
        from airflow_provider_volcano._tokens import new_nonce

        deadline = None if self.wait_timeout is None else time.time() + self.wait_timeout
        # This try's owner nonce: drawn once, carried to the trigger and the resumed execution.
        return self._run_locked(context, deadline, new_nonce())

    def execute_complete(
        self,
        context: Context,
        event: dict[str, Any],
        deadline: float | None = None,
        nonce: str | None = None,
    ) -> Any:
        """Resume after :class:`VolcanoLockTrigger` fired: run if acquired, else fail with its reason."""
        status = event.get("status")
        message = event.get("message") or ""
        if deadline is None and isinstance(event.get("deadline"), int | float):
            deadline = float(event["deadline"])
        # Echoed by the trigger too, where the deferral's method kwargs are not carried over (dag.test()).
        nonce = nonce or event.get("nonce")
        if status == "acquired":
            from airflow_provider_volcano._handoff import TriggerHandoff

            handoff = TriggerHandoff.from_event(event, self.handoff_ttl)
            self.log.info(
                "Trigger acquired lock %r (fencing token %s) %s before this resume (handoff "
                "allowance %s s); resuming",
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
            return self._run_locked(context, deadline, nonce, handoff)
        if status == "timeout":
            raise VolcanoLockContended(
                f"Timed out waiting for lock {self.lock_key!r} "
                f"(held with fencing token {event.get('fencing_token')}): {message}"
            )
        raise AirflowException(
            f"Waiting for lock {self.lock_key!r} failed: {message or 'the trigger gave no reason'}"
        )

    def _run_locked(
        self, context: Context, deadline: float | None, nonce: str, handoff: TriggerHandoff | None = None
    ) -> Any:
        """Acquire (or wait, skip, fail, defer), then hold and run, while the task's supervisor lives."""
        from airflow_provider_volcano._provenance import write_holder
        from airflow_provider_volcano._supervision import supervised
        from airflow_provider_volcano._tokens import TaskIdentity

        owner = TaskIdentity.from_task_instance(context["ti"], nonce)
        gone = (
            f"The task's supervisor is gone: the task stopped its body and gave up lock {self.lock_key!r} "
            "(see the line before)"
        )
        with (
            supervised(context["ti"], self.log, self._holding_what, lambda: gone),
            contextlib.closing(self.hook.get_client()) as client,
        ):
            lease = self._acquire(client, context, owner, deadline, handoff)
            if handoff is not None and lease.fencing_token != handoff.fencing_token:
                self.log.warning(
                    "%s",
                    handoff.lapsed_line(
                        self.lock_key,
                        "The lock was still free, so it was acquired anew "
                        f"(fencing token {lease.fencing_token}).",
                    ),
                )
            # The board's holder record, and the end of the handoff record: beside the body, not before.
            bookkeeping = [partial(write_holder, context, self.lock_key, lease.fencing_token, self.ttl)]
            if handoff is not None:
                bookkeeping.insert(0, partial(self._handoff_done, lease, owner))
            from airflow_provider_volcano._beside import beside

            with beside(*bookkeeping, logger=self.log):
                return self._hold(client, context, lease, nonce)

    def _acquire(
        self,
        client: VolcanoLocks,
        context: Context,
        owner: TaskIdentity,
        deadline: float | None,
        handoff: TriggerHandoff | None,
    ) -> LockLease:
        """The lease, from the first answer or a wait in the slot; else skip, fail or defer (raises)."""
        from airflow_provider_volcano._acquiring import acquire_answered, read_state, remaining
        from volcano_locks.errors import ConflictError, InvalidRequest, WaitTimeout

        token = self.hook.ownership_token(owner, self.lock_key)
        try:
            try:
                return acquire_answered(
                    client,
                    self.lock_key,
                    self.ttl,
                    token,
                    deadline=deadline,
                    bound=f"wait_timeout={self.wait_timeout}",
                    poll=self.poll_interval,
                    log=self.log,
                )
            except ConflictError as exc:  # either 409: contention (or our own lapsed handoff)
                if self.on_contention != "wait" or self.deferrable:
                    self._contended(client, context, deadline, owner.nonce, handoff)
                from airflow_provider_volcano._slot_wait import SlotWait

                slot = SlotWait(self.hook, self.lock_key, owner, context["ti"], self.log)
                slot.announce(
                    exc.holder if exc.holder is not None else read_state(client, self.lock_key, self.log)
                )
                return slot.wait(client, self.ttl, token, remaining(deadline), self.poll_interval)
        except WaitTimeout as exc:
            from airflow_provider_volcano._acquiring import holder_facts

            raise VolcanoLockContended(
                f"Timed out after {self.wait_timeout} s waiting for lock {self.lock_key!r}, "
                f"{holder_facts(exc.holder, self.lock_key)}"
            ) from None
        except InvalidRequest as exc:
            raise AirflowFailException(f"Invalid lock request for {self.lock_key!r}: {exc}") from None

    def _hold(self, client: VolcanoLocks, context: Context, lease: LockLease, nonce: str) -> Any:
        """Run the callable under ``lease`` (kept by the core, interrupted on loss), then release it."""
        from volcano_locks.errors import OwnershipLost
        from volcano_locks.keeping import keep

        self.log.info(
            "Holding lock %r (fencing token %s, ttl %s s, owner %s)",
            self.lock_key,
            lease.fencing_token,
            self.ttl,
            nonce,  # public: the token is derived from it and the service key
        )
        try:
            with keep(client, lease, interrupt=True) as guard:
                self._active, self._body_thread = guard, threading.get_ident()
                result = self._call(context, lease)
        except OwnershipLost as exc:
            self._release(client, self._latest(lease), quietly=True)
            raise self._lost(exc, lease) from None
        except BaseException:
            if not self._killed and self._release(client, self._latest(lease), quietly=True):
                self.log.info(
                    "Released lock %r (fencing token %s) after the callable failed",
                    self.lock_key,
                    lease.fencing_token,
                )
            raise
        finally:
            latest = self._latest(lease)
            self._active = self._body_thread = None
        self._release(client, latest, quietly=False)
        self.log.info("Released lock %r (fencing token %s)", self.lock_key, lease.fencing_token)
        return result

    def _call(self, context: Context, lease: LockLease) -> Any:
        from airflow_provider_volcano._body import call_with_lease

        return call_with_lease(self.python_callable, self.op_args, self.op_kwargs, context, lease)

    def _latest(self, lease: LockLease) -> LockLease:
        guard = self._active
        return guard.lease if guard is not None and guard.lease is not None else lease

    def _release(self, client: VolcanoLocks, lease: LockLease, *, quietly: bool) -> bool:
        """Release ``lease``; a failure is logged (and raised unless ``quietly``)."""
        from volcano_locks.errors import VolcanoError

        try:
            client.release(self.lock_key, lease)
        except VolcanoError as exc:
            self.log.warning("Could not release lock %r: %s", self.lock_key, exc)
            if not quietly:
                raise
            return False
        return True

    def _holding_what(self) -> str:
        """What the supervision watch names: the lock, and the fencing token once held."""
        lease = self._active.lease if self._active is not None else None
        held = f" (fencing token {lease.fencing_token})" if lease is not None else ""
        return f"lock {self.lock_key!r}{held}"

    def _handoff_done(self, lease: LockLease, owner: TaskIdentity) -> None:
        """The resumed task holds the trigger's lease: it is no longer a handoff (delete the record)."""
        from airflow_provider_volcano._handoff import clear_record

        clear_record(self.lock_key, lease.fencing_token, self.log, owner=owner)

    def _lost(self, exc: BaseException | None, lease: LockLease | None = None) -> VolcanoLockLost:
        from airflow_provider_volcano._provenance import forced_line, read_forced

        forced = None if self._killed or lease is None else read_forced(self.lock_key, lease.fencing_token)
        if forced is not None:
            self.log.error("Lock %r was force-released: %s", self.lock_key, forced_line(forced))
        why = (
            "the task was killed and released it"
            if self._killed
            else (forced_line(forced) if forced is not None else str(exc))
        )
        return VolcanoLockLost(
            f"Lost ownership of lock {self.lock_key!r} while the task ran ({why}); "
            "the task is failed because its work is no longer protected by the lock"
        )

    def _contended(
        self,
        client: VolcanoLocks,
        context: Context,
        deadline: float | None,
        nonce: str,
        handoff: TriggerHandoff | None,
    ) -> NoReturn:
        """Skip, fail, time out or defer on a held lock (after a lapsed handoff: say so first)."""
        from airflow_provider_volcano._acquiring import holder_facts, read_state

        facts = holder_facts(read_state(client, self.lock_key, self.log), self.lock_key)
        allowance = self.handoff_ttl
        if handoff is not None:
            allowance = handoff.next_allowance(self.handoff_ttl)
            self.log.warning(
                "%s",
                handoff.lapsed_line(
                    self.lock_key,
                    f"The lock is now {facts}; waiting again with a handoff allowance of {allowance} s.",
                ),
            )
        if self.on_contention == "skip":
            raise AirflowSkipException(f"Lock {self.lock_key!r} is {facts}; skipping (on_contention='skip')")
        if self.on_contention == "fail":
            raise VolcanoLockContended(f"Lock {self.lock_key!r} is {facts} (on_contention='fail')")
        if deadline is not None and time.time() >= deadline:
            raise VolcanoLockContended(
                f"Timed out after {self.wait_timeout} s waiting for lock {self.lock_key!r}, {facts}"
            )
        self._defer(context, deadline, facts, nonce, allowance)

    def _defer(
        self, context: Context, deadline: float | None, facts: str, nonce: str, handoff_ttl: int
    ) -> NoReturn:
        from airflow_provider_volcano._tokens import TaskIdentity
        from airflow_provider_volcano.triggers.lock import VolcanoLockTrigger

        self.log.info("Lock %r is %s; deferring until it is free (owner %s)", self.lock_key, facts, nonce)
        self.defer(
            trigger=VolcanoLockTrigger(
                volcano_conn_id=self.volcano_conn_id,
                lock_key=self.lock_key,
                ttl=self.ttl,
                identity=TaskIdentity.from_task_instance(context["ti"], nonce).as_dict(),
                deadline=deadline,
                poll=self.poll_interval,
                handoff_ttl=handoff_ttl,
            ),
            method_name="execute_complete",
            kwargs={"deadline": deadline, "nonce": nonce},
        )

    def on_kill(self) -> None:
        """Release the lock when the task is killed, and stop the callable if it runs in this thread.

        Airflow answers SIGTERM by calling ``on_kill`` in the task's main thread, which is where the
        callable runs: raising :class:`VolcanoLockLost` there stops the protected work at once
        instead of letting it run unprotected until the keeper's next renewal notices the release.
        """
        guard, body_thread = self._active, self._body_thread
        if guard is None:
            return
        from volcano_locks.errors import VolcanoError

        self._killed = True
        lease = guard.lease
        if lease is not None:
            try:
                with self.hook.get_client() as releaser:
                    releaser.release(self.lock_key, lease)
                self.log.info(
                    "Released lock %r (fencing token %s) on kill", self.lock_key, lease.fencing_token
                )
            except VolcanoError as exc:
                self.log.warning("Could not release lock %r on kill: %s", self.lock_key, exc)
        if threading.get_ident() == body_thread:
            raise self._lost(None)


def _group_task_id(lock_group: Any) -> str | None:
    """The task id of a lock group's acquire task, from the group, that task or its id."""
    if lock_group is None:
        return None
    if isinstance(lock_group, str):
        if not lock_group:
            raise ValueError("lock_group must be a lock group, its acquire task or that task's id, got ''")
        return lock_group
    acquire = getattr(lock_group, "acquire", lock_group)
    task_id = getattr(acquire, "task_id", None)
    if not isinstance(task_id, str):
        raise ValueError(
            f"lock_group must be a lock group, its acquire task or that task's id, got {lock_group!r}"
        )
    return task_id
