"""One Volcano lock across several tasks: :class:`VolcanoLockGroup`, a setup/teardown pair.

The setup task (:class:`VolcanoLockGroupAcquireOperator`) acquires the lock, waiting for it as
:class:`~airflow_provider_volcano.operators.lock.VolcanoLockOperator` does (deferred in the triggerer
when ``deferrable``), and leaves the lease held for the group: its public facts and the setup try's
owner identity (dag, task, run, map index, try and the random nonce; nothing secret) go to XCom,
sealed with a MAC keyed by the service key. Every member task (``VolcanoLockOperator(lock_group=...)``
or ``@task.volcano_lock(lock_group=...)``) verifies the seal and that the owner is its own run's
acquire task (XCom is writable through the REST API: an entry a user wrote is refused), derives the
same ownership token from that identity and the connection's service key, checks the
lease when it starts (an idempotent re-acquire, which must keep the group's fencing token) and renews
it while it runs. The teardown task (:class:`VolcanoLockGroupReleaseOperator`) releases it after the
last task, also when a task failed (Airflow's teardown semantics). Between tasks nobody renews, so
the group's ``ttl`` must cover the longest gap between its tasks, and any task of the group that is
not a member (it cannot renew).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_provider_volcano._compat import AirflowFailException, conf
from airflow_provider_volcano.operators.lock import (
    DEFAULT_HANDOFF_TTL,
    VolcanoLockContended,
    VolcanoLockLost,
    VolcanoLockOperator,
    _Handoff,
    _holder_facts,
    wait_policy,
)

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.sdk.definitions.xcom_arg import XComArg

    from airflow_provider_volcano.hooks.volcano import VolcanoHook
    from volcano_locks import LockLease

__all__ = [
    "GROUP_XCOM_KEY",
    "VolcanoLockGroup",
    "VolcanoLockGroupAcquireOperator",
    "VolcanoLockGroupReleaseOperator",
    "run_in_group",
]

GROUP_XCOM_KEY = "volcano_lock_group"
"""XCom key of the group's lease: its public facts, ``ttl`` and the setup try's ``owner`` identity."""


def _nothing() -> None:
    """The acquire task runs no callable of its own: the group's tasks are the work."""


def _group_token(hook: VolcanoHook, group: Mapping[str, Any], context: Context, acquire_task_id: str) -> str:
    """The group's ownership token, derived only from an XCom its acquire task sealed for this run.

    :raises AirflowFailException: the XCom is forged or copied from another run (names what differs).
    """
    from airflow_provider_volcano._tokens import ForgedGroup, derive_token, verify_group

    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    try:
        owner = verify_group(
            hook.config.service_key,
            group,
            dag_id=str(ti.dag_id),
            run_id=str(ti.run_id),
            acquire_task_id=acquire_task_id,
            map_index=-1 if map_index is None else int(map_index),
        )
    except ForgedGroup as exc:
        raise AirflowFailException(
            f"Refusing the lock group's XCom {GROUP_XCOM_KEY!r} of task {acquire_task_id!r} for lock "
            f"{group.get('lock_key')!r}: {exc}. Only the group's acquire task writes it; an entry "
            "created or patched through the REST API never yields the group's lease."
        ) from None
    return derive_token(hook.config.service_key, owner, str(group["lock_key"]))


def _pull_group(context: Context, acquire_task_id: str) -> dict[str, Any] | None:
    value = context["ti"].xcom_pull(task_ids=acquire_task_id, key=GROUP_XCOM_KEY)
    return dict(value) if isinstance(value, Mapping) else None


