"""The server's movable clock: SkewedClock, `/__admin/clock`, `serve --clock-offset/--clock-rate`, and
the request history a model checker reads (`serve --history`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from volcano_locks import OwnershipLost, VolcanoLocks
from volcano_locks.fencing import FencedTable
from volcano_locks.server.clock import ManualClock, SkewedClock
from volcano_locks.server.harness import InProcessServer, LocalServer

from .conftest import START
from .helpers import Raw, new_id


def test_skewed_clock_steps_and_rates_from_its_current_reading() -> None:
    base = ManualClock(START)
    clock = SkewedClock(base, offset=5.0)
    assert clock() == START + 5
    base.advance(10)
    assert clock() == START + 15
    assert clock.jump(-20) == START - 5  # back past the base clock
    base.advance(1)
    assert clock() == START - 4
    clock.set_rate(2.0)  # fast from here on, no step
    assert clock() == START - 4
    base.advance(3)
    assert clock() == START + 2
    clock.set_rate(0.5)
    base.advance(4)
    assert clock() == START + 4
    assert clock.state() == {"now": START + 4, "offset": START + 4 - base(), "rate": 0.5}


@pytest.mark.parametrize("rate", [0, -1, 1000, float("nan"), float("inf"), True])
def test_skewed_clock_refuses_a_rate_naming_it(rate: float) -> None:
    with pytest.raises(ValueError, match="clock rate"):
        SkewedClock(ManualClock(), rate=rate)


@pytest.mark.parametrize("seconds", [float("nan"), float("-inf"), 1e12])
def test_skewed_clock_refuses_a_step_naming_it(seconds: float) -> None:
    with pytest.raises(ValueError, match="clock offset"):
        SkewedClock(ManualClock()).jump(seconds)


@pytest.fixture
def skewed(tmp_path: Path) -> Iterator[tuple[InProcessServer, ManualClock, Path]]:
    base = ManualClock(START)
    history = tmp_path / "history.jsonl"
    with InProcessServer(
        clock=SkewedClock(base), admin=True, faults=None, history=str(history), quota=1_000_000
    ) as srv:
        yield srv, base, history


def test_admin_clock_moves_the_leases_with_it(skewed: tuple[InProcessServer, ManualClock, Path]) -> None:
    srv, base, _ = skewed
    with Raw(srv.url, srv.service_key) as raw:
        first, second = new_id(), new_id()
        assert raw.acquire("job", first, ttl=30).status_code == 201
        assert raw.acquire("job", second, ttl=30).status_code == 409
        state = srv.jump_clock(31.0)  # past expiry and the grace second, with no real time passing
        assert state["offset"] == pytest.approx(31.0) and state["rate"] == 1.0
        assert raw.acquire("job", second, ttl=30).status_code == 201
        srv.jump_clock(-60.0)  # back: the new lease now has longer to run, the old one is still gone
        assert raw.renew("job", first, ttl=30).json()["code"] == "lock_ownership_lost"
        assert raw.renew("job", second, ttl=30).status_code == 200
        assert srv.set_clock_rate(3.0)["rate"] == 3.0
        base.advance(10)  # 30 s on the server's clock
        assert srv.clock_state()["offset"] == pytest.approx(-29.0 + 20.0)


@pytest.mark.parametrize(
    "body",
    [{}, {"jump": "1"}, {"rate": 0}, {"jump": 1, "colour": 2}, {"jump": float("1e300")}, [], {"rate": True}],
)
def test_admin_clock_refuses_a_bad_change_and_keeps_the_clock(
    skewed: tuple[InProcessServer, ManualClock, Path], body: object
) -> None:
    srv, _, _ = skewed
    before = srv.clock_state()
    r = httpx.put(srv.url + "/__admin/clock", json=body, headers={"Authorization": f"Bearer {srv.admin_key}"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_clock", r.text
    assert srv.clock_state() == before


def test_admin_clock_needs_a_movable_clock() -> None:
    fixed = InProcessServer(clock=ManualClock(START), admin=True)
    with fixed as srv, pytest.raises(RuntimeError, match="409"):
        srv.jump_clock(1.0)


def test_history_records_each_decision_with_its_time_and_never_a_token(
    skewed: tuple[InProcessServer, ManualClock, Path],
) -> None:
    srv, _, history = skewed
    token = new_id()
    with Raw(srv.url, srv.service_key) as raw:
        assert raw.acquire("job", token, ttl=30).status_code == 201
        srv.set_faults("status=503:op=renew:when=after")
        assert raw.renew("job", token, ttl=20).status_code == 503  # renewed, then hidden
        srv.set_faults("drop:op=release")
        with pytest.raises(httpx.TransportError):
            raw.release("job", token)  # dropped before it was served
        srv.set_faults(None)
        srv.jump_clock(5.0)
        assert raw.get("job").json()["held"] is True
    text = history.read_text()
    assert token not in text and srv.service_key not in text
    lines = [json.loads(line) for line in text.splitlines()]
    requests = [e for e in lines if e.get("op") and e.get("ev") is None]
    acquire, renew, release, get = requests
    assert acquire["key"] == "job" and acquire["ttl"] == 30 and acquire["served"] == 201
    assert acquire["now_us"] == int(START * 1e6) and acquire["mono"] <= acquire["mono_end"]
    assert acquire["answer"]["fencing_token"] == 1
    assert renew["status"] == 503 and renew["served"] == 200 and renew["answer"]["fencing_token"] == 1
    assert release["status"] is None and release["served"] is None and release["now_us"] is None
    assert get["now_us"] == int((START + 5) * 1e6) and get["answer"]["held"] is True
    assert [e["ev"] for e in lines if e.get("ev") not in (None, "recv")] == ["clock"]
    assert [e["request_id"] for e in lines if e.get("ev") == "recv"] == [e["request_id"] for e in requests]
    assert {e["pid"] for e in lines} == {e["pid"] for e in lines[:1]}


def test_grant_held_fault_grants_a_held_lock_once(skewed: tuple[InProcessServer, ManualClock, Path]) -> None:
    srv, _, _ = skewed
    with Raw(srv.url, srv.service_key) as raw:
        assert raw.acquire("job", new_id()).json()["fencing_token"] == 1
        srv.set_faults("grant_held:count=1")
        assert raw.acquire("job", new_id()).json()["fencing_token"] == 2  # the bug: held, granted again
        r = raw.acquire("job", new_id())
        assert r.status_code == 409 and r.json()["code"] == "lock_held"  # once only


@pytest.mark.parametrize("spec", ["grant_held:op=renew", "grant_held:when=after", "grant_held=1"])
def test_grant_held_is_only_an_acquire_decided_wrong(spec: str) -> None:
    from volcano_locks.server.faults import parse_faults

    with pytest.raises(ValueError, match="fault rule"):
        parse_faults(spec)


@pytest.mark.slow  # a server process of its own
def test_serve_starts_with_a_skewed_clock(tmp_path: Path) -> None:
    with LocalServer(admin=True, clock_offset=-3600.0, clock_rate=0.5, history=str(tmp_path / "h")) as srv:
        state = srv.clock_state()
        assert state["offset"] == pytest.approx(-3600.0, abs=5) and state["rate"] == 0.5
        with Raw(srv.url, srv.service_key) as raw:
            assert raw.get("job").json() == {"held": False}
    assert json.loads((tmp_path / "h").read_text().splitlines()[0])["op"] == "get"


def test_a_step_forward_past_the_grace_lets_a_second_holder_in_and_only_fencing_refuses_the_first(
    skewed: tuple[InProcessServer, ManualClock, Path], tmp_path: Path
) -> None:
    """What the contract promises when the server's clock gains more than the grace second within a TTL
    (docs/chaos.md): the lease no longer excludes, fencing still does."""
    srv, _, _ = skewed
    table = FencedTable(str(tmp_path / "fenced.sqlite3"))
    # TTL 6: the first holder's keeper renews about 2 s in (real time; the server's clock stands still).
    with (
        VolcanoLocks(srv.url, service_key=srv.service_key, timeout=5.0) as client,
        pytest.raises(OwnershipLost),
        client.with_lock("job", 6) as first,
    ):
        assert table.write("rollup", "job", first.fencing_token, "first, early")
        srv.jump_clock(31.0)  # the first lease is over on the server's clock, at once
        second = client.acquire("job", 30)
        assert not first.lost  # the first holder measures its lease itself: it still believes it holds
        assert second.fencing_token > first.fencing_token
        assert table.write("rollup", "job", second.fencing_token, "second")
        assert not table.write("rollup", "job", first.fencing_token, "first, late")  # refused
        client.release("job", second)
        assert first.wait_lost(10)  # its next renewal is refused: now it knows
    current = table.read("rollup")
    assert current is not None and current.value == "second"
