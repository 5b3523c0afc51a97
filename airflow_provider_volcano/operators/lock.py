"""VolcanoLockOperator: runs a callable while holding a Volcano project lock."""

from __future__ import annotations

import contextlib
import math
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from airflow_provider_volcano._compat import AirflowFailException, AirflowSkipException, conf
from volcano_locks.protocol import MAX_TTL, validate_key, validate_poll, validate_ttl, validate_wait_timeout

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_volcano._handoff import HandoffRecord
    from airflow_provider_volcano._tokens import TaskIdentity
    from airflow_provider_volcano.hooks.volcano import VolcanoHook
    from volcano_locks import ConflictError, LockGuard, LockLease, LockState, VolcanoLocks
    from volcano_locks.waiting import WaitPolicy

__all__ = ["VolcanoLockContended", "VolcanoLockLost", "VolcanoLockOperator"]

ON_CONTENTION = ("wait", "skip", "fail")
LEASE_XCOM_KEY = "volcano_lease"
LEASE_KWARG = "volcano_lease"
DEFAULT_HANDOFF_TTL = 300
"""Seconds a lease the trigger acquired waits for its task to resume (see the operator's docstring)."""
HANDOFF_GROWTH_CAP = 4
"""A lapsed handoff is retried with a longer allowance, at most this many times ``handoff_ttl``."""
REPORT_EVERY = 60.0
"""Seconds between two "Still waiting" lines of a wait in the worker slot."""
_T = TypeVar("_T")
_MAX_BACKOFF = 30.0  # the longest pause between two tries against an unreachable API (as the trigger)


class VolcanoLockLost(AirflowException):
    """The task lost ownership of its Volcano lock while the callable ran."""


class VolcanoLockContended(AirflowException):
    """The lock was held by another owner (``on_contention="fail"``, or the wait timed out)."""


@dataclass(frozen=True)
class _Handoff:
    """What the trigger's event says about the lease it acquired for this task (all public)."""

    fencing_token: int | None
    acquired_at: datetime | None
    allowance: int

    @classmethod
    def from_event(cls, event: Mapping[str, Any], default_allowance: int) -> _Handoff:
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
        delay = self.delay()
        return "an unknown time" if delay is None else f"{delay:.1f} s"


