"""The HTTP contract end to end over loopback, on SQLite and PostgreSQL, with the server's clock faked."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from volcano_locks.server.clock import ManualClock
from volcano_locks.server.harness import InProcessServer

from .conftest import START
from .helpers import Raw, new_id

TS_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
NINETY_DAYS = 7_776_000


def ts(value: str) -> float:
    """Parse the contract's RFC 3339 UTC timestamp into epoch seconds."""
    assert TS_RE.fullmatch(value), value
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def test_acquire_201_body_exactly(raw: Raw, clock: ManualClock) -> None:
    r = raw.acquire("job", new_id(), 30)
    assert r.status_code == 201
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"expires_at", "fencing_token"}
    assert type(body["fencing_token"]) is int and 0 < body["fencing_token"] < 2**63
    assert ts(body["expires_at"]) == START + 30


def test_read_shapes(raw: Raw) -> None:
    assert raw.get("never-used").json() == {"held": False}
    acquired = raw.acquire("job", new_id(), 30).json()
    r = raw.get("job")
    assert r.status_code == 200
    assert r.json() == {"held": True, **acquired}


def test_idempotent_reacquire_resets_expiry_absolutely(raw: Raw, clock: ManualClock) -> None:
    token = new_id()
    first = raw.acquire("job", token, 60).json()
    clock.advance(10)
    again = raw.acquire("job", token, 20)
    assert again.status_code == 201
    assert again.json()["fencing_token"] == first["fencing_token"]
    # absolute, not added, and a shorter TTL shortens the lease
    assert ts(again.json()["expires_at"]) == START + 10 + 20
    assert raw.get("job").json()["expires_at"] == again.json()["expires_at"]


def test_lock_held_for_another_token_changes_nothing(raw: Raw) -> None:
    first = raw.acquire("job", new_id(), 30).json()
    r = raw.acquire("job", new_id(), 30)
    assert r.status_code == 409
    assert r.json()["code"] == "lock_held" and r.json()["error"]
    assert raw.get("job").json() == {"held": True, **first}


def test_reacquire_by_owner_must_arrive_more_than_1s_before_expiry(raw: Raw, clock: ManualClock) -> None:
    token = new_id()
    raw.acquire("job", token, 30)
    clock.set(START + 28.999)
    assert raw.acquire("job", token, 30).status_code == 201  # now expires at START + 58.999
    clock.set(START + 57.999)  # exactly one second before expires_at: too late
    r = raw.acquire("job", token, 30)
    assert r.status_code == 409 and r.json()["code"] == "lock_ownership_lost"
    clock.set(START + 59.5)  # inside the grace second: still lost, not yet reclaimable
    r = raw.acquire("job", token, 30)
    assert r.status_code == 409 and r.json()["code"] == "lock_ownership_lost"


def test_takeover_waits_the_grace_second(raw: Raw, clock: ManualClock) -> None:
    first = raw.acquire("job", new_id(), 10).json()
    other = new_id()
    clock.set(START + 10)  # at expires_at: grace second begins
    assert raw.get("job").json()["held"] is True
    r = raw.acquire("job", other, 10)
    assert r.status_code == 409 and r.json()["code"] == "lock_held"
    clock.set(START + 10.999)
    assert raw.get("job").json()["held"] is True
    clock.set(START + 11)  # held: false means an acquire would succeed now
    assert raw.get("job").json() == {"held": False}
    _assert_new_lease(raw, other, first)


def test_old_token_after_grace_gets_a_new_lease(raw: Raw, clock: ManualClock) -> None:
    token = new_id()
    first = raw.acquire("job", token, 10).json()
    clock.set(START + 11)
    _assert_new_lease(raw, token, first)


def _assert_new_lease(raw: Raw, token: str, before: dict[str, object]) -> None:
    """An acquire with `token` is granted as a new lease: 201 and a fencing token above `before`'s."""
    second = raw.acquire("job", token, 10)
    assert second.status_code == 201
    fence, old = second.json()["fencing_token"], before["fencing_token"]
    assert isinstance(old, int) and fence > old


def test_renew(raw: Raw, clock: ManualClock) -> None:
    token = new_id()
    first = raw.acquire("job", token, 30).json()
    clock.advance(10)
    r = raw.renew("job", token, 60)
    assert r.status_code == 200
    assert r.json()["fencing_token"] == first["fencing_token"]
    assert set(r.json()) == {"expires_at", "fencing_token"}
    assert ts(r.json()["expires_at"]) == START + 70
    clock.advance(5)
    shorter = raw.renew("job", token, 5).json()  # sets expiry from now: START + 20
    assert ts(shorter["expires_at"]) == START + 20


def test_renew_late_by_other_or_absent_is_ownership_lost(raw: Raw, clock: ManualClock) -> None:
    token = new_id()
    raw.acquire("job", token, 30)
    r = raw.renew("job", new_id(), 30)
    assert r.status_code == 409 and r.json()["code"] == "lock_ownership_lost"
    r = raw.renew("absent", token, 30)
    assert r.status_code == 409 and r.json()["code"] == "lock_ownership_lost"
    clock.set(START + 29)  # exactly 1 s before expires_at: late
    r = raw.renew("job", token, 30)
    assert r.status_code == 409 and r.json()["code"] == "lock_ownership_lost"
    assert ts(raw.get("job").json()["expires_at"]) == START + 30  # unchanged
    clock.set(START + 40)  # past grace: gone
    r = raw.renew("job", token, 30)
    assert r.status_code == 409 and r.json()["code"] == "lock_ownership_lost"


