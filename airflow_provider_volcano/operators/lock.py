"""VolcanoLockOperator: runs a callable while holding a Volcano project lock.

The operator is a face: it checks its arguments where they are written, and every decision of a
locked task's life (the first answer, a wait in the worker slot or a deferral to
:class:`~airflow_provider_volcano.triggers.lock.VolcanoLockTrigger`, keeping the lease with interrupt,
the body, the release, a loss) is its :class:`~airflow_provider_volcano.runtime.hold.TaskHold`'s; a group
member holds its group's lease through one too (:mod:`airflow_provider_volcano.runtime.member`). The
run-time modules are imported when a task runs (two imports below), never when a DAG is parsed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator

from airflow_provider_volcano._compat import conf
from airflow_provider_volcano._once import check_once
from airflow_provider_volcano.exceptions import VolcanoLockContended, VolcanoLockLost
from airflow_provider_volcano.runtime.body import LEASE_KWARG, LEASE_XCOM_KEY
from volcano_locks import validate_key, validate_ttl, validate_wait_timeout
from volcano_locks.integration import validate_poll

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_volcano.hooks.volcano import VolcanoHook
    from airflow_provider_volcano.runtime.hold import TaskHold

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
    :param once_key: run once per business key (templated, e.g. ``"rollup:{{ ds }}"``), recorded in
        ``ledger``: once the lock is held the key is looked up; a key already done (by any run, DAG or
        Prefect flow using the same ledger) skips the task (AirflowSkipException naming the first run)
        and pushes the first run's recorded result as its ``return_value`` XCom. Otherwise the callable
        does its effect through its ``volcano_once`` parameter (``with volcano_once.begin() as effect``).
    :param ledger: the run-once ledger of ``once_key`` (``volcano_locks.once.SQLLedger`` or
        ``S3Ledger``), or a callable that builds it on the worker.
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

    template_fields: Sequence[str] = ("lock_key", "once_key", "op_args", "op_kwargs")
    template_fields_renderers: ClassVar[dict[str, str]] = {"op_args": "py", "op_kwargs": "py"}
    shallow_copy_attrs: Sequence[str] = ("python_callable", "ledger")
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
        once_key: str | None = None,
        ledger: Any = None,
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
            lock_key = ""  # a member holds no lock of its own: the key is its group's
        elif not isinstance(lock_key, str) or not lock_key:
            raise ValueError(f"lock_key must be a non-empty string, got {lock_key!r}")
        elif "{{" not in lock_key and "{%" not in lock_key:
            validate_key(lock_key)  # a literal key is checked at parse time; a template when rendered
        if on_contention not in ON_CONTENTION:
            raise ValueError(f"on_contention must be one of {ON_CONTENTION}, got {on_contention!r}")
        validate_poll(poll_interval, name="poll_interval")
        check_once(once_key, ledger)
        self.once_key = once_key
        self.ledger = ledger
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
        self._task_hold: TaskHold | None = None  # the running try's hold, for on_kill

    @cached_property
    def hook(self) -> VolcanoHook:
        """The hook for ``volcano_conn_id`` (built on first use): the one path to a client."""
        from airflow_provider_volcano.hooks.volcano import VolcanoHook

        return VolcanoHook(self.volcano_conn_id)

    # -- execution: a face over the task's hold ---------------------------------------------------

    def execute(self, context: Context) -> Any:
        """Acquire the lock (or wait, skip, fail per ``on_contention``) and run the callable."""
        hold = self._task_hold = self._hold_for(context)
        if self.lock_group_task_id is not None:
            return hold.run_member(self.lock_group_task_id, self.poll_interval)
        return hold.acquire_and_run(None if self.wait_timeout is None else time.time() + self.wait_timeout)

    def execute_complete(
        self,
        context: Context,
        event: dict[str, Any],
        deadline: float | None = None,
        nonce: str | None = None,
    ) -> Any:
        """Resume after :class:`VolcanoLockTrigger` fired: run if acquired, else fail with its reason."""
        self._task_hold = self._hold_for(context)
        return self._task_hold.resume(event, deadline, nonce)

    def _hold_for(self, context: Context) -> TaskHold:
        """This task's hold: a member's leaves its group's lease held (and a group's acquire task's, see
        ``operators.group``)."""
        from airflow_provider_volcano.runtime import hold as run_time

        if self.lock_group_task_id is not None:
            return run_time.TaskHold(self, context, leaves_held=True, what="the group's lock")
        return run_time.TaskHold(self, context)

    def _lease_kind(self) -> tuple[str, str | None]:
        """What this task's lease is held for: ``("task", None)`` (a group's acquire task: the group)."""
        return "task", None

    def on_kill(self) -> None:
        """Release the lock when the task is killed, and stop the callable if it runs in this thread."""
        if self._task_hold is not None:
            self._task_hold.kill()


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
