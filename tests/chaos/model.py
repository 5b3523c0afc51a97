"""The lock service as a model: one key's state, and what each operation may answer and leave behind.

This is the contract (``shared/volcano-locks-api.md``) written as a pure step function, for the
linearizability checker (``linearizability.py``) to replay every chaos history against.

State (:class:`State`): the holder (the ownership token's hash prefix, kept after expiry as the server
keeps its row), the last fencing token issued, and the holder's expiry in microseconds of the *server's*
clock. The expiry is an interval ``[lo, hi]``: exact when an answer told it, wide when a phantom operation
(one whose outcome nobody saw) may have set it; a comparison that falls inside the interval splits the
state in two, each side narrowing the interval to what it assumed. The 90-day absolute deadline is not
modelled: no chaos run comes near it (``tests/server/test_contract.py`` covers it).

Time: every answered operation is replayed at ``now_us``, the server clock reading its decision was made
at (the server's request history records it). The contract's rules are about that clock: a lease is held
while ``now < expires + 1 s`` (takeover grace), an owner's renew or re-acquire must come while
``now < expires - 1 s``. The model never assumes the clock moves forward or at any rate, so a clock
stepped back or run fast or slow is replayed as it was. Real time (which operation came first) is the
linearizability checker's business, on the machine-wide monotonic clock.

:func:`step` returns every state the operation may leave, given what was observed: an empty list means
the observed answer is impossible from that state (a violation, unless another order or state explains
it). Optional operations (unknown outcomes) have no observation to match: each way they may have gone is
returned, and the checker also tries them as never applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FREE", "GRACE_US", "RENEW_MARGIN_US", "State", "step"]

GRACE_US = 1_000_000
"""A lapsed lease blocks takeover for one more second."""
RENEW_MARGIN_US = 1_000_000
"""An owner's renew (or re-acquire) must arrive more than one second before the expiry."""
_US = 1_000_000
NEVER = 2**62
"""Stands for an unknown bound of an expiry interval."""


@dataclass(frozen=True, slots=True)
class State:
    """One key: who holds it (kept after expiry, as the server keeps its row), the last fencing token
    issued, and the holder's expiry interval on the server's clock (microseconds)."""

    holder: str | None
    fencing: int
    lo: int
    hi: int

    def describe(self) -> str:
        """A short text for violation reports."""
        if self.holder is None:
            return f"free (fencing {self.fencing})"
        exp = str(self.lo) if self.lo == self.hi else f"[{self.lo}, {self.hi}]"
        return f"holder {self.holder} fencing {self.fencing} expires_us {exp}"


FREE = State(None, 0, 0, 0)
"""A key never used."""


def _split(state: State, bound: int) -> tuple[State | None, State | None]:
    """Split on ``expires > bound``: (the state where it is, where it is not); None where impossible."""
    above = (
        State(state.holder, state.fencing, max(state.lo, bound + 1), state.hi) if state.hi > bound else None
    )
    below = State(state.holder, state.fencing, state.lo, min(state.hi, bound)) if state.lo <= bound else None
    return above, below


def _held(state: State, now: int) -> list[tuple[bool, State]]:
    """Whether the key blocks takeover at ``now``: (answer, the state narrowed to it), one or two."""
    if state.holder is None:
        return [(False, state)]
    held, free = _split(state, now - GRACE_US)  # held <=> now < expires + grace <=> expires > now - grace
    return [(answer, s) for answer, s in ((True, held), (False, free)) if s is not None]


def _early(state: State, now: int) -> list[tuple[bool, State]]:
    """Whether an owner's renew at ``now`` is in time (``now < expires - margin``), narrowed the same way."""
    early, late = _split(state, now + RENEW_MARGIN_US)
    return [(answer, s) for answer, s in ((True, early), (False, late)) if s is not None]


Observed = dict[str, Any]
"""What was answered: ``status``, ``code`` (409s), ``fencing`` and ``expires_us`` (grants, reads),
``held`` (reads). None for an operation whose outcome nobody saw. In the model's own answers an
``expires_us`` may be a ``(lo, hi)`` range (a read of an expiry known only as an interval)."""