def test_renew_just_in_time(raw: Raw, clock: ManualClock) -> None:
    token = new_id()
    raw.acquire("job", token, 30)
    clock.set(START + 28.99)
    assert raw.renew("job", token, 30).status_code == 200


def test_release(raw: Raw, clock: ManualClock) -> None:
    token = new_id()
    raw.acquire("job", token, 30)
    r = raw.release("job", token)
    assert r.status_code == 204 and r.content == b""
    assert raw.get("job").json() == {"held": False}
    assert raw.release("job", token).status_code == 204  # idempotent when absent
    assert raw.release("never-used", new_id()).status_code == 204


def test_stale_token_cannot_release_a_newer_lease(raw: Raw, clock: ManualClock) -> None:
    old = new_id()
    raw.acquire("job", old, 10)
    clock.set(START + 11)
    newer = raw.acquire("job", new_id(), 30).json()
    r = raw.release("job", old)
    assert r.status_code == 409 and r.json()["code"] == "lock_ownership_lost"
    assert raw.get("job").json() == {"held": True, **newer}


def test_release_in_grace_and_after_grace(raw: Raw, clock: ManualClock) -> None:
    token = new_id()
    raw.acquire("job", token, 10)
    clock.set(START + 10.5)
    assert raw.release("job", token).status_code == 204
    assert raw.get("job").json() == {"held": False}
    raw.acquire("other", token, 10)
    clock.set(START + 30)
    assert raw.release("other", new_id()).status_code == 204  # past its grace second: absent


def test_force_release(raw: Raw) -> None:
    first = raw.acquire("job", new_id(), 30).json()
    r = raw.force_release("job")
    assert r.status_code == 204 and r.content == b""
    assert raw.get("job").json() == {"held": False}
    assert raw.force_release("job").status_code == 204
    assert raw.force_release("never-used").status_code == 204
    second = raw.acquire("job", new_id(), 30).json()
    assert second["fencing_token"] > first["fencing_token"]


def test_fencing_never_resets_and_is_per_key(raw: Raw, clock: ManualClock) -> None:
    seen: list[int] = []
    for i in range(4):
        token = new_id()
        lease = raw.acquire("job", token, 10).json()
        assert raw.renew("job", token, 10).json()["fencing_token"] == lease["fencing_token"]
        seen.append(lease["fencing_token"])
        if i == 0:
            raw.release("job", token)
        elif i == 1:
            raw.force_release("job")
        else:
            clock.advance(12)  # expiry
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert raw.acquire("other-key", new_id(), 10).status_code == 201


def test_ninety_day_deadline(raw: Raw, clock: ManualClock) -> None:
    token = new_id()
    first = raw.acquire("job", token, NINETY_DAYS).json()
    deadline = START + NINETY_DAYS
    assert ts(first["expires_at"]) == deadline
    clock.set(START + NINETY_DAYS - 3600)
    renewed = raw.renew("job", token, 7200).json()  # capped by the absolute deadline
    assert ts(renewed["expires_at"]) == deadline
    again = raw.acquire("job", token, 7200).json()  # a re-acquire does not move it either
    assert ts(again["expires_at"]) == deadline
    assert again["fencing_token"] == first["fencing_token"]
    clock.set(deadline - 1)
    assert raw.renew("job", token, 60).status_code == 409
    clock.set(deadline + 1)
    assert raw.get("job").json() == {"held": False}
    newer = raw.acquire("job", new_id(), 60).json()
    assert newer["fencing_token"] > first["fencing_token"]


def test_deadline_applies_to_renewals_of_short_leases(raw: Raw, clock: ManualClock) -> None:
    token = new_id()
    raw.acquire("job", token, 86_400)
    for day in range(1, 91):
        clock.set(START + day * 86_400 - 30)
        if day == 90:
            r = raw.renew("job", token, 60)
            assert r.status_code == 200
            assert ts(r.json()["expires_at"]) == START + NINETY_DAYS  # 30 s left, not 60
        else:
            # keep it alive by re-stating a day-long lease each day
            assert raw.renew("job", token, 86_400 + 10).status_code == 200


def test_projects_are_separate(server: InProcessServer) -> None:
    a = Raw(server.url, server.mint_key(project="alpha"))
    b = Raw(server.url, server.mint_key(project="beta"))
    token = new_id()
    lease_a = a.acquire("shared", token, 30)
    lease_b = b.acquire("shared", new_id(), 30)
    assert lease_a.status_code == lease_b.status_code == 201
    # beta cannot touch alpha's lease even with alpha's token
    assert b.release("shared", token).status_code == 409
    assert b.force_release("shared").status_code == 204
    assert a.get("shared").json() == {"held": True, **lease_a.json()}
    a.close()
    b.close()


def test_request_id_echoed_and_content_type_optional(raw: Raw) -> None:
    rid = new_id()
    r = raw.http.post(
        "/locks/job/lease",
        content=b'{"ttl_seconds": 30}',
        headers=raw.headers(new_id(), request_id=rid),
    )
    assert r.status_code == 201
    assert r.headers["x-volcano-request-id"] == rid


def test_keep_alive_reuses_one_connection(raw: Raw) -> None:
    for _ in range(5):
        r = raw.get("job")
        assert r.status_code == 200 and r.http_version == "HTTP/1.1"
        assert r.headers.get("connection", "").lower() != "close"