class VolcanoLockGroupAcquireOperator(VolcanoLockOperator):
    """Setup task of a :class:`VolcanoLockGroup`: acquires the lock and keeps it for the group.

    Waits, skips or fails on contention exactly as :class:`VolcanoLockOperator` (same arguments,
    deferrable, with the same handoff allowance); it does not release the lease. Its return value
    (XCom ``return_value``) is the lease's public facts, so every task can read the fencing token.

    :param lock_key: the lock to hold across the group (templated).
    :param ttl: the group's lease TTL in seconds: it must cover the longest gap between two tasks
        of the group, and every task of the group that is not a member (default 300).
    """

    def __init__(self, *, lock_key: str, ttl: int = 300, **kwargs: Any) -> None:
        kwargs.setdefault("python_callable", _nothing)
        super().__init__(lock_key=lock_key, ttl=ttl, **kwargs)

    def _run_locked(
        self, context: Context, deadline: float | None, nonce: str, handoff: _Handoff | None = None
    ) -> Any:
        from volcano_locks import ConflictError, InvalidRequest, WaitTimeout

        client = self.hook.get_client()
        token = self._token(context, nonce)
        self._waiter, self._reported_at = self._identity(context, nonce), 0.0

        def attempt(wait: bool, request_id: str, remaining: float | None) -> LockLease:
            if wait:
                return client.wait_acquire(
                    self.lock_key,
                    self.ttl,
                    timeout=remaining,
                    token=token,
                    poll=self.poll_interval,
                    on_waiting=self._still_waiting,
                    policy=wait_policy(),
                )
            return client.acquire(self.lock_key, self.ttl, token=token, request_id=request_id)

        with contextlib.closing(client), contextlib.ExitStack() as looks:
            looks.callback(self._close_look_client)
            try:
                lease = self._acquire_with(client, deadline, attempt)
            except WaitTimeout as exc:
                raise VolcanoLockContended(
                    f"Timed out after {self.wait_timeout} s waiting for lock {self.lock_key!r}, "
                    f"{_holder_facts(exc.holder)}"
                ) from None
            except ConflictError as exc:
                return self._contended(client, exc, context, deadline, nonce, handoff)
            except InvalidRequest as exc:
                raise AirflowFailException(f"Invalid lock request for {self.lock_key!r}: {exc}") from None
        if handoff is not None:
            self._handoff_done(lease)
        if handoff is not None and lease.fencing_token != handoff.fencing_token:
            self.log.warning(
                "The handoff of lock %r lapsed: this task resumed %s after its trigger acquired the "
                "lock (fencing token %s), beyond handoff_ttl=%s s. The lock was still free, so it was "
                "acquired anew (fencing token %s). Raise handoff_ttl above your executor's resume delay.",
                self.lock_key,
                handoff.describe_delay(),
                handoff.fencing_token,
                handoff.allowance,
                lease.fencing_token,
            )
        facts = lease.public_dict()
        owner = self._identity(context, nonce).as_dict()  # public: useless without the service key
        from airflow_provider_volcano._tokens import seal_group

        group = {**facts, "ttl": self.ttl, "owner": owner}
        group["seal"] = seal_group(self.hook.config.service_key, group)  # a MAC, not a secret
        context["ti"].xcom_push(key=GROUP_XCOM_KEY, value=group)
        from airflow_provider_volcano._provenance import write_holder

        write_holder(context, self.lock_key, lease.fencing_token, self.ttl)  # the board's holder
        self.log.info(
            "Holding lock %r for the group (fencing token %s, ttl %s s, owner %s); its member tasks "
            "renew it while they run and the group's release task releases it",
            self.lock_key,
            lease.fencing_token,
            self.ttl,
            nonce,
        )
        return facts