def _answers(
    kind: str, token: str | None, ttl: int | None, now: int, state: State
) -> list[tuple[Observed, State]]:
    """Every (answer, next state) the contract allows for one operation decided at ``now``."""
    out: list[tuple[Observed, State]] = []
    for held, s in _held(state, now):
        if kind == "get":
            if held:  # the answer's expires_at pins an expiry the model knew only as an interval
                out.append(
                    ({"status": 200, "held": True, "fencing": s.fencing, "expires_us": (s.lo, s.hi)}, s)
                )
            else:
                out.append(({"status": 200, "held": False}, s))
        elif kind == "release":
            if not held:
                out.append(({"status": 204}, s))  # absent or past its grace: nothing to drop
            elif s.holder != token:
                out.append(({"status": 409, "code": "lock_ownership_lost"}, s))
            else:
                out.append(({"status": 204}, State(None, s.fencing, 0, 0)))
        elif kind in ("acquire", "renew"):
            assert ttl is not None
            expires = now + ttl * _US
            if not held:
                if kind == "acquire":
                    grant = State(token, s.fencing + 1, expires, expires)
                    out.append(({"status": 201, "fencing": s.fencing + 1, "expires_us": expires}, grant))
                else:
                    out.append(({"status": 409, "code": "lock_ownership_lost"}, s))
            elif s.holder != token:
                code = "lock_held" if kind == "acquire" else "lock_ownership_lost"
                out.append(({"status": 409, "code": code}, s))
            else:
                for early, e in _early(s, now):
                    if early:
                        status = 201 if kind == "acquire" else 200
                        kept = State(token, e.fencing, expires, expires)
                        out.append(({"status": status, "fencing": e.fencing, "expires_us": expires}, kept))
                    else:
                        out.append(({"status": 409, "code": "lock_ownership_lost"}, e))
        else:
            raise ValueError(f"unknown operation {kind!r}")
    return out


def _phantom(kind: str, token: str | None, state: State) -> list[State]:
    """The states an operation of unknown time and outcome may leave (besides never having happened)."""
    if kind == "acquire":
        granted = State(token, state.fencing + 1, -NEVER, NEVER)  # if the key was free by then
        if state.holder == token:
            return [State(token, state.fencing, -NEVER, NEVER), granted]  # kept (re-acquired) or anew
        return [granted]
    if kind == "renew":
        return [State(token, state.fencing, -NEVER, NEVER)] if state.holder == token else []
    if kind == "release":
        return [State(None, state.fencing, 0, 0)] if state.holder == token else []
    return []  # a read changes nothing


def _match(model: Observed, after: State, seen: Observed) -> State | None:
    """``after`` if the model's answer is what was seen (narrowed to a read's expiry), else None."""
    for name, value in model.items():
        if isinstance(value, tuple):  # a range: what was seen must fall inside it
            got = seen.get(name)
            if not isinstance(got, int) or not value[0] <= got <= value[1]:
                return None
            after = State(after.holder, after.fencing, got, got)
        elif seen.get(name) != value:
            return None
    return after


def step(
    state: State,
    kind: str,
    token: str | None,
    ttl: int | None,
    now: int | None,
    observed: Observed | None,
) -> list[State]:
    """Every state ``kind`` may leave from ``state``, given what was observed of it.

    Args:
        state: the key before the operation.
        kind: acquire, renew, release, get or force_release.
        token: the ownership token's hash prefix (acquire, renew, release).
        ttl: the requested TTL in seconds (acquire, renew).
        now: the server clock reading of the decision (microseconds), or None when unknown.
        observed: the answer (see :data:`Observed`), or None when nobody saw it.

    Returns:
        The possible next states; empty when the observed answer is impossible from ``state``.
    """
    if kind == "force_release":  # unconditional: the server does not even read its clock for it
        if observed is not None and observed != {"status": 204}:
            return []
        free = State(None, state.fencing, 0, 0)
        return [free]
    if now is None:
        if observed is not None:
            raise ValueError("an observed answer needs the time it was decided at")
        return _phantom(kind, token, state)
    nexts = []
    for model, after in _answers(kind, token, ttl, now, state):
        matched = after if observed is None else _match(model, after, observed)
        if matched is not None:
            nexts.append(matched)
    return nexts
