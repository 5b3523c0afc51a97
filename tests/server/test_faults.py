"""Fault injection (grammar, statuses, delays, drops before/after), the admin endpoints, and 503s."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from volcano_locks.server.faults import FaultInjector, parse_faults
from volcano_locks.server.harness import InProcessServer, LocalServer

from .helpers import Raw, drop_schema, new_id, with_schema
from .tcpproxy import TcpProxy


def test_grammar_accepts_the_documented_forms() -> None:
    rules = parse_faults(
        "status=503:rate=0.1,delay=0.5-2:rate=0.05,drop:rate=0.05,"
        "status=500:count=2:op=acquire|renew:when=after,delay=0.25,drop:op=release:when=before"
    )
    assert [r.kind for r in rules] == ["status", "delay", "drop", "status", "delay", "drop"]
    assert rules[0].status == 503 and rules[0].rate == 0.1 and rules[0].when == "before"
    assert rules[1].delay == (0.5, 2.0)
    assert rules[3].remaining == 2 and rules[3].ops == {"acquire", "renew"} and rules[3].when == "after"
    assert rules[4].delay == (0.25, 0.25)
    assert parse_faults("") == [] and parse_faults(None) == []


@pytest.mark.parametrize(
    "spec",
    [
        "status=200",
        "status=abc",
        "delay=2-1",
        "delay=x",
        "drop=1",
        "explode",
        "status=503:rate=2",
        "status=503:count=-1",
        "status=503:op=lock",
        "status=503:when=during",
        "status=503:colour=red",
    ],
)
def test_grammar_rejects_bad_rules_naming_them(spec: str) -> None:
    with pytest.raises(ValueError, match="fault rule"):
        parse_faults(spec)


def test_count_and_rate_and_op() -> None:
    inj = FaultInjector("status=503:count=2:op=acquire,drop:rate=0")
    assert inj.decide("get", "before").status is None
    assert inj.decide("acquire", "before").status == 503
    assert inj.decide("acquire", "after").status is None
    assert inj.decide("acquire", "before").status == 503
    assert inj.decide("acquire", "before").status is None  # count used up
    assert not inj.decide("release", "before").drop  # rate 0 never fires


@pytest.fixture
def srv() -> Iterator[InProcessServer]:
    with InProcessServer(admin=True) as s:
        yield s


@pytest.fixture
def raw(srv: InProcessServer) -> Iterator[Raw]:
    with Raw(srv.url, srv.service_key) as client:
        yield client


def test_status_before_changes_nothing(srv: InProcessServer, raw: Raw) -> None:
    srv.set_faults("status=503:op=acquire:count=1")
    token = new_id()
    r = raw.acquire("job", token)
    assert r.status_code == 503 and r.json()["error"]
    assert raw.get("job").json() == {"held": False}
    assert raw.acquire("job", token).status_code == 201


def test_status_after_hides_a_real_acquisition(srv: InProcessServer, raw: Raw) -> None:
    srv.set_faults("status=503:op=acquire:count=1:when=after")
    token, rid = new_id(), new_id()
    assert raw.acquire("job", token, request_id=rid).status_code == 503
    state = raw.get("job").json()
    assert state["held"] is True
    retry = raw.acquire("job", token, request_id=rid)
    assert retry.status_code == 201 and retry.json()["fencing_token"] == state["fencing_token"]


def test_drop_before_and_after(srv: InProcessServer, raw: Raw) -> None:
    srv.set_faults("drop:op=acquire:count=1")
    token, rid = new_id(), new_id()
    with pytest.raises(httpx.RemoteProtocolError):
        raw.acquire("job", token, request_id=rid)
    assert raw.get("job").json() == {"held": False}

    srv.set_faults("drop:op=acquire:count=1:when=after")
    with pytest.raises(httpx.RemoteProtocolError):
        raw.acquire("job", token, request_id=rid)
    state = raw.get("job").json()
    assert state["held"] is True  # the uncertain acquisition happened
    retry = raw.acquire("job", token, request_id=rid)
    assert retry.status_code == 201 and retry.json()["fencing_token"] == state["fencing_token"]

    log = [e for e in srv.requests() if e["request_id"] == rid]
    assert [(e["op"], e["status"], e["fault"]) for e in log] == [
        ("acquire", None, "drop:op=acquire:count=1"),
        ("acquire", None, "drop:op=acquire:count=1:when=after"),
        ("acquire", 201, None),
    ]
    assert len({e["token_sha256"] for e in log}) == 1 and len(log[0]["token_sha256"]) == 12
    assert token not in str(srv.requests())


def test_delay_and_injected_429(srv: InProcessServer, raw: Raw) -> None:
    srv.set_faults("delay=0.2-0.3:op=get:count=1,status=429:op=renew")
    started = time.monotonic()
    assert raw.get("job").status_code == 200
    assert time.monotonic() - started >= 0.2
    r = raw.renew("job", new_id())
    assert (
        r.status_code == 429 and r.headers["retry-after"] == "1" and r.json()["code"] == "lock_rate_limited"
    )


def test_admin_endpoints(srv: InProcessServer, raw: Raw) -> None:
    srv.set_faults("status=503:rate=0.5")
    assert srv.faults() == "status=503:rate=0.5"
    admin = {"Authorization": f"Bearer {srv.admin_key}"}
    r = httpx.put(srv.url + "/__admin/faults", json={"faults": "explode"}, headers=admin)
    assert r.status_code == 400 and r.json()["code"] == "invalid_faults" and "explode" in r.json()["error"]
    assert srv.faults() == "status=503:rate=0.5"  # a bad spec keeps the old rules
    srv.set_faults(None)
    assert srv.faults() == ""
    raw.get("job")
    assert srv.requests()
    srv.clear_requests()
    assert srv.requests() == []
    assert httpx.post(srv.url + "/__admin/faults", headers=admin).status_code == 405


def test_admin_is_off_unless_asked() -> None:
    with InProcessServer() as plain:
        assert httpx.get(plain.url + "/__admin/faults").status_code == 404
        assert httpx.get(plain.url + "/__admin/requests").status_code == 404


def test_cli_faults_flag_and_runtime_faults_in_a_subprocess() -> None:
    with LocalServer(faults="status=503:op=get:count=1", admin=True) as s:
        raw = Raw(s.url, s.service_key)
        assert raw.get("job").status_code == 503
        assert raw.get("job").status_code == 200
        s.set_faults("drop:op=get")
        with pytest.raises(httpx.TransportError):
            raw.get("job")
        s.set_faults(None)
        assert raw.get("job").status_code == 200
        raw.close()


def test_bad_faults_flag_exits_with_message() -> None:
    s = LocalServer(faults="explode")
    with pytest.raises(RuntimeError, match="fault rule 'explode'"):
        s.start()
    s.close()


def test_503_when_postgres_goes_away_and_recovery(pg_dsn: str) -> None:
    parts = urlsplit(pg_dsn)
    proxy = TcpProxy((parts.hostname or "127.0.0.1", parts.port or 5432)).start()
    schema = f"vl_test_{uuid.uuid4().hex[:12]}"
    proxied = with_schema(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}").geturl(), schema)
    try:
        with InProcessServer(db=proxied) as srv:
            raw = Raw(srv.url, srv.service_key)
            token = new_id()
            lease = raw.acquire("job", token).json()
            proxy.cut()
            for send in (
                lambda: raw.acquire("job", token),
                lambda: raw.get("job"),
                lambda: raw.release("job", token),
            ):
                r = send()
                assert r.status_code == 503, r.text
                assert r.json()["code"] == "unavailable" and "fail closed" in r.json()["error"]
            proxy.restore()
            assert raw.get("job").json() == {"held": True, **lease}  # nothing was lost or changed
            assert raw.release("job", token).status_code == 204
            raw.close()
    finally:
        proxy.cut()
        drop_schema(pg_dsn, schema)
