"""Fault injection for reliability tests: injected statuses, delays and dropped connections.

Spec: comma-separated rules, each an action then `:`-separated options::

    status=503[:rate=R][:count=N][:op=OPS][:when=before|after]
    delay=A-B[:rate=R][:count=N][:op=OPS][:when=before|after]      (seconds; `delay=0.5` means 0.5-0.5)
    drop[:rate=R][:count=N][:op=OPS][:when=before|after]
    grant_held[:rate=R][:count=N]                                   (a deliberate bug; acquire only)

`rate` is the probability a matching request triggers the rule (default 1), `count` caps how often it
fires (default unlimited), `op` is one or more of acquire, renew, release, get, force_release joined by
`|` (default all), `when=before` (default) acts before the request is processed (no state change),
`when=after` after it was processed: `status`/`drop` then hide a state change that happened (an
uncertain acquisition). `drop` closes the connection without any response. Rules are tried in order:
every triggered delay applies, and the first triggered status or drop ends the request.

`grant_held` makes the server wrong on purpose: an acquire it fires on is decided as if no live lease
held the key, so a held lock is granted a second time (with the next fencing token). It exists to prove
that the chaos suite's model checker catches a server that breaks the contract; nothing else uses it.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

__all__ = ["OPS", "FaultAction", "FaultInjector", "FaultRule", "parse_faults"]

OPS = frozenset({"acquire", "renew", "release", "get", "force_release"})


@dataclass
class FaultRule:
    """One parsed rule; `remaining` counts down when `count` was given."""

    kind: str  # "status", "delay", "drop" or "grant_held"
    status: int = 0
    delay: tuple[float, float] = (0.0, 0.0)
    rate: float = 1.0
    remaining: int | None = None
    ops: frozenset[str] = OPS
    when: str = "before"
    text: str = ""


@dataclass(frozen=True, slots=True)
class FaultAction:
    """What the server must do for one phase of one request."""

    delay: float = 0.0
    status: int | None = None
    drop: bool = False
    grant_held: bool = False
    fired: tuple[str, ...] = field(default_factory=tuple)


def _number(text: str, what: str, rule: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"fault rule {rule!r}: {what} {text!r} is not a number") from None
    if value < 0 or value != value:
        raise ValueError(f"fault rule {rule!r}: {what} must be >= 0")
    return value


def _parse_rule(text: str) -> FaultRule:
    action, *options = [p.strip() for p in text.split(":")]
    name, _, arg = action.partition("=")
    if name == "status":
        try:
            status = int(arg)
        except ValueError:
            raise ValueError(f"fault rule {text!r}: status must be an integer HTTP status") from None
        if not 400 <= status <= 599:
            raise ValueError(f"fault rule {text!r}: status must be 400-599")
        rule = FaultRule("status", status=status)
    elif name == "delay":
        low, sep, high = arg.partition("-")
        lo = _number(low, "delay", text)
        hi = _number(high, "delay", text) if sep else lo
        if hi < lo:
            raise ValueError(f"fault rule {text!r}: delay range {arg!r} is reversed")
        rule = FaultRule("delay", delay=(lo, hi))
    elif name == "drop" and not arg:
        rule = FaultRule("drop")
    elif name == "grant_held" and not arg:
        rule = FaultRule("grant_held", ops=frozenset({"acquire"}))
    else:
        raise ValueError(f"fault rule {text!r}: start with status=CODE, delay=A-B, drop or grant_held")
    rule.text = text
    for option in options:
        key, _, value = option.partition("=")
        if key == "rate":
            rule.rate = _number(value, "rate", text)
            if rule.rate > 1:
                raise ValueError(f"fault rule {text!r}: rate must be within 0..1")
        elif key == "count":
            if not value.isdigit():
                raise ValueError(f"fault rule {text!r}: count must be a whole number")
            rule.remaining = int(value)
        elif key == "op":
            ops = frozenset(value.split("|"))
            if not ops or not ops <= OPS:
                raise ValueError(f"fault rule {text!r}: op must be among {', '.join(sorted(OPS))}")
            rule.ops = ops
        elif key == "when":
            if value not in ("before", "after"):
                raise ValueError(f"fault rule {text!r}: when must be before or after")
            rule.when = value
        else:
            raise ValueError(f"fault rule {text!r}: unknown option {option!r}")
    if rule.kind == "grant_held" and (rule.ops != {"acquire"} or rule.when != "before"):
        raise ValueError(f"fault rule {text!r}: grant_held applies to acquire, before it is decided")
    return rule


def parse_faults(spec: str | None) -> list[FaultRule]:
    """Parse a fault spec into rules; raise ValueError naming the bad rule."""
    if not spec or not spec.strip():
        return []
    return [_parse_rule(part.strip()) for part in spec.split(",") if part.strip()]


class FaultInjector:
    """Decide, per request and phase, which faults fire (thread-safe; rules replaceable at runtime)."""

    def __init__(self, spec: str | None = None, rng: random.Random | None = None) -> None:
        """Start with the rules of `spec` (None or empty: no faults)."""
        self._lock = threading.Lock()
        self._rng = rng or random.Random()
        self._spec = ""
        self._rules: list[FaultRule] = []
        self.set(spec)

    @property
    def spec(self) -> str:
        """The spec string currently in force."""
        with self._lock:
            return self._spec

    def set(self, spec: str | None) -> None:
        """Replace every rule (counts start afresh); raise ValueError and keep the old rules on a bad spec."""
        rules = parse_faults(spec)
        with self._lock:
            self._rules = rules
            self._spec = (spec or "").strip()

    def enabled(self) -> bool:
        """Whether any rule is configured."""
        with self._lock:
            return bool(self._rules)

    def decide(self, op: str, when: str) -> FaultAction:
        """Roll the dice for `op` in phase `when` and return the combined action."""
        delay = 0.0
        grant_held = False
        fired: list[str] = []
        with self._lock:
            for rule in self._rules:
                if rule.when != when or op not in rule.ops:
                    continue
                if rule.remaining is not None and rule.remaining <= 0:
                    continue
                if rule.rate < 1 and self._rng.random() >= rule.rate:
                    continue
                if rule.remaining is not None:
                    rule.remaining -= 1
                fired.append(rule.text)
                if rule.kind == "delay":
                    lo, hi = rule.delay
                    delay += self._rng.uniform(lo, hi)
                elif rule.kind == "grant_held":
                    grant_held = True
                elif rule.kind == "status":
                    return FaultAction(delay=delay, status=rule.status, fired=tuple(fired))
                else:
                    return FaultAction(delay=delay, drop=True, fired=tuple(fired))
        return FaultAction(delay=delay, grant_held=grant_held, fired=tuple(fired))
