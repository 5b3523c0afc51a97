"""Is there an order of the operations, consistent with real time, that the lock model explains?

The search is Wing & Gong's, with Lowe's memo of (operations done, state) and two prunings that keep it
small on chaos histories of thousands of operations:

- **Per key** (P-compositionality): keys are independent objects, so each key's history is checked alone.
- **Per segment**: sorted by their start, the operations fall into segments wherever every operation so
  far ended before the next one started; nothing can be reordered across such a cut, so each segment is
  searched alone, from the set of states the previous one may have left (its *frontier*), and only that
  set is carried on.

Real time is the machine-wide monotonic clock (``time.monotonic()``: every process on the host reads the
same one, see ``events.py``). An operation the server answered is placed inside the window the server
stamped around its decision (``mono`` .. ``mono_end``); one it may have applied without anyone seeing
it (a *phantom*: the client got no answer, and a server process that had received it was killed before
logging a decision) may be placed anywhere from its receipt to that kill, or nowhere.
Unknown outcomes are thus never guessed: every way they may have gone is tried.

Each operation is replayed by :func:`model.step` at the server's own decision time; the verdict says how
many operations were checked, how many outcomes were unknown, and every segment no order could explain.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from .model import FREE, Observed, State, step

__all__ = ["NODE_BUDGET", "Op", "Verdict", "Violation", "check_ops"]

NODE_BUDGET = 200_000
"""Search nodes allowed per segment before the checker gives up on it (reported as ``undecided``)."""


@dataclass(frozen=True)
class Op:
    """One operation on one key, as the checker sees it."""

    id: int
    key: str
    kind: str
    token: str | None
    ttl: int | None
    start: float
    end: float
    now_us: int | None
    observed: Observed | None
    optional: bool = False
    """May never have taken effect (a phantom, or a 503 whose commit is uncertain)."""
    label: str = ""

    def describe(self) -> str:
        """A line for violation reports."""
        seen = "unknown" if self.observed is None else self.observed
        maybe = "optional " if self.optional else ""
        return (
            f"#{self.id} {self.kind} token={self.token} ttl={self.ttl} now_us={self.now_us} "
            f"mono=[{self.start:.3f}, {self.end:.3f}] {maybe}-> {seen} {self.label}"
        )


@dataclass(frozen=True)
class Violation:
    """A segment of one key's history that no order of its operations explains."""

    key: str
    ops: tuple[str, ...]
    frontier: tuple[str, ...]
    unchecked: int
    """Operations of the key after the violation, left unchecked."""

    def describe(self) -> str:
        """Several lines: the key, the states it could be in, the operations no order explains."""
        lines = [f"key {self.key}: no order explains these operations (from any of these states)"]
        lines += [f"  state: {s}" for s in self.frontier[:5]]
        lines += [f"  {o}" for o in self.ops[:20]]
        if len(self.ops) > 20:
            lines.append(f"  ... {len(self.ops) - 20} more")
        return "\n".join(lines)


@dataclass
class Verdict:
    """What the model check found over one or more histories."""

    keys: int = 0
    ops: int = 0
    optional: int = 0
    segments: int = 0
    max_segment: int = 0
    max_frontier: int = 0
    nodes: int = 0
    undecided: int = 0
    violations: list[Violation] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    """What the history loader counted (unknown outcomes, resolved by the server's log, phantoms...)."""

    @property
    def ok(self) -> bool:
        """No violation, and every segment decided."""
        return not self.violations and not self.undecided

    def __add__(self, other: Verdict) -> Verdict:
        """Sum two verdicts (e.g. the SQLite and the PostgreSQL run)."""
        counts = dict(self.counts)
        for name, n in other.counts.items():
            counts[name] = counts.get(name, 0) + n
        return Verdict(
            keys=self.keys + other.keys,
            ops=self.ops + other.ops,
            optional=self.optional + other.optional,
            segments=self.segments + other.segments,
            max_segment=max(self.max_segment, other.max_segment),
            max_frontier=max(self.max_frontier, other.max_frontier),
            nodes=self.nodes + other.nodes,
            undecided=self.undecided + other.undecided,
            violations=self.violations + other.violations,
            counts=counts,
        )

    def line(self) -> str:
        """The one-line summary the chaos run prints."""
        extra = " ".join(f"{k}={v}" for k, v in self.counts.items())
        return (
            f"model: keys={self.keys} ops_checked={self.ops} {extra}{' ' if extra else ''}"
            f"optional={self.optional} segments={self.segments} max_segment={self.max_segment} "
            f"max_frontier={self.max_frontier} undecided={self.undecided} violations={len(self.violations)}"
        )


def _segments(ops: list[Op]) -> Iterable[list[Op]]:
    """Cut the start-sorted operations wherever all before ended before the next began."""
    current: list[Op] = []
    horizon = -math.inf
    for op in ops:
        if current and op.start > horizon:
            yield current
            current = []
        current.append(op)
        horizon = max(horizon, op.end)
    if current:
        yield current


def _search(seg: list[Op], frontier: set[State], budget: int) -> tuple[set[State], int, bool]:
    """Every state the segment may end in, from any state of ``frontier``; (states, nodes, decided)."""
    n = len(seg)
    mandatory = 0
    for i, op in enumerate(seg):
        if not op.optional:
            mandatory |= 1 << i
    ends: set[State] = set()
    seen: set[tuple[int, State]] = set()
    stack: list[tuple[int, State]] = [(0, s) for s in frontier]
    nodes = 0
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        nodes += 1
        if nodes > budget:
            return ends, nodes, False
        done, state = node
        if done & mandatory == mandatory:
            ends.add(state)
        # An operation may come next only if no pending operation that must happen ended before it began;
        # an optional one only if nothing placed so far began after it had ended.
        first_end = min(
            (seg[j].end for j in range(n) if mandatory >> j & 1 and not done >> j & 1), default=math.inf
        )
        last_start = max((seg[j].start for j in range(n) if done >> j & 1), default=-math.inf)
        for i, op in enumerate(seg):
            if op.start > first_end:
                break  # sorted by start: none after can come next either
            if done >> i & 1 or (op.optional and op.end < last_start):
                continue
            for after in step(state, op.kind, op.token, op.ttl, op.now_us, op.observed):
                stack.append((done | 1 << i, after))
    return ends, nodes, True


def check_ops(ops: Iterable[Op], *, initial: State = FREE, budget: int = NODE_BUDGET) -> Verdict:
    """Check every key's operations against the model; each key starts in ``initial``."""
    by_key: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    verdict = Verdict(keys=len(by_key))
    for key, key_ops in sorted(by_key.items()):
        key_ops.sort(key=lambda o: (o.start, o.end, o.id))
        verdict.ops += sum(not o.optional for o in key_ops)
        verdict.optional += sum(o.optional for o in key_ops)
        frontier = {initial}
        checked = 0
        for seg in _segments(key_ops):
            verdict.segments += 1
            verdict.max_segment = max(verdict.max_segment, len(seg))
            ends, nodes, decided = _search(seg, frontier, budget)
            verdict.nodes += nodes
            checked += len(seg)
            if not decided:
                verdict.undecided += 1
                break
            if not ends:
                verdict.violations.append(
                    Violation(
                        key=key,
                        ops=tuple(o.describe() for o in seg),
                        frontier=tuple(s.describe() for s in sorted(frontier, key=repr)),
                        unchecked=len(key_ops) - checked,
                    )
                )
                break
            frontier = ends
            verdict.max_frontier = max(verdict.max_frontier, len(frontier))
    return verdict
