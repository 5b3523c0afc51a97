"""A lock group's member task: run its body under the group's lease, renewing it, never releasing it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from airflow_provider_volcano._acquiring import acquire_answered, holder_facts, read_state
from airflow_provider_volcano._beside import beside
from airflow_provider_volcano._compat import AirflowFailException
from airflow_provider_volcano._group_lease import group_token, pull_group
from airflow_provider_volcano._supervision import supervised
from airflow_provider_volcano.exceptions import VolcanoLockLost

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_volcano.hooks.volcano import VolcanoHook
    from volcano_locks.models import LockLease

__all__ = ["run_member"]


def run_member(
    context: Context,
    *,
    hook: VolcanoHook,
    acquire_task_id: str,
    body: Callable[[LockLease], Any],
    log: Any,
    poll: float = 2.0,
) -> Any:
    """Check the group's lease (an idempotent re-acquire), keep it while ``body(lease)`` runs, leave it held.

    :param context: the member task's context.
    :param hook: the member's hook (the group's connection).
    :param acquire_task_id: the task id of the group's acquire task.
    :param body: runs the member's callable with the group's lease.
    :param log: the task's logger.
    :param poll: seconds before the first retry of an unanswered check.
    :raises VolcanoLockLost: the group's lease is gone (before or while the body ran).
    """
    from volcano_locks.errors import ConflictError, OwnershipLost, VolcanoError
    from volcano_locks.keeping import keep

    task_id = context["ti"].task_id
    group = pull_group(context, acquire_task_id)
    if group is None:
        raise AirflowFailException(
            f"Task {task_id!r} runs under the lock group of {acquire_task_id!r}, which holds no lease "
            "(is it upstream of this task, and did it succeed?)"
        )
    key, fencing, ttl = str(group["lock_key"]), int(group["fencing_token"]), int(group["ttl"])
    token = group_token(hook, group, context, acquire_task_id)
    with contextlib.closing(hook.get_client()) as client:
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
                f"ran (the lock is now {holder_facts(read_state(client, key, log))}; {exc}); raise the "
                "group's ttl above the longest gap between its tasks"
            ) from None
        if lease.fencing_token != fencing:
            # The group's lease lapsed and the lock was free: this acquire made a new lease. Undo it.
            with contextlib.suppress(VolcanoError):
                client.release(key, lease)
            raise VolcanoLockLost(
                f"The group's lock {key!r} (fencing token {fencing}) lapsed before task {task_id!r} "
                f"ran; raise the group's ttl ({ttl} s) above the longest gap between its tasks"
            )
        log.info(
            "Running under the group's lock %r (fencing token %s, renewed at ttl %s s)", key, fencing, ttl
        )
        from airflow_provider_volcano._provenance import write_holder

        gone = (
            f"The task's supervisor is gone: task {task_id!r} stopped its body and stopped renewing the "
            f"group's lock {key!r} (fencing token {fencing}); the group's release task or its ttl ends "
            "the lease"
        )
        try:
            with (
                # The member running now is the one the board names.
                beside(partial(write_holder, context, key, fencing, ttl), logger=log),
                supervised(
                    context["ti"], log, lambda: f"lock {key!r} (fencing token {fencing})", lambda: gone
                ),
                keep(client, lease),
            ):
                result = body(lease)
        except OwnershipLost as loss:
            raise VolcanoLockLost(
                f"Lost the group's lock {key!r} (fencing token {fencing}) while task {task_id!r} ran "
                f"({loss}); the task is failed because its work is no longer protected by the lock"
            ) from None
    log.info("Kept the group's lock %r (fencing token %s) for the group's next task", key, fencing)
    return result
