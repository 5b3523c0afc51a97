"""A lock group's member task: its group's lease, checked when it starts (then held by its ``TaskHold``)."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from airflow_provider_volcano._compat import AirflowFailException
from airflow_provider_volcano.exceptions import VolcanoLockLost
from airflow_provider_volcano.records.group import group_token, pull_group
from airflow_provider_volcano.runtime.acquiring import acquire_answered, holder_facts, read_state
from volcano_locks import ConflictError, VolcanoError

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_volcano.hooks.volcano import VolcanoHook
    from volcano_locks import LockLease, VolcanoLocks

__all__ = ["group_lease"]


def group_lease(
    context: Context, client: VolcanoLocks, *, hook: VolcanoHook, acquire_task_id: str, poll: float, log: Any
) -> LockLease:
    """The group's lease, checked (an idempotent re-acquire, which must keep the group's fencing token).

    :param context: the member task's context.
    :param client: the member's client.
    :param hook: the member's hook (the group's connection).
    :param acquire_task_id: the task id of the group's acquire task.
    :param poll: seconds before the first retry of an unanswered check.
    :param log: the task's logger.
    :raises VolcanoLockLost: the group's lease is gone.
    """
    task_id = context["ti"].task_id
    value = pull_group(context, acquire_task_id)
    if value is None:
        raise AirflowFailException(
            f"Task {task_id!r} runs under the lock group of {acquire_task_id!r}, which holds no lease "
            "(is it upstream of this task, and did it succeed?)"
        )
    group, token = group_token(hook, value, context, acquire_task_id, log)
    key, fencing, ttl = group.lock_key, group.lease.fencing_token, group.lease.ttl
    try:
        # An idempotent re-acquire extends the group's lease to ttl from now if it is still ours;
        # an unreachable API is waited out no longer than the group's lease could last.
        lease = acquire_answered(
            client,
            key,
            ttl,
            token,
            deadline=time.time() + ttl,
            bound=f"the group's ttl={ttl}",
            poll=poll,
            log=log,
        )
    except ConflictError as exc:
        raise VolcanoLockLost(
            f"The group's lock {key!r} (fencing token {fencing}) was lost before task {task_id!r} "
            f"ran (the lock is now {holder_facts(read_state(client, key, log), key, hook.keyring)}; "
            f"{exc}); raise the group's ttl above the longest gap between its tasks"
        ) from None
    if lease.fencing_token != fencing:
        # The group's lease lapsed and the lock was free: this acquire made a new lease. Undo it.
        with contextlib.suppress(VolcanoError):
            client.release(key, lease)
        raise VolcanoLockLost(
            f"The group's lock {key!r} (fencing token {fencing}) lapsed before task {task_id!r} "
            f"ran; raise the group's ttl ({ttl} s) above the longest gap between its tasks"
        )
    log.info("Running under the group's lock %r (fencing token %s, renewed at ttl %s s)", key, fencing, ttl)
    return lease
