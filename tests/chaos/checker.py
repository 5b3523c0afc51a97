"""The checker: a pure function from the run's logs and the protected table to a report.

Definitions (all times are ``mono``: the machine-wide CLOCK_MONOTONIC, see ``events.py``):

- A critical section is one ``with_lock`` body: ``start`` to ``end`` in one worker's log. The holder
  *believes* it holds the lock from ``start`` until the first of: ``end``, the guard reporting loss
  (``lost``), the latest local deadline it knew of, or its process being killed.
- ``overlaps``: pairs of sections whose belief intervals intersect.
- ``stale_accepted``: accepted writes (table order, ``seq``) whose fencing token is lower than one already
  accepted.
- ``late_losses``: losses reported after the local deadline the guard held at that moment, plus sections
  whose body ran past the local deadline without the guard reporting loss. A holder that was SIGSTOPped
  across its deadline cannot report anything while frozen: its report counts as on time if it comes within
  ``STOP_GRACE`` seconds of SIGCONT.
- ``hangs``: workers that did not finish within the driver's bound after being asked to stop.
- ``handovers``: distinct fencing tokens among started sections, minus one.
- ``faults``: faults injected: server kill -9s, worker SIGKILLs and SIGSTOPs, plus the per-request faults
  (503s, drops, delays) the servers report having injected.
- ``writes``: accepted writes.
- ``cut_waiter_held``: sections a worker started while it was cut off from its server as a waiter (by a
  drop or a hold, one way or both: it cannot have seen a grant), counted per cut; must be 0.

Details (not in the one-line summary): takeover time after each SIGKILL of a holder (next section's start
minus the kill) against its bound ``ttl + 1 + poll``, the outcome of each SIGSTOP of a holder (did its
guard report loss, was its late write rejected by fencing), the clock faults, and each cut-off holder
(did its guard report loss; whether in time is ``late_losses``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .linearizability import Verdict

__all__ = ["STOP_GRACE", "Report", "Section", "StopOutcome", "Takeover", "check", "sections_from_events"]

STOP_GRACE = 2.0
"""Seconds after SIGCONT within which a resumed holder's loss report still counts as on time."""

Event = Mapping[str, Any]


@dataclass
class Section:
    """One critical section as reconstructed from a worker's log."""

    worker: str
    cs: int
    token: int
    ttl: int
    begin: float
    deadline: float
    end: float | None = None
    end_lost: bool = False
    end_deadline: float | None = None
    loss: float | None = None
    loss_deadline: float | None = None
    outcome: str | None = None
    killed: float | None = None

    def belief_end(self) -> float:
        """Return when this holder stopped believing it held the lock."""
        candidates = [self.deadline]
        for t in (self.end, self.loss, self.killed):
            if t is not None:
                candidates.append(t)
        return min(candidates)

    def open_at(self, t: float) -> bool:
        """Return whether the body was running at ``t``."""
        return self.begin <= t and (self.end is None or t < self.end)

    def reported_loss(self) -> bool:
        """Return whether the guard reported loss for this section."""
        return self.loss is not None or self.end_lost or self.outcome == "lost"


@dataclass(frozen=True)
class Takeover:
    """Time from SIGKILLing a holder to the next holder's start."""

    target: str
    seconds: float | None
    bound: float

    @property
    def slow(self) -> bool:
        """True when no one took over, or later than the bound."""
        return self.seconds is None or self.seconds > self.bound


@dataclass(frozen=True)
class StopOutcome:
    """What happened to a holder that was SIGSTOPped and continued."""

    target: str
    stopped_for: float
    hit_section: bool
    loss_reported: bool
    late_writes: int
    late_rejected: int
    late_fenceable: int
    """Late writes made after a newer token had been accepted (fencing must reject these)."""


