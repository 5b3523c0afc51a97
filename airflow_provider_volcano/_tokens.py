"""The ownership token of one task try: derived from the service key and a random per-try nonce.

Nothing secret is stored: trigger kwargs and events carry the nonce, which is useless without the
service key, and the trigger and the resumed task both derive the same token from it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["TaskIdentity", "derive_token", "new_nonce"]

# Versioned so a future scheme change cannot collide with tokens minted by this one. v1 derived the
# token from public facts alone (dag, task, run id, map index, try), so two deployments of one DAG
# with one service key derived the same token for the same scheduled run and both held the lock.
_DOMAIN = b"volcano-locks/airflow/ownership-token/v2"
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
