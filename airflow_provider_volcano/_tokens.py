"""The ownership token a task instance try derives from the service key, so nothing secret is stored."""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["TaskIdentity", "derive_token"]

# Versioned so a future scheme change cannot collide with tokens minted by this one.
_DOMAIN = b"volcano-locks/airflow/ownership-token/v1"


@dataclass(frozen=True)
class TaskIdentity:
    """The public facts that name one try of one task instance.

    :param dag_id: the DAG id.
    :param task_id: the task id.
    :param run_id: the DAG run id.
    :param map_index: the map index (-1 for an unmapped task).
    :param try_number: the try number; a retry derives a different token, so a retry never
        silently inherits a lease a crashed earlier try may still hold.
    """

    dag_id: str
    task_id: str
    run_id: str
    map_index: int
    try_number: int

    def as_dict(self) -> dict[str, str | int]:
        """Return the identity as JSON primitives (for trigger kwargs)."""
        return {
            "dag_id": self.dag_id,
            "task_id": self.task_id,
            "run_id": self.run_id,
            "map_index": self.map_index,
            "try_number": self.try_number,
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
        )

    @classmethod
    def from_task_instance(cls, ti: object) -> TaskIdentity:
        """Read the identity from a (runtime) task instance."""
        map_index = getattr(ti, "map_index", -1)
        return cls(
            dag_id=str(getattr(ti, "dag_id")),  # noqa: B009
            task_id=str(getattr(ti, "task_id")),  # noqa: B009
            run_id=str(getattr(ti, "run_id")),  # noqa: B009
            map_index=-1 if map_index is None else int(map_index),
            try_number=int(getattr(ti, "try_number", 1) or 1),
        )


def derive_token(service_key: str, identity: TaskIdentity, lock_key: str) -> str:
    """Derive the ownership token (a UUID string) for one task try and one lock.

    Trigger and resumed task compute the same token, so the trigger can acquire on the task's
    behalf and the task re-acquires that very lease idempotently (same fencing token). The HMAC
    key is the service key: whoever can derive the token could manage the lock anyway.

    :param service_key: the Volcano service key (never stored or logged).
    :param identity: the task instance try.
    :param lock_key: the lock the token is for.
    """
    message = b"\x00".join(
        part.encode()
        for part in (
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
