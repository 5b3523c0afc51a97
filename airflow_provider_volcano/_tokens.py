"""The ownership token of one task try: derived from the service key and a random per-try nonce.

Nothing secret is stored: trigger kwargs and events carry the nonce, which is useless without the
service key, and the trigger and the resumed task both derive the same token from it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ForgedGroup", "TaskIdentity", "derive_token", "new_nonce", "seal_group", "verify_group"]

# Versioned so a future scheme change cannot collide with tokens minted by this one. v1 derived the
# token from public facts alone (dag, task, run id, map index, try), so two deployments of one DAG
# with one service key derived the same token for the same scheduled run and both held the lock.
_DOMAIN = b"volcano-locks/airflow/ownership-token/v2"
_GROUP_DOMAIN = b"volcano-locks/airflow/lock-group-seal/v1"
_NONCE = re.compile(r"\A[0-9a-f]{32}\Z")


def new_nonce() -> str:
    """Return a fresh random per-try nonce (128 bits, hex)."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class TaskIdentity:
    """One try of one task instance, as the owner of a lock.

    :param dag_id: the DAG id.
    :param task_id: the task id.
    :param run_id: the DAG run id.
    :param map_index: the map index (-1 for an unmapped task).
    :param try_number: the try number.
    :param nonce: random to this try (:func:`new_nonce`), drawn when the try first executes and
        carried to its trigger and its resumed execution. It is what makes the owner unique: the
        other fields are the same in every deployment of a DAG (``scheduled__<date>`` run ids).
    """

    dag_id: str
    task_id: str
    run_id: str
    map_index: int
    try_number: int
    nonce: str

    def __post_init__(self) -> None:
        if not isinstance(self.nonce, str) or not _NONCE.match(self.nonce):
            raise ValueError(f"nonce must be 32 lowercase hex digits, got {self.nonce!r}")

    def as_dict(self) -> dict[str, str | int]:
        """Return the identity as JSON primitives (for trigger kwargs)."""
        return {
            "dag_id": self.dag_id,
            "task_id": self.task_id,
            "run_id": self.run_id,
            "map_index": self.map_index,
            "try_number": self.try_number,
            "nonce": self.nonce,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> TaskIdentity:
        """Rebuild an identity from :meth:`as_dict` output."""
        return cls(
            dag_id=str(data["dag_id"]),
            task_id=str(data["task_id"]),
            run_id=str(data["run_id"]),
            map_index=int(data["map_index"]),  # type: ignore[call-overload]
            try_number=int(data["try_number"]),  # type: ignore[call-overload]
            nonce=str(data["nonce"]),
        )

    @classmethod
    def from_task_instance(cls, ti: object, nonce: str) -> TaskIdentity:
        """Read the identity from a (runtime) task instance, with this try's ``nonce``."""
        map_index = getattr(ti, "map_index", -1)
        return cls(
            dag_id=str(getattr(ti, "dag_id")),  # noqa: B009
            task_id=str(getattr(ti, "task_id")),  # noqa: B009
            run_id=str(getattr(ti, "run_id")),  # noqa: B009
            map_index=-1 if map_index is None else int(map_index),
            try_number=int(getattr(ti, "try_number", 1) or 1),
            nonce=nonce,
        )


def derive_token(service_key: str, identity: TaskIdentity, lock_key: str) -> str:
    """Derive the ownership token (a UUID string) for one task try and one lock.

    Trigger and resumed task compute the same token from the same nonce, so the trigger can acquire
    on the task's behalf and the task re-acquires that very lease idempotently (same fencing token).
    The HMAC key is the service key: whoever can derive the token could manage the lock anyway.

    :param service_key: the Volcano service key (never stored or logged).
    :param identity: the task instance try, nonce included.
    :param lock_key: the lock the token is for.
    """
    message = b"\x00".join(
        part.encode()
        for part in (
            identity.nonce,
            identity.dag_id,
            identity.task_id,
            identity.run_id,
            str(identity.map_index),
            str(identity.try_number),
            lock_key,
        )
    )
    digest = hmac.new(service_key.encode(), _DOMAIN + b"\x00" + message, hashlib.sha256).digest()
    # Version-4/variant bits make it a well-formed UUID, which the Volcano contract requires.
    return str(uuid.UUID(bytes=digest[:16], version=4))


class ForgedGroup(ValueError):
    """A lock group's XCom that its acquire task did not write (or not for this run)."""


def _group_message(group: Mapping[str, object]) -> bytes:
    """The sealed facts of a group's lease, in one canonical form (what a member derives and checks)."""
    owner = group.get("owner")
    facts = {
        "lock_key": group.get("lock_key"),
        "fencing_token": group.get("fencing_token"),
        "ttl": group.get("ttl"),
        "owner": dict(owner) if isinstance(owner, Mapping) else owner,
    }
    return _GROUP_DOMAIN + b"\x00" + json.dumps(facts, sort_keys=True, separators=(",", ":")).encode()


def seal_group(service_key: str, group: Mapping[str, object]) -> str:
    """Return the MAC (hex) over a lock group's lease facts and owner, keyed by the service key.

    The group's acquire task writes it beside the facts in XCom. XCom is writable by users (Airflow's
    REST API creates and patches entries), so a member derives the group's ownership token only from
    facts whose seal verifies: nobody without the service key can name another task as the owner.

    :param service_key: the Volcano service key (never stored or logged).
    :param group: ``lock_key``, ``fencing_token``, ``ttl`` and ``owner`` (``TaskIdentity.as_dict()``).
    """
    return hmac.new(service_key.encode(), _group_message(group), hashlib.sha256).hexdigest()


def verify_group(
    service_key: str,
    group: Mapping[str, object],
    *,
    dag_id: str,
    run_id: str,
    acquire_task_id: str,
    map_index: int,
) -> TaskIdentity:
    """Return the owner of a lock group's XCom after checking that its acquire task wrote it for this run.

    Two checks, both needed: the seal (:func:`seal_group`) proves the facts were written by a holder
    of the service key, and the owner must be this run's acquire task, so a genuine entry copied from
    another run or another group cannot hand over that group's lease either.

    :param service_key: the Volcano service key.
    :param group: the XCom value as pulled.
    :param dag_id: the reading task's DAG id.
    :param run_id: the reading task's run id.
    :param acquire_task_id: the task id of the group's acquire task.
    :param map_index: the reading task's map index (the acquire task's is the same or -1).
    :raises ForgedGroup: naming what did not match (never the seal or a key).
    """
    seal = group.get("seal")
    if not isinstance(seal, str) or not hmac.compare_digest(seal, seal_group(service_key, group)):
        raise ForgedGroup("its seal does not match its facts (not written by the group's acquire task)")
    owner_data = group.get("owner")
    if not isinstance(owner_data, Mapping):
        raise ForgedGroup("it names no owner")
    try:
        owner = TaskIdentity.from_dict(owner_data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ForgedGroup(f"its owner is malformed ({exc})") from None
    expected = (dag_id, run_id, acquire_task_id)
    found = (owner.dag_id, owner.run_id, owner.task_id)
    if found != expected or owner.map_index not in (-1, map_index):
        raise ForgedGroup(
            f"its owner is {owner.dag_id}.{owner.task_id} of run {owner.run_id!r} (map index "
            f"{owner.map_index}), not this run's acquire task {dag_id}.{acquire_task_id} of run {run_id!r}"
        )
    return owner