def _holder_facts(state: LockState | None, lock_key: str | None = None) -> str:
    from airflow_provider_volcano._provenance import read_holder

    if state is None or not state.held:
        return "held by another owner"
    expires = state.expires_at.isoformat() if state.expires_at is not None else "unknown"
    known = lock_key is not None and state.fencing_token is not None
    provenance = read_holder(lock_key, state.fencing_token) if known and lock_key else None
    if provenance is not None:
        return f"{provenance.describe()}, until {expires}"
    return f"held by another owner with fencing token {state.fencing_token} until {expires}"


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
            lock_key = ""  # set at run time from the group's lease (the rendered key)
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
        self._active: Any = None  # the guard of the running block, for on_kill
        self._body_thread: int | None = None
        self._killed = False
        self._waiter: TaskIdentity | None = None  # the try waiting (frees stranded handoffs)
        self._reported_at = 0.0  # when the last "Still waiting" line was written (seconds waited)
        self._look_client: VolcanoLocks | None = None  # for the looks at handoffs during an in-slot wait
        self._ti: Any = None  # the running task instance (for the in-slot waiting marker)

    # -- helpers ---------------------------------------------------------------------------------

    @cached_property
    def hook(self) -> VolcanoHook:
        """The hook for ``volcano_conn_id`` (built on first use): the one path to a client."""
        from airflow_provider_volcano.hooks.volcano import VolcanoHook

        return VolcanoHook(self.volcano_conn_id)

    def _identity(self, context: Context, nonce: str) -> TaskIdentity:
        from airflow_provider_volcano._tokens import TaskIdentity

        return TaskIdentity.from_task_instance(context["ti"], nonce)

    def _token(self, context: Context, nonce: str) -> str:
        from airflow_provider_volcano._tokens import derive_token

        return derive_token(self.hook.config.service_key, self._identity(context, nonce), self.lock_key)

    def _holder(self, client: VolcanoLocks) -> LockState | None:
        from volcano_locks import VolcanoError

        try:
            return client.get(self.lock_key)
        except VolcanoError as exc:
            self.log.warning("Could not read the holder of lock %r: %s", self.lock_key, exc)
            return None

    def _call(self, context: Context, lease: LockLease) -> Any:
        from airflow.sdk.definitions.context import context_merge

        from airflow_provider_volcano._compat import determine_kwargs

        facts = lease.public_dict()
        context["ti"].xcom_push(key=LEASE_XCOM_KEY, value=facts)
        context_merge(context, self.op_kwargs, **{LEASE_KWARG: facts})
        kwargs = determine_kwargs(self.python_callable, self.op_args, context)
        return self.python_callable(*self.op_args, **kwargs)

    # -- execution -------------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        """Acquire the lock (or wait, skip, fail per ``on_contention``) and run the callable."""
        from airflow_provider_volcano._tokens import new_nonce

        if self.lock_group_task_id is not None:
            from airflow_provider_volcano.operators.group import run_in_group

            return run_in_group(self, context)
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
            handoff = _Handoff.from_event(event, self.handoff_ttl)
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
        self, context: Context, deadline: float | None, nonce: str, handoff: _Handoff | None = None
    ) -> Any:
        """Wait for, hold and run under the lock, for as long as the task's supervisor lives."""
        from airflow_provider_volcano._supervision import SupervisorGone

        try:
            with self._supervised(context):
                return self._hold_and_run(context, deadline, nonce, handoff)
        except SupervisorGone:
            raise VolcanoLockLost(
                f"The task's supervisor is gone: the task stopped its body and gave up lock "
                f"{self.lock_key!r} (see the line before)"
            ) from None

    def _supervised(self, context: Context) -> Any:
        """A :class:`~airflow_provider_volcano._supervision.SupervisorWatch` for this try."""
        from airflow_provider_volcano._supervision import SupervisorWatch, task_log_file

        def what() -> str:
            guard = self._active
            lease = getattr(guard, "lease", None)
            held = f" (fencing token {lease.fencing_token})" if lease is not None else ""
            return f"lock {self.lock_key!r}{held}"

        return SupervisorWatch(self.log, what, task_log_file(context["ti"]))

    def _hold_and_run(
        self, context: Context, deadline: float | None, nonce: str, handoff: _Handoff | None = None
    ) -> Any:
        from volcano_locks import ConflictError, InvalidRequest, OwnershipLost, WaitTimeout

        client = self.hook.get_client()
        entered = False
        guard: LockGuard | None = None
        self._waiter, self._reported_at = self._identity(context, nonce), 0.0
        self._ti = context["ti"]
        try:
            with contextlib.ExitStack() as stack:
                stack.callback(client.close)
                try:
                    guard = self._enter(stack, client, self._token(context, nonce), deadline)
                except WaitTimeout as exc:
                    raise VolcanoLockContended(
                        f"Timed out after {self.wait_timeout} s waiting for lock {self.lock_key!r}, "
                        f"{_holder_facts(exc.holder, self.lock_key)}"
                    ) from None
                except ConflictError as exc:  # either 409 on acquisition: contention
                    return self._contended(client, exc, context, deadline, nonce, handoff)
                except InvalidRequest as exc:
                    raise AirflowFailException(f"Invalid lock request for {self.lock_key!r}: {exc}") from None
                entered = True
                lease = guard.lease
                assert lease is not None  # with_lock raised instead of entering without a lease
                if handoff is not None:
                    self._handoff_done(lease)
                if handoff is not None and lease.fencing_token != handoff.fencing_token:
                    self.log.warning(
                        "The handoff of lock %r lapsed: this task resumed %s after its trigger acquired "
                        "the lock (fencing token %s), beyond handoff_ttl=%s s. The lock was still free, "
                        "so it was acquired anew (fencing token %s). Raise handoff_ttl above your "
                        "executor's resume delay (queueing, pod start, pool slots).",
                        self.lock_key,
                        handoff.describe_delay(),
                        handoff.fencing_token,
                        handoff.allowance,
                        lease.fencing_token,
                    )
                self.log.info(
                    "Holding lock %r (fencing token %s, ttl %s s, owner %s)",
                    self.lock_key,
                    lease.fencing_token,
                    self.ttl,
                    nonce,  # public: the token is derived from it and the service key
                )
                self._active, self._body_thread = guard, threading.get_ident()
                from airflow_provider_volcano._provenance import write_holder

                write_holder(context, self.lock_key, lease.fencing_token, self.ttl)
                result = self._call(context, lease)
            # Belt and braces: a loss the keeper noticed as the block ended still fails the task.
            if guard is not None and guard.lost:
                raise self._lost(guard.loss, lease)
            self.log.info("Released lock %r (fencing token %s)", self.lock_key, lease.fencing_token)
            return result
        except OwnershipLost as exc:
            if not entered:
                # Our own lease lapsed between the trigger's acquisition and this resume.
                return self._contended(None, exc, context, deadline, nonce, handoff)
            raise self._lost(exc, guard.lease if guard is not None else None) from None
        except BaseException:
            if (
                entered
                and guard is not None
                and guard.lease is not None
                and not guard.lost
                and not self._killed
            ):
                # with_lock released it on the way out (a failed release is logged by the core).
                self.log.info(
                    "Released lock %r (fencing token %s) after the callable failed",
                    self.lock_key,
                    guard.lease.fencing_token,
                )
            raise
        finally:
            self._active = self._body_thread = None
            self._close_look_client()

    def _enter(
        self, stack: contextlib.ExitStack, client: VolcanoLocks, token: str, deadline: float | None
    ) -> LockGuard:
        """Enter ``with_lock`` with this task's token (see :meth:`_acquire_with` for the waiting)."""

        def attempt(wait: bool, request_id: str, remaining: float | None) -> LockGuard:
            return stack.enter_context(
                client.with_lock(
                    self.lock_key,
                    self.ttl,
                    token=token,
                    request_id=request_id,
                    on_contention="wait" if wait else "raise",
                    wait_timeout=remaining,
                    interrupt=True,
                    on_waiting=self._still_waiting if wait else None,
                    wait_policy=wait_policy() if wait else None,
                )
            )

        return self._acquire_with(client, deadline, attempt)

    def _acquire_with(
        self,
        client: VolcanoLocks,
        deadline: float | None,
        attempt: Callable[[bool, str, float | None], _T],
        *,
        may_wait: bool = True,
    ) -> _T:
        """Run ``attempt(wait, request_id, remaining)``: wait out an unreachable API, and wait in the slot.

        The first try never waits, so ``skip``, ``fail`` and a deferral decide on an answer from the
        server. No response, 503 and 429 are not an answer: they are retried with the same ownership
        token and request id (the contract's recovery of an uncertain acquisition), backing off like
        the trigger, until ``wait_timeout``. Contention with ``on_contention="wait"`` and
        ``deferrable=False`` waits in this worker slot, and says so in the task log (unless
        ``may_wait`` is off: a group member never waits for its group's lease).
        """
        from volcano_locks import ConflictError, RateLimited, TransportError, Unavailable

        wait_in_slot = False
        request_id = str(uuid.uuid4())
        backoff = 0.0
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.time())
            try:
                return attempt(wait_in_slot, request_id, remaining)
            except (TransportError, Unavailable, RateLimited) as exc:
                if isinstance(exc, RateLimited):
                    request_id = str(uuid.uuid4())  # a definite answer: the next try is a new operation
                    delay = exc.retry_after if exc.retry_after is not None else self.poll_interval
                else:
                    backoff = min(_MAX_BACKOFF, max(self.poll_interval, backoff * 2))
                    delay = backoff
                if remaining is not None:
                    if remaining <= 0:
                        raise AirflowException(
                            f"The Volcano lock API did not answer for lock {self.lock_key!r} within "
                            f"wait_timeout={self.wait_timeout} s: {exc}"
                        ) from None
                    delay = min(delay, remaining)
                self.log.warning(
                    "Volcano lock API unavailable while acquiring lock %r (%s); trying again in "
                    "%.1f s as the same owner (bounded by wait_timeout=%s)",
                    self.lock_key,
                    exc,
                    delay,
                    self.wait_timeout,
                )
                time.sleep(delay)
            except ConflictError as exc:
                if wait_in_slot or not may_wait or self.on_contention != "wait" or self.deferrable:
                    raise
                holder = exc.holder if exc.holder is not None else self._holder(client)
                self.log.info(
                    "Lock %r is %s; waiting for it in this worker slot (deferrable=False; the default "
                    "follows [operators] default_deferrable, off unless set). To wait in the "
                    "triggerer without holding a slot, pass deferrable=True or set "
                    "[operators] default_deferrable = True.",
                    self.lock_key,
                    _holder_facts(holder, self.lock_key),
                )
                wait_in_slot = True
                request_id = str(uuid.uuid4())
                self._note_waiting()

    def _note_waiting(self) -> None:
        """Tell the lock board this try waits in its slot, and since when (best effort)."""
        from airflow_provider_volcano._provenance import WAITING_XCOM_KEY

        if self._ti is None:
            return
        try:
            self._ti.xcom_push(
                key=WAITING_XCOM_KEY,
                value={"lock_key": self.lock_key, "since": datetime.now(UTC).isoformat(timespec="seconds")},
            )
        except Exception as exc:
            self.log.warning(
                "Could not tell the lock board that this task waits for %r: %s", self.lock_key, exc
            )

    def _still_waiting(self, holder: LockState | None, waited: float) -> None:
        """Look for a stranded handoff every few seconds of a wait in the worker slot; log every minute.

        The line names the lock, the holder's fencing token, until when its lease runs and whether it
        is a handoff to a task that has not resumed yet.
        """
        if waited < 1.0:
            return  # the wait's start is announced by _acquire_with, with how to defer instead
        if self._look_client is None:
            self._look_client = self.hook.get_client()  # its own: the waiting client is mid-call
        client = self._look_client
        try:
            record, state = self._look_at_handoff(client)
        except Exception as exc:  # never let a look end the wait; say so and wait on
            self.log.warning("Looking at the handoff record of lock %r failed: %s", self.lock_key, exc)
            record, state = None, None
        if waited - self._reported_at < REPORT_EVERY:
            return
        self._reported_at = waited
        if holder is None or holder.fencing_token is None or holder.expires_at is None:
            holder = self._holder(client)  # a refused acquisition says neither who nor until when
        from airflow_provider_volcano._provenance import read_holder
        from airflow_provider_volcano.triggers.lock import waiting_facts

        self.log.info(
            "Still waiting for lock %r in this worker slot after %.0f s; it is %s",
            self.lock_key,
            waited,
            waiting_facts(holder, record, state, read_holder(self.lock_key)),
        )

    def _look_at_handoff(self, client: VolcanoLocks) -> tuple[HandoffRecord | None, object]:
        """Free the lock's handoff lease if the try it was acquired for can no longer use it.

        Returns the record still standing (or ``None``) and its owner's state, for the waiting lines.
        """
        from airflow_provider_volcano._handoff import (
            clear_record,
            lease_of,
            owner_state,
            read_record,
            released_line,
            unusable_because,
        )
        from airflow_provider_volcano._tokens import derive_token
        from volcano_locks import ConflictError, VolcanoError
        from volcano_locks.waiting import wake

        record = read_record(self.lock_key)
        if record is None or record.owner == self._waiter:
            return record, None
        state = owner_state(record.owner)
        reason = unusable_because(record, state, self._waiter)
        if reason is None:
            return record, state
        token = derive_token(self.hook.config.service_key, record.owner, self.lock_key)
        try:
            client.release(self.lock_key, lease_of(record, token))
            self.log.info("%s", released_line(record, reason))
        except ConflictError:
            pass  # that try's lease is gone already (lapsed or released)
        except VolcanoError as exc:
            self.log.warning("Could not release the stranded handoff of lock %r: %s", self.lock_key, exc)
            return record, state
        clear_record(self.lock_key, record.fencing_token, self.log)
        wake(self.lock_key)
        return None, state

    def _close_look_client(self) -> None:
        client, self._look_client = self._look_client, None
        if client is not None:
            client.close()

    def _handoff_done(self, lease: LockLease) -> None:
        """The resumed task holds the trigger's lease: it is no longer a handoff (delete the record)."""
        from airflow_provider_volcano._handoff import clear_record

        clear_record(self.lock_key, lease.fencing_token, self.log, owner=self._waiter)

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
        client: VolcanoLocks | None,
        exc: ConflictError,
        context: Context,
        deadline: float | None,
        nonce: str,
        handoff: _Handoff | None = None,
    ) -> Any:
        holder = self._holder(client) if client is not None else None
        facts = _holder_facts(holder, self.lock_key)
        allowance = self.handoff_ttl
        if handoff is not None:
            delay = handoff.delay()
            # Resume delays recur: the next handoff allows twice the one measured, within a bound.
            if delay is not None:
                allowance = min(
                    MAX_TTL,
                    HANDOFF_GROWTH_CAP * self.handoff_ttl,
                    max(handoff.allowance, math.ceil(2 * delay)),
                )
            self.log.warning(
                "The handoff of lock %r lapsed: this task resumed %s after its trigger acquired the "
                "lock (fencing token %s), beyond handoff_ttl=%s s, and the lease is gone (the lock "
                "is now %s). Raise handoff_ttl above your executor's resume delay (queueing, pod "
                "start, pool slots); waiting again with a handoff allowance of %s s.",
                self.lock_key,
                handoff.describe_delay(),
                handoff.fencing_token,
                handoff.allowance,
                facts,
                allowance,
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
    ) -> None:
        from airflow_provider_volcano.triggers.lock import VolcanoLockTrigger

        self.log.info("Lock %r is %s; deferring until it is free (owner %s)", self.lock_key, facts, nonce)
        self.defer(
            trigger=VolcanoLockTrigger(
                volcano_conn_id=self.volcano_conn_id,
                lock_key=self.lock_key,
                ttl=self.ttl,
                identity=self._identity(context, nonce).as_dict(),
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
        from volcano_locks import VolcanoError

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


def wait_policy() -> WaitPolicy:
    """The core's default wait policy, reporting (and so looking for a stranded handoff) every 5 s."""
    from airflow_provider_volcano._handoff import LOOK_EVERY
    from volcano_locks.waiting import WaitPolicy

    return WaitPolicy(report_every=LOOK_EVERY)


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
