"""The fault schedule: a pure plan of timed actions, repeated in cycles to fill the run.

One cycle (TTL 5 s, poll 1 s: about 30 s) attacks from every side in turn:

1. server faults on (a rotating spec: 503s, dropped connections incl. uncertain acquisitions, short delays);
2. SIGSTOP the current holder for longer than TTL + 1 s + poll, so others take over, then SIGCONT: its
   next write is late and must be rejected by fencing, and its guard must report loss;
3. while it is frozen, kill -9 a server and restart it on the same database (with two servers, the one
   not killed keeps serving its workers);
4. SIGKILL the current holder with server faults paused, wait for the takeover (so the measured time is
   the lock's, not the faults'), then faults back on and a fresh worker joins;
5. latency spikes up to and past the renewal window (and past the TTL) for renewals, then a stall in
   which every renewal is delayed past the TTL: every holder then must report its loss in time.

The plan is data so it can be tested without running anything; ``run.py`` executes it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BASE_SPECS", "MAX_DELAY", "SPECS", "Action", "plan"]

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


@dataclass(frozen=True)
class Action:
    """One step: run ``kind`` at ``at`` seconds after the start (or as soon after as the previous allows)."""

    at: float
    kind: str
    params: dict[str, Any] = field(default_factory=dict)


def plan(seconds: float, *, ttl: int, poll: float, servers: int, seed: int = 0) -> list[Action]:
    """Plan the faults for a run of ``seconds``; every cycle that starts before the end is planned whole.

    Args:
        seconds: how long the workers contend (the run's chaos duration).
        ttl: the lease TTL the workers use.
        poll: the waiters' poll interval.
        servers: how many server processes serve the run (kill -9s rotate over them).
        seed: makes the rotation and timings reproducible.

    Returns:
        Actions in time order. Kinds: ``faults`` (``spec``, ``name``), ``worker_kill``, ``await_takeover``
        (``timeout``), ``spawn_worker``, ``worker_stop`` (``duration``), ``server_kill`` (``server``,
        ``downtime``).
    """
    if seconds <= 0 or ttl < 5 or poll <= 0 or servers < 1:
        raise ValueError("seconds, poll must be > 0, ttl >= 5, servers >= 1")
    rng = random.Random(seed)
    names = list(BASE_SPECS)
    takeover_bound = ttl + 1.0 + poll
    actions: list[Action] = []
    t = 1.0
    cycle = 0
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
        actions.append(Action(t, "faults", {"spec": SPECS["spikes"], "name": "spikes"}))
        t += 2.0 + rng.uniform(0, 1.0)
        # Every renewal stalls past the TTL: each holder must report loss before its local deadline.
        actions.append(Action(t, "faults", {"spec": SPECS["stall"], "name": "stall"}))
        t += ttl + 3.0
        cycle += 1
    actions.append(Action(max(t, seconds), "faults", {"spec": "", "name": "quiet"}))
    return actions
