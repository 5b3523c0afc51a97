"""A lock group's lease as its acquire task leaves it in XCom: sealed facts, owner and kind.

The acquire task pushes XCom ``volcano_lock_group``: the lease's public facts
(:class:`~volcano_locks.models.LeaseFacts`), its own owner identity (dag, task, run, map index, try,
nonce; nothing secret) and the kind ``group``, sealed under the service key. Members and the release
task derive the group's ownership token only from an entry whose seal verifies and whose owner is
their own run's acquire task (XCom is writable through the REST API and by every task's code); the
token is derived with the key that sealed it, so a group keeps working across a key rotation while
the previous key is listed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_provider_volcano._compat import AirflowFailException
from airflow_provider_volcano._tokens import TaskIdentity
from airflow_provider_volcano.records.opened import Opened, open_record, sealed
from airflow_provider_volcano.records.seal import Keyring
from volcano_locks import LeaseFacts

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_provider_volcano.hooks.volcano import VolcanoHook

__all__ = ["GROUP_XCOM_KEY", "GroupLease", "group_token", "open_group", "pull_group", "seal_group"]

log = logging.getLogger(__name__)

GROUP_XCOM_KEY = "volcano_lock_group"
"""XCom key of the group's lease: its public facts, the acquire try's ``owner``, ``kind`` and ``seal``."""


@dataclass(frozen=True)
class GroupLease:
    """A lock group's lease and the acquire try that holds it for the group (all public).

    :param lease: the lease's public facts.
    :param owner: the acquire task's try (the ownership token is derived from it).
    """

    RECORD: ClassVar[str] = "group"

    lease: LeaseFacts
    owner: TaskIdentity

    @property
    def lock_key(self) -> str:
        """The lock."""
        return self.lease.lock_key

    def facts(self) -> dict[str, Any]:
        """The record's facts (what the seal covers)."""
        return {**self.lease.as_dict(), "owner": self.owner.as_dict(), "kind": "group"}

    @classmethod
    def from_facts(cls, facts: Mapping[str, Any]) -> GroupLease:
        """Rebuild the record from its facts."""
        if facts.get("kind") != "group":
            raise ValueError("not a group lease")
        return cls(LeaseFacts.from_dict(facts), TaskIdentity.from_dict(facts["owner"]))


def seal_group(keys: Keyring, group: GroupLease) -> dict[str, Any]:
    """The XCom value of a group's lease: its facts and their seal under the current key."""
    return sealed(keys, group)


def open_group(
    keys: Keyring,
    value: object,
    *,
    dag_id: str,
    run_id: str,
    acquire_task_id: str,
    map_index: int,
    logger: logging.Logger | Any = log,
) -> Opened[GroupLease]:
    """Open a group's XCom: sealed, and written by this run's acquire task (else the refusal).

    Two checks, both needed: the seal proves a holder of the service key wrote the facts, and the
    owner must be this run's acquire task, so a genuine entry copied from another run or another
    group cannot hand over that group's lease either.

    :param keys: the connection's keyring.
    :param value: the XCom value as pulled.
    :param dag_id: the reading task's DAG id.
    :param run_id: the reading task's run id.
    :param acquire_task_id: the task id of the group's acquire task.
    :param map_index: the reading task's map index (the acquire task's is the same or -1).
    """
    name = f"XCom {GROUP_XCOM_KEY!r} of task {acquire_task_id!r}"
    opened = open_record(keys, GroupLease, value, lock_key=None, name=name, logger=logger)
    group = opened.record
    if group is None:
        return opened
    owner = group.owner
    if (owner.dag_id, owner.run_id, owner.task_id) != (
        dag_id,
        run_id,
        acquire_task_id,
    ) or owner.map_index not in (
        -1,
        map_index,
    ):
        reason = (
            f"its owner is {owner.dag_id}.{owner.task_id} of run {owner.run_id!r} (map index "
            f"{owner.map_index}), not this run's acquire task {dag_id}.{acquire_task_id} of run {run_id!r}"
        )
        logger.warning("Ignoring %s: %s; no lock decision rests on it", name, reason)
        return Opened(name, refusal=reason)
    return opened


def pull_group(context: Context, acquire_task_id: str) -> Mapping[str, Any] | None:
    """The group's XCom as found (``None``: the acquire task holds no lease); open it before use."""
    value = context["ti"].xcom_pull(task_ids=acquire_task_id, key=GROUP_XCOM_KEY)
    return value if isinstance(value, Mapping) else None


def group_token(
    hook: VolcanoHook, value: Mapping[str, Any], context: Context, acquire_task_id: str, logger: Any = log
) -> tuple[GroupLease, str]:
    """The group's lease and ownership token, from an XCom its acquire task sealed for this run.

    The token is derived with the key that sealed the entry (a previous key during a rotation).

    :raises AirflowFailException: the entry did not open (names why, never a key).
    """
    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    opened = open_group(
        hook.keyring,
        value,
        dag_id=str(ti.dag_id),
        run_id=str(ti.run_id),
        acquire_task_id=acquire_task_id,
        map_index=-1 if map_index is None else int(map_index),
        logger=logger,
    )
    if opened.record is None:
        raise AirflowFailException(
            f"Refusing the lock group's XCom {GROUP_XCOM_KEY!r} of task {acquire_task_id!r} for lock "
            f"{value.get('lock_key')!r}: {opened.refusal}. Only the group's acquire task writes it; an "
            "entry created or patched through the REST API or by another task never yields the group's "
            "lease."
        )
    group = opened.record
    return group, hook.ownership_token(group.owner, group.lock_key, opened.key)
