"""The fault schedule: a pure plan of timed actions, repeated in cycles to fill the run.

One cycle (TTL 5 s, poll 1 s: about 40 s) attacks from every side in turn:

1. server faults on (a rotating spec: 503s, dropped connections incl. uncertain acquisitions, short delays);
2. SIGSTOP the current holder for longer than TTL + 1 s + poll, so others take over, then SIGCONT: its
   next write is late and must be rejected by fencing, and its guard must report loss;
3. while it is frozen, kill -9 a server and restart it on the same database (with two servers, the one
   not killed keeps serving its workers);
4. SIGKILL the current holder with server faults paused, wait for the takeover (so the measured time is
   the lock's, not the faults'), then faults back on and a fresh worker joins;
5. latency spikes up to and past the renewal window (and past the TTL) for renewals, then a stall in
   which every renewal is delayed past the TTL: every holder then must report its loss in time;
6. clocks and partitions (from the spikes on, about 23 s): the servers' clocks step back 1.5 s, then run
   15 % fast until the step is made up, step forward 0.8 s and run 16 % slow until that is made up;
   after the stall the current holder is cut off from its server for TTL + 2 s (one way or both, dropped
   or held: rotating), then a waiter (held, dropped or delayed). A cut-off holder must report its loss
   before its local deadline and no one else may hold before then; a cut-off waiter must not hold.

Clock faults stay inside what the contract can absorb (``docs/chaos.md``, "What the contract promises when
the server's clock moves"): the servers' clocks never gain more than :data:`CLOCK_GAIN` seconds on real
time within one TTL, less than the takeover grace (1 s). Steps back and slow clocks are unbounded for
safety (they cost liveness only); the plan keeps the offset near zero so that the run keeps moving.

The plan is data so it can be tested without running anything; ``run.py`` executes it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BASE_SPECS", "CLOCK_GAIN", "HOLDER_CUTS", "MAX_DELAY", "SPECS", "WAITER_CUTS", "Action", "plan"]

SPECS: dict[str, str] = {
    "mixed": (
        "status=503:rate=0.08,drop:rate=0.04,drop:rate=0.1:op=acquire:when=after,delay=0.05-0.4:rate=0.15"
    ),
    "after": (
        "status=503:rate=0.08:when=after,drop:rate=0.06:op=renew|release:when=after,delay=0.1-0.6:rate=0.1"
    ),
    "spikes": "delay=0.5-3:rate=0.1,delay=4-8:rate=0.15:op=renew,status=503:rate=0.05",
    "stall": "delay=4-8:op=renew",
}
"""Server fault specs (``--faults`` syntax), named for the report."""

BASE_SPECS = ("mixed", "after")
"""The specs a cycle runs under between its special phases: short delays only (see MAX_DELAY)."""

MAX_DELAY = 8.0
"""The longest delay any spec injects (seconds)."""

CLOCK_GAIN = 0.8
"""The most the servers' clocks gain on real time within any one TTL (seconds): below the 1 s grace."""

HOLDER_CUTS: tuple[tuple[str, str], ...] = (
    ("drop", "drop"),
    ("drop", "pass"),
    ("pass", "drop"),
    ("hold", "hold"),
)
"""How the current holder is cut off, one per cycle in turn: (client to server, server to client)."""

WAITER_CUTS: tuple[tuple[str, str], ...] = (
    ("hold", "hold"),
    ("pass", "drop"),
    ("drop", "drop"),
    ("delay", "delay"),
)
"""How a waiter is cut off, one per cycle in turn (``delay``: every chunk 2 s late)."""

PROXY_DELAY = 2.0
"""Seconds each chunk is held back in a ``delay`` cut."""


@dataclass(frozen=True)
class Action:
    """One step: run ``kind`` at ``at`` seconds after the start (or as soon after as the previous allows)."""

    at: float
    kind: str
    params: dict[str, Any] = field(default_factory=dict)


