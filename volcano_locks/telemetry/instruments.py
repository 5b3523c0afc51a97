"""The instruments: each one's name, kind, unit and meaning, defined once for every sink."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["INSTRUMENTS", "Instrument", "Kind"]

Kind = Literal["counter", "histogram", "updown", "gauge"]
"""``counter`` only grows; ``histogram`` records a distribution; ``updown`` is a count of things now
(adjusted by +1/-1); ``gauge`` is a value set now."""


@dataclass(frozen=True)
class Instrument:
    """One instrument: its OpenTelemetry name, kind, unit (UCUM) and what it measures."""

    name: str
    kind: Kind
    unit: str
    description: str
    attributes: tuple[str, ...] = ()
    """The attributes it carries beside ``volcano.orchestrator`` (and ``volcano.lock.key`` when allowed)."""


def _all(*instruments: Instrument) -> dict[str, Instrument]:
    return {i.name: i for i in instruments}


INSTRUMENTS: dict[str, Instrument] = _all(
    Instrument(
        "volcano.lock.wait.duration",
        "histogram",
        "s",
        "How long a wait for a lock took, from its first attempt to its end.",
        ("volcano.lock.outcome",),
    ),
    Instrument(
        "volcano.lock.hold.duration",
        "histogram",
        "s",
        "How long a lease was held, from its acquisition to how it ended.",
        ("volcano.lock.ending",),
    ),
    Instrument(
        "volcano.lock.waiters",
        "updown",
        "{waiter}",
        "Waiters waiting for a held lock now (past their first refusal).",
        ("volcano.lock.wait.mode",),
    ),
    Instrument("volcano.lock.leases", "updown", "{lease}", "Leases this process holds now."),
    Instrument(
        "volcano.lock.contentions", "counter", "{refusal}", "Acquisitions refused because the lock was held."
    ),
    Instrument(
        "volcano.lock.losses", "counter", "{loss}", "Leases lost while held.", ("volcano.lock.loss.reason",)
    ),
    Instrument(
        "volcano.lock.renewal.margin",
        "histogram",
        "s",
        "The lease left (before its local deadline) when a renewal succeeded: the early warning of a loss.",
    ),
    Instrument(
        "volcano.lock.handoff.duration",
        "histogram",
        "s",
        "From a release to the next acquisition of the same lock, both seen in this process.",
    ),
    Instrument(
        "volcano.lock.requests",
        "counter",
        "{request}",
        "Requests sent to the Volcano locks API, by operation and status (no_response: none came).",
        ("volcano.request.operation", "volcano.request.status"),
    ),
    Instrument(
        "volcano.lock.budget.used",
        "gauge",
        "1",
        "This process's requests this minute as a share of the project's 600 (per credential).",
    ),
    Instrument(
        "volcano.fence.refused",
        "counter",
        "{write}",
        "Stale writes a fenced store refused (the writer's fencing token was older).",
        ("volcano.fence.store",),
    ),
)
"""Every instrument, by name."""
