"""What a run-once ledger records of a business key's effect, and how a duplicate is told.

A :class:`OnceRecord` is one line of the ledger: the business key, the lock key and fencing token the
effect was done under, when, :class:`Who` did it (the orchestrator and its run's ids) and an optional small
JSON result. It never holds a secret: :class:`Who` takes ids only, and the fence's public facts are the
lock key and the fencing token (never the ownership token).

:func:`already_done` is the one place a duplicate becomes the error every ledger raises
(:class:`AlreadyDone`, naming the first run), as ``refusal`` is for a stale fencing token.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from volcano_locks.errors import ErrorCode, VolcanoError

__all__ = [
    "MAX_BUSINESS_KEY",
    "MAX_RESULT_BYTES",
    "AlreadyDone",
    "AuditEntry",
    "OnceRecord",
    "Who",
    "already_done",
    "bound_lease",
    "check_forget",
    "check_list",
    "check_result",
    "validate_business_key",
]

MAX_BUSINESS_KEY = 256
"""The longest business key, in characters."""
MAX_RESULT_BYTES = 16 * 1024
"""The largest recorded result, as compact JSON: a summary of the effect (counts, a path), not its data."""

_ORCHESTRATORS = ("airflow", "prefect", "cli", "python")
_MAX_ID = 250


def validate_business_key(key: object) -> str:
    """Check a business key: a non-empty string of at most 256 printable characters.

    Raises:
        ValueError: naming the value (cut to 80 characters) or its type.
    """
    if not isinstance(key, str):
        raise ValueError(f"business key must be a string, got {type(key).__name__}")
    if not key or len(key) > MAX_BUSINESS_KEY or not key.isprintable() or key != key.strip():
        shown = key if len(key) <= 80 else key[:77] + "..."
        raise ValueError(
            f"business key must be 1 to {MAX_BUSINESS_KEY} printable characters without leading or "
            f"trailing spaces, got {shown!r}"
        )
    return key


def check_result(result: object) -> Any:
    """Check a result to record: JSON (dicts with string keys, lists, strings, numbers, bools, ``None``),
    at most :data:`MAX_RESULT_BYTES` as compact JSON. Returns it as it will read back (a JSON round trip).

    Raises:
        ValueError: it is not JSON, or too large (the message names its type and size, never its contents).
    """
    try:
        text = json.dumps(result, separators=(",", ":"), allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"a run-once result must be JSON (dict, list, str, number, bool or None), got "
            f"{type(result).__name__}: {exc}"
        ) from None
    if len(text.encode()) > MAX_RESULT_BYTES:
        raise ValueError(
            f"a run-once result must be at most {MAX_RESULT_BYTES} bytes of JSON, got {len(text.encode())}: "
            "record a summary (counts, a path), keep the data in your store"
        )
    return json.loads(text)


@dataclass(frozen=True)
class Who:
    """Who did an effect: the orchestrator and the ids of its run (never a secret).

    Attributes:
        orchestrator: ``"airflow"``, ``"prefect"``, ``"cli"`` or ``"python"``.
        ids: the run's ids, in order: Airflow ``dag_id``, ``run_id``, ``task_id``, ``try_number``
            (``map_index`` when mapped); Prefect ``flow_run_id``, ``task_run_id`` (and names); plain Python
            ``host``, ``pid``.
    """

    orchestrator: str
    ids: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.orchestrator not in _ORCHESTRATORS:
            raise ValueError(f"orchestrator must be one of {_ORCHESTRATORS}, got {self.orchestrator!r}")
        for name, value in self.ids:
            if not isinstance(name, str) or not isinstance(value, str) or len(value) > _MAX_ID:
                raise ValueError(
                    f"Who ids must be (str, str) pairs of at most {_MAX_ID} characters: {name!r}"
                )

    @classmethod
    def of(cls, orchestrator: str, **ids: object) -> Who:
        """``Who.of("airflow", dag_id=..., run_id=..., task_id=..., try_number=1)``; ``None`` ids left out."""
        return cls(orchestrator, tuple((k, str(v)) for k, v in ids.items() if v is not None))

    @classmethod
    def here(cls) -> Who:
        """This process, outside any orchestrator: host and pid."""
        return cls.of("python", host=socket.gethostname(), pid=os.getpid())

    def get(self, name: str) -> str | None:
        """The id called ``name``, or ``None``."""
        return dict(self.ids).get(name)

    def describe(self) -> str:
        """One line naming the run: ``airflow dag_id=rollup run_id=manual__... task_id=load try_number=1``."""
        return " ".join([self.orchestrator, *(f"{k}={v}" for k, v in self.ids)])

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {"orchestrator": self.orchestrator, "ids": dict(self.ids)}

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> Who:
        """Parse the JSON form."""
        return cls(str(body["orchestrator"]), tuple((str(k), str(v)) for k, v in dict(body["ids"]).items()))


@dataclass(frozen=True)
class OnceRecord:
    """One ledger line: the business key's effect was done under ``fencing_token`` of ``lock_key``.

    Attributes:
        business_key: what was done once (``"rollup:2026-12-01"``).
        lock_key: the lock held while it was done.
        fencing_token: the fencing token it was done under.
        done_at: when it committed (aware UTC).
        who: which run did it.
        result: the small JSON result the run recorded (``None``: none).
    """

    business_key: str
    lock_key: str
    fencing_token: int
    done_at: datetime
    who: Who
    result: Any = field(default=None, compare=False)

    def describe(self) -> str:
        """Who did it, under which token and when: what a duplicate's message names."""
        return (
            f"{self.business_key!r} was done by {self.who.describe()} under fencing token "
            f"{self.fencing_token} of lock {self.lock_key!r} at {self.done_at.isoformat(timespec='seconds')}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the S3 manifest's, the CLI's ``--json``)."""
        return {
            "business_key": self.business_key,
            "lock_key": self.lock_key,
            "fencing_token": self.fencing_token,
            "done_at": self.done_at.isoformat(),
            "who": self.who.to_dict(),
            "result": self.result,
        }

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> OnceRecord:
        """Parse the JSON form."""
        done_at = datetime.fromisoformat(str(body["done_at"]))
        return cls(
            business_key=str(body["business_key"]),
            lock_key=str(body["lock_key"]),
            fencing_token=int(body["fencing_token"]),
            done_at=done_at if done_at.tzinfo else done_at.replace(tzinfo=UTC),
            who=Who.from_dict(body["who"]),
            result=body.get("result"),
        )


class AuditEntry:
    """One forget in the audit table: the record forgotten, who forgot it, when and why."""

    def __init__(self, record: OnceRecord, by: str, why: str, at: datetime) -> None:
        self.record = record
        self.by = by
        self.why = why
        self.at = at

    def __repr__(self) -> str:
        return f"AuditEntry({self.record.business_key!r}, by={self.by!r}, at={self.at.isoformat()!r})"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the CLI's)."""
        return {
            "action": "forget",
            "by": self.by,
            "why": self.why,
            "at": self.at.isoformat(),
            "record": self.record.to_dict(),
        }

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> AuditEntry:
        """Parse the JSON form."""
        at = datetime.fromisoformat(str(body["at"]))
        return cls(OnceRecord.from_dict(body["record"]), str(body["by"]), str(body["why"]), at)


def check_forget(business_key: object, by: object, why: object) -> tuple[str, str, str]:
    """Check a forget's arguments: the key, and who forgets it and why (both required, for the audit)."""
    key = validate_business_key(business_key)
    checked = []
    for what, value in (("by", by), ("why", why)):
        if not isinstance(value, str) or not value.strip() or len(value) > 1000:
            shown = value if isinstance(value, str) and len(value) <= 80 else type(value).__name__
            raise ValueError(
                f"forget needs {what!r}: non-empty text of at most 1000 characters, got {shown!r}"
            )
        checked.append(value.strip())
    return key, checked[0], checked[1]


def check_list(prefix: object, limit: object) -> None:
    """Check a listing's arguments: a key prefix (or ``None``) and a limit from 1 to 100,000."""
    if prefix is not None and not isinstance(prefix, str):
        raise ValueError(f"prefix must be a string, got {type(prefix).__name__}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
        raise ValueError(f"limit must be an int from 1 to 100000, got {limit!r}")


def bound_lease(lease: object | None) -> object:
    """The lease a run-once key was bound to (``with_lock`` binds ``guard.once``), or a clear error."""
    if lease is None:
        raise TypeError(
            "this run-once key is not bound to a lease: use the guard's (guard.once) or .bound(lease)"
        )
    return lease


class AlreadyDone(VolcanoError):
    """The business key's effect is already in the ledger: this run's effect did not commit.

    ``record`` is the first run's :class:`OnceRecord` (its ``result`` is what to return instead); the
    message names that run. Code ``already_done``.
    """

    def __init__(self, record: OnceRecord) -> None:
        super().__init__(f"duplicate run: {record.describe()}", code=ErrorCode.ALREADY_DONE)
        self.record = record


def already_done(record: OnceRecord) -> AlreadyDone:
    """The one way every ledger reports a duplicate (SQL on its primary key, S3 on its manifest)."""
    return AlreadyDone(record)
