"""A lock group's lease as its acquire task leaves it in XCom: sealed facts, and the token they yield.

The acquire task pushes the lease's public facts, the group's ``ttl`` and its own owner identity
(nothing secret), sealed with a MAC keyed by the service key (:meth:`VolcanoHook.seal_group`). Members
and the release task derive the group's ownership token only from an entry whose seal verifies and
whose owner is their own run's acquire task (XCom is writable through the REST API).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_volcano._compat import AirflowFailException

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_volcano.hooks.volcano import VolcanoHook

__all__ = ["GROUP_XCOM_KEY", "group_token", "pull_group"]

GROUP_XCOM_KEY = "volcano_lock_group"
"""XCom key of the group's lease: its public facts, ``ttl`` and the setup try's ``owner`` identity."""


def pull_group(context: Context, acquire_task_id: str) -> dict[str, Any] | None:
    """The group's XCom as the acquire task pushed it (``None``: it holds no lease)."""
    value = context["ti"].xcom_pull(task_ids=acquire_task_id, key=GROUP_XCOM_KEY)
    return dict(value) if isinstance(value, Mapping) else None


def group_token(hook: VolcanoHook, group: Mapping[str, Any], context: Context, acquire_task_id: str) -> str:
    """The group's ownership token, derived only from an XCom its acquire task sealed for this run.

    :raises AirflowFailException: the XCom is forged or copied from another run (names what differs).
    """
    from airflow_provider_volcano._tokens import ForgedGroup

    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    try:
        owner = hook.group_owner(
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
    return hook.ownership_token(owner, str(group["lock_key"]))
