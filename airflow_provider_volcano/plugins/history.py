"""A lock's recent history on the board, and when each of its waiters may expect its turn.

The history is the lock's latest tenures as their holder tasks recorded them (sealed tenure records,
:mod:`airflow_provider_volcano.records.tenure`): holder, fencing token, start, end and how it ended.
A tenure whose record still says ``holding`` once Volcano's live fencing token is another (or the lock
is free) never wrote its end: its task was killed or its worker lost, and the lease ran out, so the
board calls it ``expired``.

The expected starts come from the same estimate the waiting log lines use
(:func:`volcano_locks.eta.estimate`): the held times of the tenures that ended, the live holder's time
so far, and each waiter's place in the whole line (waiters the viewer may not see count too).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from airflow_provider_volcano.records.opened import open_record
from airflow_provider_volcano.records.tenure import TENURE_PREFIX, TENURES_KEPT, TenureRecord, tenure_variable
from volcano_locks.integration import Eta, duration, estimate

if TYPE_CHECKING:
    from airflow_provider_volcano.records.seal import Keyring
    from volcano_locks import LockState

__all__ = ["Tenure", "expected_starts", "handovers", "read_tenures", "tenures_seen"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tenure:
    """One tenure as the board shows it.

    :param record: what its holder task recorded (sealed).
    :param ending: the record's ending, or ``expired`` when the lock moved on without it.
    :param hidden: its holder is a task of a DAG the viewing user may not read.
    """

    record: TenureRecord
    ending: str
    hidden: bool = False

    def names(self) -> str:
        """The holder try as the board names it."""
        if self.hidden:
            return "a task of a DAG you may not read"
        r = self.record
        mapped = f" [{r.map_index}]" if r.map_index >= 0 else ""
        return f"{r.dag_id} / {r.run_id} / {r.task_id}{mapped} try {r.try_number}"

    def as_dict(self) -> dict[str, object]:
        """Public facts for the board's JSON."""
        r = self.record
        holder: dict[str, str | int] | None = None
        if not self.hidden:
            holder = {"dag_id": r.dag_id, "run_id": r.run_id, "task_id": r.task_id, "map_index": r.map_index}
            holder |= {"try_number": r.try_number, "hostname": r.hostname}
        return {
            "fencing_token": r.fencing_token,
            "holder": holder,
            "acquired_at": r.acquired_at,
            "ended_at": r.ended_at or None,
            "ending": self.ending,
            "held_s": r.held_for(),
        }


def read_tenures(keys: Keyring | None, stored: Iterable[tuple[str, object]]) -> dict[str, list[TenureRecord]]:
    """The sealed tenure records among ``stored`` (Variable name less the prefix, value), by lock key.

    Without ``keys`` nothing is believed; a record in another lock's or another lease's slot is ignored.
    """
    found: dict[str, list[TenureRecord]] = {}
    if keys is None:
        return found
    for name, value in stored:
        record = open_record(
            keys, TenureRecord, value, lock_key=None, name=f"Variable {TENURE_PREFIX + name!r}", logger=log
        ).record
        if record is None or tenure_variable(record.lock_key, record.fencing_token) != TENURE_PREFIX + name:
            continue
        found.setdefault(record.lock_key, []).append(record)
    for records in found.values():
        records.sort(key=lambda r: r.fencing_token, reverse=True)  # newest first
    return found


def tenures_seen(records: Iterable[TenureRecord], state: LockState | None) -> list[Tenure]:
    """The records as the board shows them, ``holding`` ones the lock moved on from called ``expired``."""
    shown = []
    for record in records:
        ending = record.ending
        if ending == "holding" and state is not None:
            live = state.fencing_token if state.held else None
            if live != record.fencing_token:
                ending = "expired"
        shown.append(Tenure(record, ending))
    return shown


def handovers(tenures: list[Tenure]) -> str:
    """How often the lock changed hands over the history kept, as one phrase."""
    if len(tenures) < 2:
        return f"{len(tenures)} tenure kept"
    try:
        span = datetime.fromisoformat(tenures[0].record.acquired_at) - datetime.fromisoformat(
            tenures[-1].record.acquired_at
        )
    except ValueError:
        return f"{len(tenures) - 1} hand-overs among the last {len(tenures)} tenures"
    minutes = max(span.total_seconds() / 60, 1 / 60)
    return (
        f"{len(tenures) - 1} hand-overs among the last {len(tenures)} tenures, over "
        f"{duration(span.total_seconds())} ({(len(tenures) - 1) / minutes * 60:.0f} an hour)"
    )


def expected_starts(
    tenures: list[Tenure], state: LockState | None, now: datetime, line: int
) -> Mapping[int, Eta | None]:
    """Each place in a line of ``line`` waiters (from 1) and its expected start, while the lock is held.

    The held times of the tenures that ended (oldest first, at most :data:`TENURES_KEPT`) and the live
    holder's time so far, from its tenure record; ``None`` for every place without any tenure ended, or
    when the lock is not read or not held (the next waiter goes as soon as it looks).
    """
    if state is None or not state.held:
        return dict.fromkeys(range(1, line + 1))
    held = [t.record.held_for() for t in reversed(tenures) if t.ending not in ("holding", "expired")]
    durations = [h for h in held if h is not None][-TENURES_KEPT:]
    elapsed = None
    for t in tenures:
        if t.record.fencing_token == state.fencing_token:
            try:
                elapsed = (now - datetime.fromisoformat(t.record.acquired_at)).total_seconds()
            except ValueError:
                elapsed = None
    return {place: estimate(durations, elapsed, place) for place in range(1, line + 1)}
