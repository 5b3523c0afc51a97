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

from collections.abc import Sequence
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_provider_volcano._compat import conf
from airflow_provider_volcano.exceptions import VolcanoLockLost
from airflow_provider_volcano.operators.lock import DEFAULT_HANDOFF_TTL, VolcanoLockOperator
from airflow_provider_volcano.records.group import (
    GROUP_XCOM_KEY,
    GroupLease,
    group_token,
    pull_group,
    seal_group,
)
from volcano_locks import ConflictError, LeaseRef, VolcanoError

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.sdk.definitions.xcom_arg import XComArg

    from airflow_provider_volcano.runtime.hold import TaskHold
    from volcano_locks import LockLease

__all__ = [
    "GROUP_XCOM_KEY",
    "VolcanoLockGroup",
    "VolcanoLockGroupAcquireOperator",
    "VolcanoLockGroupReleaseOperator",
]


def _nothing() -> None:
    """The acquire task runs no callable of its own: the group's tasks are the work."""


class VolcanoLockGroupAcquireOperator(VolcanoLockOperator):
    """Setup task of a :class:`VolcanoLockGroup`: acquires the lock and keeps it for the group.

    Waits, skips or fails on contention exactly as :class:`VolcanoLockOperator` (same arguments,
    deferrable, with the same handoff allowance); it does not release the lease. Its return value
    (XCom ``return_value``) is the lease's public facts, so every task can read the fencing token.

    :param lock_key: the lock to hold across the group (templated).
    :param ttl: the group's lease TTL in seconds: it must cover the longest gap between two tasks
        of the group, and every task of the group that is not a member (default 300).
    :param release_task_id: the group's release task (set by :class:`VolcanoLockGroup`): a waiter that
        finds this task's handoff record frees the group's lease only once that task has ended or the
        group's DAG run is over, never because this task ended.
    """

    def __init__(
        self, *, lock_key: str, ttl: int = 300, release_task_id: str | None = None, **kwargs: Any
    ) -> None:
        kwargs.setdefault("python_callable", _nothing)
        super().__init__(lock_key=lock_key, ttl=ttl, **kwargs)
        self.release_task_id = release_task_id

    def _lease_kind(self) -> tuple[str, str | None]:
        """The lease is the group's: a waiter decides on its run and release task, never on this task."""
        return "group", self.release_task_id

    def _hold_for(self, context: Context) -> TaskHold:
        """A hold that leaves the lease held for the group, its body pushing the group's sealed facts."""
        from airflow_provider_volcano.runtime import hold as run_time

        hold = run_time.TaskHold(
            self, context, leaves_held=True, body=lambda facts: self._leave_held(hold, facts)
        )
        return hold

    def _leave_held(self, hold: TaskHold, lease: LockLease) -> dict[str, str | int]:
        """Push the lease's sealed facts and owner to XCom for the group's tasks; release nothing."""
        assert hold.owner is not None
        facts = lease.public_dict()
        group = GroupLease(lease.facts(), hold.owner)  # public without the key
        hold.context["ti"].xcom_push(key=GROUP_XCOM_KEY, value=seal_group(self.hook.keyring, group))
        self.log.info(
            "Holding lock %r for the group (fencing token %s, ttl %s s, owner %s); its member tasks "
            "renew it while they run and the group's release task releases it",
            self.lock_key,
            lease.fencing_token,
            self.ttl,
            hold.owner.nonce,
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
        from airflow_provider_volcano.hooks.volcano import VolcanoHook  # the client's modules: at run time

        value = pull_group(context, self.acquire_task_id)
        if value is None:
            self.log.info(
                "The group's acquire task %r holds no lease; nothing to release", self.acquire_task_id
            )
            return
        hook = VolcanoHook(self.volcano_conn_id)
        group, token = group_token(hook, value, context, self.acquire_task_id, self.log)
        key, ttl = group.lock_key, group.lease.ttl
        lease = LeaseRef(key, token, group.lease.fencing_token)
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
                    f"{exc}; it lapses at its TTL ({ttl} s after the last renewal)"
                ) from None
        self.log.info("Released lock %r (fencing token %s) for the group", key, lease.fencing_token)


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
            release_task_id=f"{task_id}_release",
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
