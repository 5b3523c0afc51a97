"""The lease oracle on synthetic server logs: it claims a loss only when the server's log proves one."""

from __future__ import annotations

from typing import Any

from .oracle import lease_verdicts

KEY = "k1"
LEASE = "/locks/k1/lease"


def e(
    t: float, op: str, status: int | None, token: str | None = "aa", *, fault: str | None = None
) -> dict[str, Any]:
    path = "/locks/k1" if op in ("get", "force_release") else LEASE
    return {
        "time": t,
        "path": path,
        "op": op,
        "status": status,
        "token_sha256": token,
        "fault": fault,
        "seq": t,
    }


def test_a_lease_renewed_in_time_and_released_is_not_lost() -> None:
    log = [
        e(0, "acquire", 201),
        e(1.7, "renew", 200),
        e(3.4, "renew", 503),
        e(3.6, "renew", 200),
        e(6, "release", 204),
    ]
    [v] = lease_verdicts(log, KEY, 5).values()
    assert not v.lost and v.released_at == 6


def test_a_409_on_renew_after_holding_is_a_loss_but_contention_before_is_not() -> None:
    log = [e(0, "acquire", 409), e(1, "acquire", 201), e(2.5, "renew", 409), e(3, "release", 204)]
    [v] = lease_verdicts(log, KEY, 5).values()
    assert v.lost and "409" in v.reasons[0]
    [w] = lease_verdicts([e(0, "acquire", 409), e(1, "acquire", 201), e(2, "release", 204)], KEY, 5).values()
    assert not w.lost


def test_force_release_while_held_is_a_loss_for_the_holder_only() -> None:
    log = [
        e(0, "acquire", 201, "aa"),
        e(0.5, "acquire", 201, "bb"),
        e(0.6, "release", 204, "bb"),
        e(1, "force_release", 204, None),
        e(2, "release", 204, "aa"),
    ]
    verdicts = lease_verdicts(log, KEY, 5)
    assert verdicts["aa"].lost and not verdicts["bb"].lost


def test_release_after_the_lease_lapsed_is_a_loss_with_delay_allowance() -> None:
    [v] = lease_verdicts([e(0, "acquire", 201), e(6, "release", 204)], KEY, 5).values()
    assert v.lost and "released" in v.reasons[0]
    delayed = [e(0, "acquire", 201), e(1, "renew", 200, fault="delay=4-7"), e(9, "release", 204)]
    [d] = lease_verdicts(delayed, KEY, 5, max_delay=7).values()
    assert not d.lost  # the renewal may have been processed as late as t=8: the lease may have lived to 13
    [d2] = lease_verdicts(delayed, KEY, 5, max_delay=0).values()
    assert d2.lost


def test_a_delayed_renewal_answered_409_after_the_release_is_not_a_loss() -> None:
    # Arrived at 2, held up by an injected delay, processed after the release (seq 5): the holder had
    # already renewed by a retry at 2.6 and released at 4.
    log = [e(0, "acquire", 201), e(2.6, "renew", 200), e(4, "release", 204)]
    log.append({**e(2, "renew", 409, fault="delay=5-7:op=renew"), "seq": 99})
    [v] = lease_verdicts(log, KEY, 5, max_delay=7).values()
    assert not v.lost


def test_lapse_without_a_release_is_judged_against_when_the_holder_ended() -> None:
    [v] = lease_verdicts([e(0, "acquire", 201), e(1.7, "renew", 200)], KEY, 5).values()
    assert not v.lost and v.released_at is None
    assert v.lapsed_by(9.0, 5) and not v.lapsed_by(6.0, 5)


def test_other_keys_are_ignored() -> None:
    other = {
        "time": 0,
        "path": "/locks/k2/lease",
        "op": "acquire",
        "status": 201,
        "token_sha256": "aa",
        "seq": 0,
    }
    assert lease_verdicts([other], KEY, 5) == {}
