"""The lock model and the linearizability checker, on histories written by hand: what they must accept
(reorderings real time allows, unknown outcomes either way, a server clock that steps back) and what they
must refuse (a held lock granted twice, a fencing token reused after a restart, a late renewal accepted, a
read that lies, an order real time forbids)."""

from __future__ import annotations

from typing import Any

import pytest

from .linearizability import Op, check_ops
from .model import FREE, State, step

S = 1_000_000  # microseconds in a second
T0 = 1_800_000_000 * S


class History:
    """Operations on one key, each with its monotonic window and the server's decision time."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def add(
        self,
        kind: str,
        token: str | None,
        start: float,
        end: float,
        now: float | None,
        seen: dict[str, Any] | None,
        *,
        ttl: int | None = None,
        optional: bool = False,
    ) -> History:
        if kind in ("acquire", "renew") and ttl is None:
            ttl = 5
        self.ops.append(
            Op(
                id=len(self.ops),
                key="k",
                kind=kind,
                token=token,
                ttl=ttl,
                start=start,
                end=end,
                now_us=None if now is None else T0 + round(now * S),
                observed=seen,
                optional=optional,
            )
        )
        return self

    def check(self) -> int:
        verdict = check_ops(self.ops)
        assert not verdict.undecided
        return len(verdict.violations)


def granted(fencing: int, now: float, ttl: int = 5) -> dict[str, Any]:
    return {"status": 201, "fencing": fencing, "expires_us": T0 + round((now + ttl) * S)}


def renewed(fencing: int, now: float, ttl: int = 5) -> dict[str, Any]:
    return {"status": 200, "fencing": fencing, "expires_us": T0 + round((now + ttl) * S)}


HELD = {"status": 409, "code": "lock_held"}
LOST = {"status": 409, "code": "lock_ownership_lost"}
DONE = {"status": 204}
FREE_READ = {"status": 200, "held": False}


def test_a_plain_life_of_a_lock_is_explained() -> None:
    h = History()
    h.add("acquire", "a", 0, 0.1, 0.05, granted(1, 0.05))
    h.add("acquire", "b", 0.2, 0.3, 0.25, HELD)
    h.add(
        "get", None, 0.4, 0.5, 0.45, {"status": 200, "held": True, "fencing": 1, "expires_us": T0 + 5_050_000}
    )
    h.add("renew", "a", 1.0, 1.1, 1.05, renewed(1, 1.05))
    h.add("release", "a", 2.0, 2.1, 2.05, DONE)
    h.add("get", None, 2.2, 2.3, 2.25, FREE_READ)
    h.add("acquire", "b", 2.4, 2.5, 2.45, granted(2, 2.45))
    h.add("release", "a", 2.6, 2.7, 2.65, LOST)  # a stale token cannot release the newer lease
    assert h.check() == 0


def test_a_held_lock_granted_twice_is_a_violation() -> None:
    h = History()
    h.add("acquire", "a", 0, 0.1, 0.05, granted(1, 0.05))
    h.add("acquire", "b", 1.0, 1.1, 1.05, granted(2, 1.05))  # a's lease runs to 5.05 (+1 s grace)
    assert h.check() == 1


def test_a_fencing_token_handed_out_again_after_a_restart_is_a_violation() -> None:
    h = History()
    h.add("acquire", "a", 0, 0.1, 0.05, granted(1, 0.05))
    h.add("release", "a", 0.2, 0.3, 0.25, DONE)
    # the server was killed and restarted here, having forgotten the grant
    h.add("acquire", "b", 2.0, 2.1, 2.05, granted(1, 2.05))
    assert h.check() == 1


def test_a_grant_lost_by_a_restart_is_a_violation() -> None:
    h = History()
    h.add("acquire", "a", 0, 0.1, 0.05, granted(1, 0.05))
    h.add("get", None, 2.0, 2.1, 2.05, FREE_READ)  # after a restart, inside a's lease
    assert h.check() == 1


def test_renewal_accepted_inside_the_last_second_is_a_violation() -> None:
    ok = (
        History()
        .add("acquire", "a", 0, 0.1, 0.0, granted(1, 0.0))
        .add("renew", "a", 3.9, 4.0, 3.99, renewed(1, 3.99))
    )
    assert ok.check() == 0
    late = (
        History()
        .add("acquire", "a", 0, 0.1, 0.0, granted(1, 0.0))
        .add("renew", "a", 4.0, 4.1, 4.0, renewed(1, 4.0))
    )
    assert late.check() == 1
    refused = (
        History().add("acquire", "a", 0, 0.1, 0.0, granted(1, 0.0)).add("renew", "a", 4.0, 4.1, 4.0, LOST)
    )
    assert refused.check() == 0


def test_takeover_waits_the_grace_second() -> None:
    early = (
        History()
        .add("acquire", "a", 0, 0.1, 0.0, granted(1, 0.0))
        .add("acquire", "b", 5.5, 5.6, 5.5, granted(2, 5.5))
    )
    assert early.check() == 1
    held = History().add("acquire", "a", 0, 0.1, 0.0, granted(1, 0.0)).add("get", None, 5.5, 5.6, 5.5, {
        "status": 200, "held": True, "fencing": 1, "expires_us": T0 + 5 * S})  # fmt: skip
    assert held.check() == 0
    after = (
        History()
        .add("acquire", "a", 0, 0.1, 0.0, granted(1, 0.0))
        .add("acquire", "b", 6.0, 6.1, 6.0, granted(2, 6.0))
    )
    assert after.check() == 0


def test_real_time_order_is_kept() -> None:
    # The read began after the grant had answered: it cannot be placed before it.
    h = History().add("acquire", "a", 0, 1, 0.5, granted(1, 0.5)).add("get", None, 2, 3, 0.6, FREE_READ)
    assert h.check() == 1


def test_overlapping_operations_may_take_effect_in_either_order() -> None:
    h = History()
    h.add("acquire", "a", 0, 0.1, 0.05, granted(1, 0.05))
    h.add("release", "a", 1.0, 3.0, 1.5, DONE)  # answered late
    h.add("acquire", "b", 1.2, 1.4, 1.6, granted(2, 1.6))  # took effect after the release did
    assert h.check() == 0


def test_a_server_clock_stepped_back_is_replayed_as_it_was() -> None:
    h = History()
    h.add("acquire", "a", 0, 0.1, 100.0, granted(1, 100.0))
    h.add("acquire", "b", 1.0, 1.1, 90.0, HELD)  # the clock went back 10 s: a holds all the longer
    h.add("renew", "a", 2.0, 2.1, 91.0, renewed(1, 91.0))  # shortens the lease to 96 (absolute, not added)
    h.add("acquire", "b", 3.0, 3.1, 97.5, granted(2, 97.5))
    assert h.check() == 0


def test_a_phantom_acquisition_explains_a_gap_in_the_fencing_tokens() -> None:
    def run(with_phantom: bool) -> int:
        h = History()
        h.add("acquire", "a", 0, 0.1, 0.0, granted(1, 0.0))
        h.add("release", "a", 0.2, 0.3, 0.2, DONE)
        if with_phantom:  # b got no answer and the server that had it was killed at 1.0
            h.add("acquire", "b", 0.4, 1.0, None, None, optional=True)
        h.add("acquire", "c", 10.0, 10.1, 10.0, granted(3, 10.0))
        return h.check()

    assert run(with_phantom=True) == 0
    assert run(with_phantom=False) == 1


def test_a_phantom_may_also_never_have_happened() -> None:
    h = History()
    h.add("acquire", "a", 0, 0.1, 0.0, granted(1, 0.0))
    h.add("release", "a", 0.2, 5.0, None, None, optional=True)
    h.add("renew", "a", 5.5, 5.6, 1.6, renewed(1, 1.6))  # only if the release never happened
    assert h.check() == 0


def test_a_phantom_cannot_land_after_its_window() -> None:
    h = History()
    h.add("acquire", "a", 0, 0.1, 0.0, granted(1, 0.0))
    h.add("release", "a", 0.2, 0.5, None, None, optional=True)  # its server died at 0.5
    h.add("renew", "a", 1.0, 1.1, 1.0, renewed(1, 1.0))
    h.add("get", None, 2.0, 2.1, 2.0, FREE_READ)  # would need the release after the renewal: too late
    assert h.check() == 1


def test_a_store_failure_may_or_may_not_have_committed() -> None:
    for then in (renewed(1, 1.0), LOST):
        h = History()
        h.add("acquire", "a", 0, 0.1, 0.0, granted(1, 0.0))
        h.add("release", "a", 0.2, 0.3, 0.25, None, optional=True)  # 503 unavailable from the store
        h.add("renew", "a", 1.0, 1.1, 1.0, then)
        assert h.check() == 0


def test_force_release_ends_any_lease_and_keeps_the_sequence() -> None:
    h = History()
    h.add("acquire", "a", 0, 0.1, 0.0, granted(1, 0.0))
    h.add("force_release", None, 0.2, 0.3, None, DONE)
    h.add("renew", "a", 0.4, 0.5, 0.4, LOST)
    h.add("acquire", "b", 0.6, 0.7, 0.6, granted(2, 0.6))
    assert h.check() == 0


@pytest.mark.parametrize(
    ("seen", "ok"),
    [
        ({"status": 200, "held": True, "fencing": 1, "expires_us": 7}, True),  # pins the interval
        ({"status": 200, "held": True, "fencing": 2, "expires_us": 7}, False),
        ({"status": 200, "held": False}, True),  # a phantom's lease may have lapsed by now
    ],
)
def test_a_read_narrows_an_expiry_known_only_as_an_interval(seen: dict[str, Any], ok: bool) -> None:
    phantom = step(FREE, "acquire", "a", 5, None, None)
    assert phantom == [State("a", 1, -(2**62), 2**62)]
    assert bool(step(phantom[0], "get", None, None, 0, seen)) is ok


def test_segments_keep_long_histories_small() -> None:
    h = History()
    t = 0.0
    for i in range(2000):  # a holder renewing for an hour, every renewal one segment of one operation
        if i == 0:
            h.add("acquire", "a", t, t + 0.01, t, granted(1, t, ttl=5))
        else:
            h.add("renew", "a", t, t + 0.01, t, renewed(1, t, ttl=5))
        t += 1.7
    verdict = check_ops(h.ops)
    assert verdict.ok and verdict.segments == 2000 and verdict.max_frontier == 1 and verdict.ops == 2000