@dataclass
class Report:
    """The checker's findings."""

    handovers: int = 0
    faults: int = 0
    writes: int = 0
    overlaps: int = 0
    stale_accepted: int = 0
    late_losses: int = 0
    hangs: int = 0
    crashes: int = 0
    sections: int = 0
    rejected: int = 0
    losses: int = 0
    errors: int = 0
    server_kills: int = 0
    clock_changes: int = 0
    holder_cuts: int = 0
    cut_loss_reported: int = 0
    waiter_cuts: int = 0
    cut_waiter_held: int = 0
    takeovers: list[Takeover] = field(default_factory=list)
    stops: list[StopOutcome] = field(default_factory=list)
    overlap_pairs: list[tuple[str, str]] = field(default_factory=list)
    adapters: dict[str, Report] = field(default_factory=dict)
    """The same run checked on each fenced adapter's own record of the writes (``adapter_stores.py``)."""
    model: Verdict | None = None
    """The model check of every lock call of the run (``linearizability.py``), when it was made."""
    mismatches: list[str] = field(default_factory=list)
    """Answers a client saw that the server's history does not hold (``history.load_ops``)."""
    unreadable: dict[str, str] = field(default_factory=dict)
    """Adapters whose own record of the writes could not be read back (e.g. a manifest whose data is gone)."""

    def line(self) -> str:
        """Return the one-line summary."""
        model = "" if self.model is None else f" model_violations={len(self.model.violations)}"
        return (
            f"chaos: handovers={self.handovers} faults={self.faults} writes={self.writes} "
            f"overlaps={self.overlaps} stale_accepted={self.stale_accepted} "
            f"late_losses={self.late_losses} hangs={self.hangs}{model}"
        )

    def model_line(self) -> str:
        """Return the model checker's verdict: operations checked, unknown outcomes, violations."""
        return "model: not checked" if self.model is None else self.model.line()

    def detail_line(self) -> str:
        """Return the details: takeovers after SIGKILL, SIGSTOP outcomes, crashes."""
        took = [t.seconds for t in self.takeovers if t.seconds is not None]
        bound = max((t.bound for t in self.takeovers), default=0.0)
        hit = [s for s in self.stops if s.hit_section]
        takeover_text = ",".join(f"{s:.2f}" for s in took) or "-"
        return (
            f"chaos-detail: sections={self.sections} losses={self.losses} op_errors={self.errors} "
            f"rejected_writes={self.rejected} "
            f"server_kills={self.server_kills} "
            f"holder_kills={len(self.takeovers)} takeover_s=[{takeover_text}] (bound {bound:.1f}) "
            f"slow_takeovers={sum(t.slow for t in self.takeovers)} "
            f"holder_stops={len(hit)} stop_loss_reported={sum(s.loss_reported for s in hit)} "
            f"late_writes={sum(s.late_writes for s in hit)} "
            f"late_fenceable={sum(s.late_fenceable for s in hit)} "
            f"late_rejected={sum(s.late_rejected for s in hit)} crashes={self.crashes} "
            f"clock_changes={self.clock_changes} holder_cuts={self.holder_cuts} "
            f"cut_loss_reported={self.cut_loss_reported} waiter_cuts={self.waiter_cuts} "
            f"cut_waiter_held={self.cut_waiter_held}"
        )

    def __add__(self, other: Report) -> Report:
        """Sum two reports (e.g. the SQLite and the PostgreSQL run)."""
        return Report(
            handovers=self.handovers + other.handovers,
            faults=self.faults + other.faults,
            writes=self.writes + other.writes,
            overlaps=self.overlaps + other.overlaps,
            stale_accepted=self.stale_accepted + other.stale_accepted,
            late_losses=self.late_losses + other.late_losses,
            hangs=self.hangs + other.hangs,
            crashes=self.crashes + other.crashes,
            sections=self.sections + other.sections,
            losses=self.losses + other.losses,
            errors=self.errors + other.errors,
            rejected=self.rejected + other.rejected,
            server_kills=self.server_kills + other.server_kills,
            clock_changes=self.clock_changes + other.clock_changes,
            holder_cuts=self.holder_cuts + other.holder_cuts,
            cut_loss_reported=self.cut_loss_reported + other.cut_loss_reported,
            waiter_cuts=self.waiter_cuts + other.waiter_cuts,
            cut_waiter_held=self.cut_waiter_held + other.cut_waiter_held,
            takeovers=self.takeovers + other.takeovers,
            stops=self.stops + other.stops,
            overlap_pairs=self.overlap_pairs + other.overlap_pairs,
            adapters={
                name: self.adapters.get(name, Report()) + other.adapters.get(name, Report())
                for name in {**self.adapters, **other.adapters}
            },
            model=other.model
            if self.model is None
            else self.model
            if other.model is None
            else self.model + other.model,
            mismatches=self.mismatches + other.mismatches,
            unreadable={**self.unreadable, **other.unreadable},
        )

    def adapter_line(self) -> str:
        """Return the write counts on each fenced adapter: what it accepted, refused, and any stale accept."""
        parts = []
        for name, r in sorted(self.adapters.items()):
            hit = [s for s in r.stops if s.hit_section]
            fenceable, rejected = sum(s.late_fenceable for s in hit), sum(s.late_rejected for s in hit)
            parts.append(
                f"{name}: writes={r.writes} rejected_writes={r.rejected} stale_accepted={r.stale_accepted} "
                f"late_fenceable={fenceable} late_rejected={rejected}"
            )
        parts += [f"{name}: UNREADABLE ({why})" for name, why in sorted(self.unreadable.items())]
        return "chaos-adapters: " + ("; ".join(parts) or "-")

    @property
    def ok(self) -> bool:
        """True when every promised zero is zero and no worker crashed."""
        stale = self.stale_accepted + sum(r.stale_accepted for r in self.adapters.values())
        model_wrong = self.model is not None and not self.model.ok
        return not (
            self.overlaps
            or stale
            or self.late_losses
            or self.hangs
            or self.crashes
            or model_wrong
            or self.mismatches
            or self.cut_waiter_held
            or self.unreadable
        )


