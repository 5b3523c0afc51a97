"""Opening a sealed record: the one way a reader gets a record a lock decision may rest on.

:func:`open_record` takes what Airflow's store returned (a Variable's text or an XCom value), checks
that it is a record of the lock asked for, that its seal verifies under the connection's keys
(:class:`~airflow_provider_volcano.records.seal.Keyring`) and that its facts are well formed, and
returns an :class:`Opened`: the record, or the refusal (why it was ignored). A refused record is
logged at WARNING, naming where it was stored, never a key, a seal or a token.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar

from airflow_provider_volcano.records.seal import Keyring, SealKey

__all__ = ["LEASE_KINDS", "Opened", "SealedRecord", "open_record", "sealed"]

log = logging.getLogger(__name__)

LEASE_KINDS = ("task", "group")
"""What a lease is held for: one task try (``task``) or a lock group across its tasks (``group``)."""


class SealedRecord(Protocol):
    """A record type kept in Airflow's store under a seal."""

    RECORD: ClassVar[str]
    """The record type's name: its seals are made under a key of its own."""

    @property
    def lock_key(self) -> str:
        """The lock the record is bound to."""
        ...

    def facts(self) -> dict[str, Any]:
        """The record's facts as JSON primitives (what the seal covers)."""
        ...

    @classmethod
    def from_facts(cls, facts: Mapping[str, Any]) -> Self:
        """Rebuild the record from its facts (``KeyError``, ``TypeError`` or ``ValueError`` if malformed)."""
        ...


R = TypeVar("R", bound=SealedRecord)


@dataclass(frozen=True)
class Opened(Generic[R]):
    """What a reader got from one place in Airflow's store.

    :param name: where it was read (a Variable's name or an XCom's key), for log lines.
    :param record: the record, when its seal verified (else ``None``).
    :param refusal: why a value found there was ignored (``None``: a record, or nothing there).
    :param key: the service key that sealed the record (the one its lease's token is derived from
        during a rotation); never in a repr.
    """

    name: str
    record: R | None = None
    refusal: str | None = None
    key: SealKey | None = field(default=None, repr=False)


def sealed(keys: Keyring, record: SealedRecord) -> dict[str, Any]:
    """The record's facts with their seal under the current key (to store as JSON or as an XCom)."""
    facts = record.facts()
    return {**facts, "seal": keys.seal(record.RECORD, facts)}


def _refused(name: str, reason: str, logger: logging.Logger | Any) -> Opened[Any]:
    logger.warning("Ignoring %s: %s; no lock decision rests on it", name, reason)
    return Opened(name, refusal=reason)


def open_record(
    keys: Keyring,
    kind: type[R],
    value: object,
    *,
    lock_key: str | None,
    name: str,
    logger: logging.Logger | Any = log,
) -> Opened[R]:
    """Open ``value`` as a sealed ``kind`` record of ``lock_key``: the record, or why it was ignored.

    :param keys: the connection's keyring (the current and previous service keys).
    :param kind: the record type expected (its ``RECORD`` names the sealing key).
    :param value: a Variable's text (JSON) or an XCom's value (a mapping); ``None``: nothing stored.
    :param lock_key: the lock the record must be bound to (``None``: any, for listings).
    :param name: where the value was read, as the warning names it (``Variable 'volcano_lock_...'``).
    :param logger: where a refusal is logged (the task's logger in a task).
    """
    if value is None:
        return Opened(name)
    data: object = value
    if isinstance(value, str):
        try:
            data = json.loads(value)
        except ValueError:
            return _refused(name, "it is not JSON", logger)
    if not isinstance(data, Mapping):
        return _refused(name, f"it is a {type(data).__name__}, not a record", logger)
    facts = {k: v for k, v in data.items() if k != "seal"}
    if lock_key is not None and facts.get("lock_key") != lock_key:
        return _refused(name, f"it names lock {facts.get('lock_key')!r}, not {lock_key!r}", logger)
    verdict = keys.verify(kind.RECORD, facts, data.get("seal"))
    if isinstance(verdict, str):
        return _refused(name, verdict, logger)
    try:
        record = kind.from_facts(facts)
    except (KeyError, TypeError, ValueError) as exc:
        return _refused(name, f"its facts are malformed ({type(exc).__name__})", logger)
    return Opened(name, record=record, key=verdict)


def as_int(value: object) -> int:
    """``value`` if it is an int (not a bool); else ``TypeError`` (for ``from_facts``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TypeError("not an integer")


def as_str(value: object) -> str:
    """``value`` if it is a str; else ``TypeError`` (for ``from_facts``)."""
    if isinstance(value, str):
        return value
    raise TypeError("not a string")


def as_kind(value: object) -> str:
    """``value`` if it is a lease kind (:data:`LEASE_KINDS`); else ``ValueError``."""
    if value in LEASE_KINDS:
        return str(value)
    raise ValueError("not a lease kind")
