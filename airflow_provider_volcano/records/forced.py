"""The force-release record: which lease the lock board ended, by whom and when.

Variable ``volcano_lock_forced:<lock key>``, written (sealed) by the board before it force-releases.
The holder that loses that lease reads it and fails naming the force release and its author; an
unsealed record names nobody (anyone may write a Variable, and it would blame whoever it named).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from airflow_provider_volcano.records.opened import as_int, as_str
from airflow_provider_volcano.records.seal import Keyring
from airflow_provider_volcano.records.store import open_variable

__all__ = ["FORCED_PREFIX", "ForcedRecord", "forced_line", "forced_variable", "read_forced"]

log = logging.getLogger(__name__)

FORCED_PREFIX = "volcano_lock_forced:"


def forced_variable(lock_key: str) -> str:
    """The Variable that holds the force-release record of ``lock_key``."""
    return FORCED_PREFIX + lock_key


@dataclass(frozen=True)
class ForcedRecord:
    """A force release done from the lock board: which lease, by whom, when (all public)."""

    RECORD: ClassVar[str] = "forced"

    lock_key: str
    fencing_token: int | None
    by: str
    at: str

    def facts(self) -> dict[str, Any]:
        """The record's facts (what the seal covers)."""
        return asdict(self)

    @classmethod
    def from_facts(cls, facts: Mapping[str, Any]) -> ForcedRecord:
        """Rebuild the record from its facts."""
        token = facts.get("fencing_token")
        return cls(
            lock_key=as_str(facts["lock_key"]),
            fencing_token=None if token is None else as_int(token),
            by=as_str(facts["by"]),
            at=as_str(facts["at"]),
        )


def read_forced(
    keys: Keyring, lock_key: str, fencing_token: int | None, logger: logging.Logger | Any = log
) -> ForcedRecord | None:
    """The force-release record of ``lock_key`` if its seal verifies and it ended ``fencing_token``."""
    record = open_variable(keys, ForcedRecord, forced_variable(lock_key), lock_key, logger).record
    if record is None or record.fencing_token != fencing_token:
        return None
    return record


def forced_line(record: ForcedRecord) -> str:
    """What a holder's failure says of the force release that ended its lease."""
    return (
        f"it was force-released by {record.by} at {record.at} from the Airflow UI's Volcano locks page "
        f"(fencing token {record.fencing_token})"
    )