def sections_from_events(events: Iterable[Event], faults: Iterable[Event] = ()) -> list[Section]:
    """Rebuild the critical sections from worker events (and the driver's kills), ordered by start."""
    by_key: dict[tuple[str, int], Section] = {}
    for e in sorted(events, key=lambda e: e["mono"]):
        kind = e["ev"]
        if kind not in ("start", "write", "lost", "end", "outcome") or e.get("cs") is None:
            continue
        key = (str(e["worker"]), int(e["cs"]))
        if kind == "start":
            by_key[key] = Section(
                worker=key[0],
                cs=key[1],
                token=int(e["token"]),
                ttl=int(e["ttl"]),
                begin=float(e["mono"]),
                deadline=float(e["deadline"]),
            )
            continue
        sec = by_key.get(key)
        if sec is None:
            continue
        if e.get("deadline") is not None:
            sec.deadline = max(sec.deadline, float(e["deadline"]))
        if kind == "lost" and sec.loss is None:
            sec.loss = float(e["mono"])
            sec.loss_deadline = float(e["deadline"]) if e.get("deadline") is not None else sec.deadline
        elif kind == "end":
            sec.end = float(e["mono"])
            sec.end_lost = bool(e.get("lost"))
            sec.end_deadline = float(e["deadline"]) if e.get("deadline") is not None else sec.deadline
        elif kind == "outcome":
            sec.outcome = str(e.get("result"))
    kills: dict[str, float] = {}
    for f in faults:
        if f["ev"] in ("worker_kill", "hang"):
            kills.setdefault(str(f["target"]), float(f["mono"]))
    for sec in by_key.values():
        if sec.end is None and sec.worker in kills and kills[sec.worker] >= sec.begin:
            sec.killed = kills[sec.worker]
    return sorted(by_key.values(), key=lambda s: s.begin)


def _stop_windows(faults: list[Event]) -> dict[str, list[tuple[float, float]]]:
    windows: dict[str, list[tuple[float, float]]] = {}
    pending: dict[str, float] = {}
    for f in faults:
        if f["ev"] == "worker_stop":
            pending[str(f["target"])] = float(f["mono"])
        elif f["ev"] == "worker_cont" and str(f["target"]) in pending:
            windows.setdefault(str(f["target"]), []).append((pending.pop(str(f["target"])), float(f["mono"])))
    for target, began in pending.items():  # stopped and never continued (killed): open-ended
        windows.setdefault(target, []).append((began, math.inf))
    return windows


def _cut_windows(faults: list[Event]) -> list[tuple[Event, float]]:
    """Each ``cut`` record with the time its ``heal`` came (infinity if it never did)."""
    out: list[tuple[Event, float]] = []
    for i, f in enumerate(faults):
        if f["ev"] == "cut":
            heal = next(
                (
                    float(h["mono"])
                    for h in faults[i + 1 :]
                    if h["ev"] == "heal" and h["target"] == f["target"]
                ),
                math.inf,
            )
            out.append((f, heal))
    return out


def _excused(
    sec: Section, deadline: float, reported: float, windows: dict[str, list[tuple[float, float]]]
) -> bool:
    """A frozen process cannot report: a deadline passed while stopped is excused if reported soon after."""
    for stop, cont in windows.get(sec.worker, []):
        if stop <= deadline <= cont + STOP_GRACE and reported <= cont + STOP_GRACE:
            return True
    return False


