"""VolcanoLockOperator: runs a callable while holding a Volcano project lock."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator
from airflow.sdk.configuration import conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_volcano._tokens import TaskIdentity
    from airflow_provider_volcano.hooks.volcano import VolcanoHook
    from volcano_locks import LockContention, LockLease, LockState, VolcanoLocks

__all__ = ["VolcanoLockContended", "VolcanoLockLost", "VolcanoLockOperator"]

ON_CONTENTION = ("wait", "skip", "fail")
MIN_TTL, MAX_TTL = 5, 7_776_000
LEASE_XCOM_KEY = "volcano_lease"
LEASE_KWARG = "volcano_lease"


class VolcanoLockLost(AirflowException):
    """The task lost ownership of its Volcano lock while the callable ran."""


class VolcanoLockContended(AirflowException):
    """The lock was held by another owner (``on_contention="fail"``, or the wait timed out)."""


def _validate_ttl(ttl: Any) -> int:
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not MIN_TTL <= ttl <= MAX_TTL:
        raise ValueError(f"ttl must be an integer number of seconds from {MIN_TTL} to {MAX_TTL}, got {ttl!r}")
    return ttl


def _validate_wait_timeout(wait_timeout: Any) -> float | None:
    if wait_timeout is None:
        return None
    if isinstance(wait_timeout, timedelta):
        wait_timeout = wait_timeout.total_seconds()
    if isinstance(wait_timeout, bool) or not isinstance(wait_timeout, int | float):
        raise ValueError(f"wait_timeout must be seconds or a timedelta, got {wait_timeout!r}")
    if not math.isfinite(wait_timeout) or wait_timeout < 0:
        raise ValueError(f"wait_timeout must be a non-negative number of seconds, got {wait_timeout!r}")
    return float(wait_timeout)


def _holder_facts(state: LockState | None) -> str:
    if state is None or not state.held:
        return "held by another owner"
    expires = state.expires_at.isoformat() if state.expires_at is not None else "unknown"
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
    :param on_contention: ``wait`` (default; deferrable), ``skip`` (AirflowSkipException naming
        the holder's fencing token) or ``fail``.
    :param wait_timeout: give up waiting after this many seconds (or timedelta); ``None`` waits
        without bound.
    :param deferrable: wait in the triggerer instead of a worker slot (default: the
        ``[operators] default_deferrable`` option).
    :param poll_interval: seconds between reads of a held lock while waiting.
    :param volcano_conn_id: the Volcano connection id.
    """

    template_fields: Sequence[str] = ("lock_key", "op_args", "op_kwargs")
    template_fields_renderers: ClassVar[dict[str, str]] = {"op_args": "py", "op_kwargs": "py"}
    shallow_copy_attrs: Sequence[str] = ("python_callable",)
    ui_color = "#f2c6b4"

    def __init__(
        self,
        *,
        lock_key: str,
        python_callable: Callable[..., Any],
        op_args: Collection[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        ttl: int = 30,
        on_contention: str = "wait",
        wait_timeout: float | timedelta | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 2.0,
        volcano_conn_id: str = "volcano_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not callable(python_callable):
            raise TypeError(f"python_callable must be callable, got {python_callable!r}")
        if not isinstance(lock_key, str) or not lock_key:
            raise ValueError(f"lock_key must be a non-empty string, got {lock_key!r}")
        if on_contention not in ON_CONTENTION:
            raise ValueError(f"on_contention must be one of {ON_CONTENTION}, got {on_contention!r}")
        if (
            isinstance(poll_interval, bool)
            or not isinstance(poll_interval, int | float)
            or poll_interval <= 0
        ):
            raise ValueError(f"poll_interval must be a positive number of seconds, got {poll_interval!r}")
        self.lock_key = lock_key
        self.python_callable = python_callable
        self.op_args: Collection[Any] = list(op_args or [])
        self.op_kwargs: Mapping[str, Any] = dict(op_kwargs or {})
        self.ttl = _validate_ttl(ttl)
        self.on_contention = on_contention
        self.wait_timeout = _validate_wait_timeout(wait_timeout)
        self.deferrable = bool(deferrable)
        self.poll_interval = float(poll_interval)
        self.volcano_conn_id = volcano_conn_id
        self._active: Any = None  # the guard of the running block, for on_kill
        self._body_thread: int | None = None
        self._killed = False

    # -- helpers ---------------------------------------------------------------------------------

    @property
    def hook(self) -> VolcanoHook:
        """The hook for ``volcano_conn_id`` (built on first use)."""
        hook = self.__dict__.get("_hook")
        if hook is None:
            from airflow_provider_volcano.hooks.volcano import VolcanoHook

            hook = self.__dict__["_hook"] = VolcanoHook(self.volcano_conn_id)
        return hook

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
        from airflow.sdk.bases.decorator import determine_kwargs
        from airflow.sdk.definitions.context import context_merge

        facts = lease.public_dict()
        context["ti"].xcom_push(key=LEASE_XCOM_KEY, value=facts)
        context_merge(context, self.op_kwargs, **{LEASE_KWARG: facts})
        kwargs = determine_kwargs(self.python_callable, self.op_args, context)
        return self.python_callable(*self.op_args, **kwargs)

    # -- execution -------------------------------------------------------------------------------

    def execute(self, context: Context) -> Any:
        """Acquire the lock (or wait, skip, fail per ``on_contention``) and run the callable."""
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
            self.log.info(
                "Trigger acquired lock %r (fencing token %s); resuming",
                self.lock_key,
                event.get("fencing_token"),
            )
            if not isinstance(nonce, str):
                raise AirflowException(
                    f"Resumed for lock {self.lock_key!r} without this try's owner nonce; cannot "
                    "prove ownership of the lease the trigger acquired"
                )
            return self._run_locked(context, deadline, nonce)
        if status == "timeout":
            raise VolcanoLockContended(
                f"Timed out waiting for lock {self.lock_key!r} "
                f"(held with fencing token {event.get('fencing_token')}): {message}"
            )
        raise AirflowException(
            f"Waiting for lock {self.lock_key!r} failed: {message or 'the trigger gave no reason'}"
        )

    def _run_locked(self, context: Context, deadline: float | None, nonce: str) -> Any:
        from volcano_locks import InvalidRequest, LockContention, OwnershipLost, WaitTimeout

        wait_in_place = self.on_contention == "wait" and not self.deferrable
        client = self.hook.get_client()
        entered = False
        guard: Any = None
        try:
            with contextlib.ExitStack() as stack:
                stack.callback(client.close)
                try:
                    guard = stack.enter_context(
                        client.with_lock(
                            self.lock_key,
                            self.ttl,
                            token=self._token(context, nonce),
                            on_contention="wait" if wait_in_place else "raise",
                            wait_timeout=None if deadline is None else max(0.0, deadline - time.time()),
                            interrupt=True,
                        )
                    )
                except WaitTimeout as exc:
                    raise VolcanoLockContended(
                        f"Timed out after {self.wait_timeout} s waiting for lock {self.lock_key!r}, "
                        f"{_holder_facts(exc.holder)}"
                    ) from None
                except LockContention as exc:
                    return self._contended(client, exc, context, deadline, nonce)
                except InvalidRequest as exc:
                    raise AirflowFailException(f"Invalid lock request for {self.lock_key!r}: {exc}") from None
                entered = True
                lease = guard.lease
                self.log.info(
                    "Holding lock %r (fencing token %s, ttl %s s, owner %s)",
                    self.lock_key,
                    lease.fencing_token,
                    self.ttl,
                    nonce,  # public: the token is derived from it and the service key
                )
                self._active, self._body_thread = guard, threading.get_ident()
                result = self._call(context, lease)
            # Belt and braces: a loss the keeper noticed as the block ended still fails the task.
            if guard is not None and guard.lost:
                raise self._lost(guard.loss)
            return result
        except OwnershipLost as exc:
            if not entered:
                # Our own lease lapsed between the trigger's acquisition and this resume.
                return self._contended(None, exc, context, deadline, nonce)
            raise self._lost(exc) from None
        finally:
            self._active = self._body_thread = None

    def _lost(self, exc: BaseException | None) -> VolcanoLockLost:
        why = "the task was killed and released it" if self._killed else str(exc)
        return VolcanoLockLost(
            f"Lost ownership of lock {self.lock_key!r} while the task ran ({why}); "
            "the task is failed because its work is no longer protected by the lock"
        )

    def _contended(
        self,
        client: VolcanoLocks | None,
        exc: LockContention,
        context: Context,
        deadline: float | None,
        nonce: str,
    ) -> Any:
        holder = self._holder(client) if client is not None else None
        facts = _holder_facts(holder)
        if self.on_contention == "skip":
            raise AirflowSkipException(f"Lock {self.lock_key!r} is {facts}; skipping (on_contention='skip')")
        if self.on_contention == "fail":
            raise VolcanoLockContended(f"Lock {self.lock_key!r} is {facts} (on_contention='fail')")
        if deadline is not None and time.time() >= deadline:
            raise VolcanoLockContended(
                f"Timed out after {self.wait_timeout} s waiting for lock {self.lock_key!r}, {facts}"
            )
        self._defer(context, deadline, facts, nonce)

    def _defer(self, context: Context, deadline: float | None, facts: str, nonce: str) -> None:
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