class VolcanoLockGroupReleaseOperator(BaseOperator):
    """Teardown task of a :class:`VolcanoLockGroup`: releases the group's lease after its last task.

    Runs also when a task of the group failed (it is a teardown). A lease that is already gone is
    not an error here: the tasks that needed it have failed on the loss.

    :param acquire_task_id: the task id of the group's acquire task.
    :param volcano_conn_id: the Volcano connection id.
    """

    ui_color = "#f2c6b4"

    def __init__(
        self, *, acquire_task_id: str, volcano_conn_id: str = "volcano_default", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(acquire_task_id, str) or not acquire_task_id:
            raise ValueError(f"acquire_task_id must be a non-empty task id, got {acquire_task_id!r}")
        self.acquire_task_id = acquire_task_id
        self.volcano_conn_id = volcano_conn_id

    def execute(self, context: Context) -> None:
        """Release the group's lease (nothing to do if the group never acquired it)."""
        from airflow_provider_volcano.hooks.volcano import VolcanoHook
        from volcano_locks import ConflictError, LockLease, VolcanoError

        group = _pull_group(context, self.acquire_task_id)
        if group is None:
            self.log.info(
                "The group's acquire task %r holds no lease; nothing to release", self.acquire_task_id
            )
            return
        hook = VolcanoHook(self.volcano_conn_id)
        key = str(group["lock_key"])
        # Release sends only the ownership token; the other fields describe the lease as acquired.
        lease = LockLease(
            key=key,
            token=_group_token(hook, group, context, self.acquire_task_id),
            expires_at=datetime.fromisoformat(group["expires_at"]),
            fencing_token=int(group["fencing_token"]),
            ttl=int(group["ttl"]),
            acquired_at=datetime.fromisoformat(group["acquired_at"]),
            local_deadline=0.0,
            absolute_deadline=0.0,
        )
        with hook.get_client() as client:
            try:
                client.release(key, lease)
            except ConflictError as exc:
                self.log.warning(
                    "The group's lease of lock %r (fencing token %s) was already lost (%s); "
                    "nothing to release",
                    key,
                    lease.fencing_token,
                    exc,
                )
                return
            except VolcanoError as exc:
                raise VolcanoLockLost(
                    f"Could not release the group's lock {key!r} (fencing token {lease.fencing_token}): "
                    f"{exc}; it lapses at its TTL ({lease.ttl} s after the last renewal)"
                ) from None
        self.log.info("Released lock %r (fencing token %s) for the group", key, lease.fencing_token)


def run_in_group(op: VolcanoLockOperator, context: Context) -> Any:
    """Run a member task's callable under its group's lease: check it, renew it, never release it.

    :param op: the member operator (``lock_group`` set).
    :param context: the task's context.
    """
    from volcano_locks import ConflictError, OwnershipLost, VolcanoError
    from volcano_locks.renewal import KeeperTiming, LeaseKeeper, renewal_timeout

    acquire_task_id = op.lock_group_task_id
    assert acquire_task_id is not None
    group = _pull_group(context, acquire_task_id)
    if group is None:
        raise AirflowFailException(
            f"Task {op.task_id!r} runs under the lock group of {acquire_task_id!r}, which holds no lease "
            "(is it upstream of this task, and did it succeed?)"
        )
    key, fencing, ttl = str(group["lock_key"]), int(group["fencing_token"]), int(group["ttl"])
    op.lock_key = key
    client = op.hook.get_client()
    token = _group_token(op.hook, group, context, acquire_task_id)

    def attempt(wait: bool, request_id: str, remaining: float | None) -> LockLease:
        # An idempotent re-acquire: extends the group's lease to ttl from now if it is still ours.
        return client.acquire(key, ttl, token=token, request_id=request_id)

    with contextlib.closing(client):
        try:
            # An unreachable API is waited out no longer than the group's lease could last.
            lease = op._acquire_with(client, time.time() + ttl, attempt, may_wait=False)
        except ConflictError as exc:
            holder = op._holder(client)
            raise VolcanoLockLost(
                f"The group's lock {key!r} (fencing token {fencing}) was lost before task "
                f"{op.task_id!r} ran (the lock is now {_holder_facts(holder)}; {exc}); raise the "
                "group's ttl above the longest gap between its tasks"
            ) from None
        if lease.fencing_token != fencing:
            # The group's lease lapsed and the lock was free: this acquire made a new lease. Undo it.
            with contextlib.suppress(VolcanoError):
                client.release(key, lease)
            raise VolcanoLockLost(
                f"The group's lock {key!r} (fencing token {fencing}) lapsed before task {op.task_id!r} "
                f"ran; raise the group's ttl ({ttl} s) above the longest gap between its tasks"
            )
        op.log.info(
            "Running under the group's lock %r (fencing token %s, renewed at ttl %s s)", key, fencing, ttl
        )
        from airflow_provider_volcano._provenance import write_holder

        write_holder(context, key, fencing, ttl)  # the member running now is the one the board names
        keeper = LeaseKeeper(
            lease,
            lambda current, _timeout: client.renew(current.key, current),
            timing=KeeperTiming(request_timeout=renewal_timeout(client.timeout, ttl)),
        )
        keeper.start()
        from airflow_provider_volcano._supervision import SupervisorGone

        try:
            with op._supervised(context):
                result = op._call(context, lease)
        except SupervisorGone:
            raise VolcanoLockLost(
                f"The task's supervisor is gone: task {op.task_id!r} stopped its body and stopped "
                f"renewing the group's lock {key!r} (fencing token {fencing}); the group's release task "
                "or its ttl ends the lease"
            ) from None
        finally:
            keeper.stop()
        loss: OwnershipLost | None = keeper.loss
        if loss is not None:
            raise VolcanoLockLost(
                f"Lost the group's lock {key!r} (fencing token {fencing}) while task {op.task_id!r} ran "
                f"({loss}); the task is failed because its work is no longer protected by the lock"
            )
    op.log.info("Kept the group's lock %r (fencing token %s) for the group's next task", key, fencing)
    return result


class VolcanoLockGroup:
    """One Volcano lock held across several tasks: an acquire (setup) and a release (teardown) task.

    Tasks created inside ``with group:`` run after the acquire task and before the release task
    (Airflow's setup/teardown context). Members (``@task.volcano_lock(lock_group=group)`` or
    ``VolcanoLockOperator(lock_group=group)``) check the group's lease when they start, renew it
    while they run, get its public facts as ``volcano_lease`` and fail on its loss; the release task
    runs after the last task, also when one failed. Every task can read the fencing token from
    ``group.lease`` (the acquire task's XCom).

    Example::

        with TaskGroup("swap"):
            with VolcanoLockGroup(lock_key="warehouse-swap", ttl=120, deferrable=True) as lock:
                staged = load(extract())  # load is @task.volcano_lock(lock_group=lock)

    :param lock_key: the lock (templated).
    :param ttl: the group's lease TTL: it must cover the longest gap between two tasks, and every
        task of the group that is not a member (default 300).
    :param task_id: prefix of the two tasks' ids (``<task_id>_acquire``, ``<task_id>_release``).
    :param on_contention: ``wait`` (default), ``skip`` or ``fail``, as for :class:`VolcanoLockOperator`.
    :param wait_timeout: give up waiting after this many seconds (or timedelta).
    :param deferrable: wait in the triggerer (default: ``[operators] default_deferrable``).
    :param poll_interval: seconds between reads of a held lock while waiting.
    :param handoff_ttl: how long the lease the trigger acquired waits for the acquire task to resume.
    :param volcano_conn_id: the Volcano connection id.
    """

    def __init__(
        self,
        *,
        lock_key: str,
        ttl: int = 300,
        task_id: str = "volcano_lock",
        on_contention: str = "wait",
        wait_timeout: float | timedelta | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 2.0,
        handoff_ttl: int = DEFAULT_HANDOFF_TTL,
        volcano_conn_id: str = "volcano_default",
    ) -> None:
        self.acquire = VolcanoLockGroupAcquireOperator(
            task_id=f"{task_id}_acquire",
            lock_key=lock_key,
            ttl=ttl,
            on_contention=on_contention,
            wait_timeout=wait_timeout,
            deferrable=deferrable,
            poll_interval=poll_interval,
            handoff_ttl=handoff_ttl,
            volcano_conn_id=volcano_conn_id,
        )
        self.release = VolcanoLockGroupReleaseOperator(
            task_id=f"{task_id}_release",
            acquire_task_id=self.acquire.task_id,
            volcano_conn_id=volcano_conn_id,
        )
        self.release.as_teardown(setups=self.acquire)

    @property
    def lease(self) -> XComArg:
        """The group lease's public facts (``lock_key``, ``fencing_token``, ...), as an XComArg."""
        return self.acquire.output

    @property
    def tasks(self) -> Sequence[BaseOperator]:
        """The acquire and release tasks."""
        return (self.acquire, self.release)

    def __enter__(self) -> VolcanoLockGroup:
        self.release.__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release.__exit__(exc_type, exc, tb)  # type: ignore[no-untyped-call]

    def __repr__(self) -> str:
        return f"VolcanoLockGroup(acquire={self.acquire.task_id!r}, release={self.release.task_id!r})"