def check(
    events: Iterable[Event], writes: Iterable[Event], faults: Iterable[Event] = (), *, poll: float = 1.0
) -> Report:
    """Check a run: worker ``events``, the writes table rows, the driver's ``faults`` log.

    Args:
        events: worker log records (see ``events.py``).
        writes: rows of the writes table as dicts with ``seq``, ``token``, ``accepted``, ``worker``, ``cs``,
            ``late``.
        faults: the driver's records (kills, stops, hangs, crashes, injected-fault counts).
        poll: the waiters' poll interval, for the takeover bound ``ttl + 1 + poll``.

    Returns:
        The report; ``report.line()`` is the one-line summary.
    """
    events = list(events)
    faults = sorted(faults, key=lambda f: f["mono"])
    sections = sections_from_events(events, faults)
    rows = sorted(writes, key=lambda w: w["seq"])
    report = Report(sections=len(sections))

    # Overlaps: belief intervals that intersect, pairwise.
    for i, a in enumerate(sections):
        a_end = a.belief_end()
        for b in sections[i + 1 :]:
            if b.begin >= a_end:
                break  # sorted by begin: no later section can start inside a's interval
            if min(a_end, b.belief_end()) > b.begin:
                report.overlaps += 1
                report.overlap_pairs.append((f"{a.worker}#{a.cs}", f"{b.worker}#{b.cs}"))

    # Stale writes, in the order they took effect; remember what was fenceable when each write happened.
    highest = -1
    highest_before: dict[int, int] = {}
    for w in rows:
        highest_before[int(w["seq"])] = highest
        if w["accepted"]:
            report.writes += 1
            if int(w["token"]) < highest:
                report.stale_accepted += 1
            highest = max(highest, int(w["token"]))
        else:
            report.rejected += 1

    # Late losses.
    windows = _stop_windows(faults)
    for sec in sections:
        if sec.loss is not None:
            dl = sec.loss_deadline if sec.loss_deadline is not None else sec.deadline
            if sec.loss > dl and not _excused(sec, dl, sec.loss, windows):
                report.late_losses += 1
        elif sec.end is not None and not sec.end_lost:
            dl = sec.end_deadline if sec.end_deadline is not None else sec.deadline
            if sec.end > dl and not _excused(sec, dl, sec.end, windows):
                report.late_losses += 1

    # Losses the guards reported; lock calls that failed (acquisition or release) after any retry.
    report.losses = sum(s.reported_loss() for s in sections)
    report.errors = sum(1 for e in events if e["ev"] == "outcome" and e.get("result") == "error")

    # Handovers.
    report.handovers = max(0, len({s.token for s in sections}) - 1)

    # Faults, hangs, crashes.
    for f in faults:
        kind = f["ev"]
        if kind in ("server_kill", "worker_kill", "worker_stop", "clock", "cut"):
            report.faults += 1
        if kind == "clock":
            report.clock_changes += 1
        if kind == "server_kill":
            report.server_kills += 1
        elif kind == "server_injected":
            report.faults += int(f["count"])
        elif kind == "hang":
            report.hangs += 1
        elif kind == "crash":
            report.crashes += 1

    # Takeover after SIGKILL of a holder.
    for f in faults:
        if f["ev"] != "worker_kill":
            continue
        target, t = str(f["target"]), float(f["mono"])
        victim = next((s for s in sections if s.worker == target and s.open_at(t)), None)
        if victim is None:
            continue
        nxt = next((s for s in sections if s.begin > t and s is not victim), None)
        report.takeovers.append(
            Takeover(target, None if nxt is None else nxt.begin - t, victim.ttl + 1.0 + poll)
        )

    # Cuts: a cut-off holder must report its loss (in time: late_losses); a cut-off waiter must not hold.
    for cut, heal in _cut_windows(faults):
        target = str(cut["target"])
        if cut["role"] == "holder":
            victim = next((s for s in sections if s.worker == target and s.open_at(float(cut["mono"]))), None)
            if victim is not None:
                report.holder_cuts += 1
                report.cut_loss_reported += victim.reported_loss()
        elif "delay" not in (cut["up"], cut["down"]):  # a delay lets answers through, late
            report.waiter_cuts += 1
            report.cut_waiter_held += sum(
                1 for s in sections if s.worker == target and float(cut["mono"]) <= s.begin < heal
            )

    # SIGSTOP outcomes.
    for target, spans in windows.items():
        for stop, cont in spans:
            victim = next((s for s in sections if s.worker == target and s.open_at(stop)), None)
            if victim is None:
                report.stops.append(StopOutcome(target, cont - stop, False, False, 0, 0, 0))
                continue
            late = [w for w in rows if w["worker"] == target and int(w["cs"]) == victim.cs and w["late"]]
            fenceable = [w for w in late if highest_before[int(w["seq"])] > int(w["token"])]
            report.stops.append(
                StopOutcome(
                    target=target,
                    stopped_for=cont - stop,
                    hit_section=True,
                    loss_reported=victim.reported_loss(),
                    late_writes=len(late),
                    late_rejected=sum(not w["accepted"] for w in late),
                    late_fenceable=len(fenceable),
                )
            )
    return report
