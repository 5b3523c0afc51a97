"""What a waiting line says of the lock's holder, and how old what it says is.

A line names the holder's fencing token and expiry from a read of the lock, with that read's age
(a backed-off wait's last look can be minutes old, and said so nothing); the holder's task try when
its provenance record names that token; whether the lease is a handoff and whose, and whether that
try has resumed; and, when Airflow says the holder's try has ended, that its lease now ends at its
release or its expiry (:mod:`airflow_provider_volcano.runtime.holder_watch`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_volcano._handoff import describe, shown_state

if TYPE_CHECKING:
    from airflow_provider_volcano.records.handoff import HandoffRecord
    from airflow_provider_volcano.records.holder import HolderRecord
    from volcano_locks import LockState

__all__ = ["LINE_READ_AGE", "holder_line"]

LINE_READ_AGE = 60.0
"""A waiting line names the holder from a read at most this many seconds old (the wait engine's last
look, or a read shared by the key's lines), and says its age; an older one is read again."""


def holder_line(
    holder: LockState | None,
    record: HandoffRecord | None,
    state: object,
    provenance: HolderRecord | None = None,
    *,
    age: float | None = None,
    holder_state: object = ...,
) -> str:
    """The holder as a waiting line names it.

    :param holder: the lock as last read (``None``: not read).
    :param record: the lock's handoff record, if any.
    :param state: the handoff owner's task state (see :func:`~airflow_provider_volcano._handoff.shown_state`).
    :param provenance: the holder record (trusted only while it names the live fencing token).
    :param age: seconds since ``holder`` was read (``None``: unknown, and then the line says so).
    :param holder_state: the holder record's try's state, when Airflow says that try has ended.
    """
    if holder is None or not holder.held or holder.fencing_token is None:
        return "held by another owner (not read yet)"
    until = holder.expires_at.isoformat() if holder.expires_at is not None else "an unknown time"
    read = "as of a read of unknown age" if age is None else f"as read {max(0.0, age):.0f} s ago"
    if provenance is not None and provenance.fencing_token == holder.fencing_token:
        line = f"{provenance.describe()}, until {until} ({read})"
        if holder_state is not ...:
            line += (
                f"; that try has ended (task state: {shown_state(holder_state)}): its lease ends at "
                "its release or its expiry, and the lock is looked at then"
            )
        return line
    return (
        f"held with fencing token {holder.fencing_token} until {until} ({read}); "
        f"{describe(record, holder.fencing_token, state)}"
    )