def plan(
    seconds: float, *, ttl: int, poll: float, servers: int, seed: int = 0, first_cycle: int = 0
) -> list[Action]:
    """Plan the faults for a run of ``seconds``; every cycle that starts before the end is planned whole.

    Args:
        seconds: how long the workers contend (the run's chaos duration).
        ttl: the lease TTL the workers use.
        poll: the waiters' poll interval.
        servers: how many server processes serve the run (kill -9s rotate over them).
        seed: makes the rotation and timings reproducible.
        first_cycle: where the rotations (specs, cuts) start; the chaos run gives each backend its own.

    Returns:
        Actions in time order. Kinds: ``faults`` (``spec``, ``name``), ``worker_kill``, ``await_takeover``
        (``timeout``), ``spawn_worker``, ``worker_stop`` (``duration``), ``server_kill`` (``server``,
        ``downtime``), ``clock`` (``jump`` seconds or ``rate``), ``cut`` (``target``: holder or waiter,
        ``up``, ``down``, ``delay``, ``duration``).
    """
    if seconds <= 0 or ttl < 5 or poll <= 0 or servers < 1:
        raise ValueError("seconds, poll must be > 0, ttl >= 5, servers >= 1")
    rng = random.Random(seed)
    names = list(BASE_SPECS)
    takeover_bound = ttl + 1.0 + poll
    actions: list[Action] = []
    t = 1.0
    cycle = first_cycle
    while t < seconds:
        name = names[cycle % len(names)]
        base = {"spec": SPECS[name], "name": name}
        actions.append(Action(t, "faults", base))
        t += 1.5 + rng.uniform(0, 1.0)
        stop_for = ttl + 1.0 + poll + 1.5 + rng.uniform(0, 1.0)
        actions.append(Action(t, "worker_stop", {"duration": stop_for}))
        actions.append(
            Action(t + 1.5, "server_kill", {"server": cycle % servers, "downtime": rng.uniform(0.3, 1.5)})
        )
        # The holder SIGKILL comes after the freeze, more than MAX_DELAY after the last long-delay faults
        # (previous cycle's spikes and stall): a renewal still held up in the server could otherwise extend
        # the killed holder's lease and the takeover would measure the fault, not the lock.
        t += stop_for + 0.5
        actions.append(Action(t, "faults", {"spec": "", "name": "quiet"}))
        actions.append(Action(t, "worker_kill"))
        actions.append(Action(t, "await_takeover", {"timeout": takeover_bound + 4.0}))
        actions.append(Action(t, "spawn_worker"))
        actions.append(Action(t, "faults", base))
        t += takeover_bound + 1.0
        clocks_from = t
        actions.append(Action(t, "faults", {"spec": SPECS["spikes"], "name": "spikes"}))
        t += 2.0 + rng.uniform(0, 1.0)
        # Every renewal stalls past the TTL: each holder must report loss before its local deadline.
        actions.append(Action(t, "faults", {"spec": SPECS["stall"], "name": "stall"}))
        t += ttl + 3.0
        t = _cuts(actions, t, ttl, cycle, base)
        t = max(t, _clocks(actions, clocks_from, ttl))
        cycle += 1
    actions.append(Action(max(t, seconds), "faults", {"spec": "", "name": "quiet"}))
    actions.sort(key=lambda a: a.at)  # stable: actions planned for the same moment keep their order
    return actions


def _cuts(actions: list[Action], t: float, ttl: int, cycle: int, base: dict[str, Any]) -> float:
    """Phase 6's cuts: the current holder for TTL + 2 s, then a waiter for 4 s; return when they end."""
    actions.append(Action(t, "faults", base))
    up, down = HOLDER_CUTS[cycle % len(HOLDER_CUTS)]
    holder = {"target": "holder", "up": up, "down": down, "delay": 0.0, "duration": ttl + 2.0}
    actions.append(Action(t, "cut", holder))
    t += ttl + 2.5
    up, down = WAITER_CUTS[cycle % len(WAITER_CUTS)]
    waiter = {"target": "waiter", "up": up, "down": down, "delay": PROXY_DELAY, "duration": 4.0}
    actions.append(Action(t, "cut", waiter))
    return t + 4.5


def _clocks(actions: list[Action], t: float, ttl: int) -> float:
    """Phase 6's clock faults, from ``t`` (the spikes): back 1.5 s, fast until made up, a step forward of
    CLOCK_GAIN more than a TTL later, slow until made up; return when the clock is back on real time."""
    actions.append(Action(t, "clock", {"jump": -1.5}))  # back: leases last longer, our deadlines shorten
    fast = 1.15  # makes the 1.5 s up in 10 s, gaining 0.75 s (< CLOCK_GAIN) in any TTL
    actions.append(Action(t + 0.5, "clock", {"rate": fast}))
    t += 0.5 + 1.5 / (fast - 1.0)
    actions.append(Action(t, "clock", {"rate": 1.0}))
    t += ttl + 1.0  # a step forward once the fast stretch is more than a TTL behind
    actions.append(Action(t, "clock", {"jump": CLOCK_GAIN}))
    slow = 1.0 - CLOCK_GAIN / ttl
    actions.append(Action(t + 0.5, "clock", {"rate": slow}))
    t += 0.5 + ttl
    actions.append(Action(t, "clock", {"rate": 1.0}))
    return t + 0.5
