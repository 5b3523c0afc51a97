"""Both clients against the real local server over loopback: every call, contention, the one retry."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import httpx
import pytest

from volcano_locks import VolcanoLocks, errors
from volcano_locks.server.harness import InProcessServer, LocalServer

from .helpers import make_client, requests_for


def test_round_trip(client: Any, unique_key: str) -> None:
    lease = client.acquire(unique_key, 30)
    state = client.get(unique_key)
    assert state.held and state.fencing_token == lease.fencing_token and state.expires_at == lease.expires_at
    renewed = client.renew(unique_key, lease, 60)
    assert renewed.fencing_token == lease.fencing_token and renewed.expires_at > lease.expires_at
    assert renewed.local_deadline > lease.local_deadline and renewed.ttl == 60
    assert renewed.absolute_deadline == lease.absolute_deadline
    client.release(unique_key, renewed)
    assert client.get(unique_key).held is False
    client.release(unique_key, renewed)  # idempotent when already gone
    again = client.acquire(unique_key, 5)
    assert again.fencing_token > lease.fencing_token
    client.force_release(unique_key)
    assert client.get(unique_key).held is False
    client.force_release(unique_key)  # also when absent
    assert client.requests_sent == 10


def test_contention_lock_held(client: Any, unique_key: str) -> None:
    lease = client.acquire(unique_key, 30)
    with pytest.raises(errors.LockContention) as info:
        client.acquire(unique_key, 30)
    assert (
        type(info.value) is errors.LockContention
        and info.value.code == "lock_held"
        and info.value.status == 409
    )
    client.release(unique_key, lease)


def test_contention_ownership_lost_on_renew_after_force_release(client: Any, unique_key: str) -> None:
    lease = client.acquire(unique_key, 30)
    client.force_release(unique_key)
    with pytest.raises(errors.OwnershipLost) as info:
        client.renew(unique_key, lease)
    assert info.value.code == "lock_ownership_lost"
    other = client.acquire(unique_key, 30)
    with pytest.raises(errors.OwnershipLost):
        client.release(unique_key, lease)  # a stale token cannot release the newer lease
    client.release(unique_key, other)


def test_contention_ownership_lost_on_reacquire_of_lapsing_lease(
    movable_server: InProcessServer, unique_key: str
) -> None:
    with VolcanoLocks(movable_server.url, service_key=movable_server.service_key) as client:
        lease = client.acquire(unique_key, 5)
        # Into the server's last second before expiry, by its clock instead of a 4 s sleep: a re-acquire
        # there (up to the end of the 1 s grace) gets this 409.
        movable_server.jump_clock(4.5)
        with pytest.raises(errors.OwnershipLost) as info:
            client.acquire(unique_key, 5, token=lease.token)
        assert info.value.code == "lock_ownership_lost"


def test_same_token_reacquire_is_idempotent(client: Any, unique_key: str) -> None:
    token = str(uuid.uuid4())
    first = client.acquire(unique_key, 30, token=token)
    second = client.acquire(unique_key, 10, token=token)
    assert second.fencing_token == first.fencing_token and second.token == token
    client.release(unique_key, second)


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize(
    "fault",
    ["status=503:count=1:op=acquire", "drop:count=1:op=acquire", "drop:count=1:op=acquire:when=after"],
)
def test_acquire_retries_once_with_same_token_and_request_id(
    admin_server: LocalServer, unique_key: str, kind: str, fault: str
) -> None:
    client, close = make_client(kind, admin_server.url, admin_server.service_key)
    token, request_id = str(uuid.uuid4()), str(uuid.uuid4())
    try:
        admin_server.set_faults(fault)
        lease = client.acquire(unique_key, 30, token=token, request_id=request_id)
        admin_server.set_faults(None)
        assert client.requests_sent == 2
        seen = requests_for(admin_server, request_id)
        assert len(seen) == 2
        assert {r["token_sha256"] for r in seen} == {hashlib.sha256(token.encode()).hexdigest()[:12]}
        assert client.get(unique_key).fencing_token == lease.fencing_token
        client.release(unique_key, lease)
    finally:
        close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_uncertain_acquisition_recovered_with_the_same_token(
    admin_server: LocalServer, unique_key: str, kind: str
) -> None:
    client, close = make_client(kind, admin_server.url, admin_server.service_key)
    token, request_id = str(uuid.uuid4()), str(uuid.uuid4())
    try:
        admin_server.set_faults("drop:count=2:op=acquire:when=after")
        with pytest.raises(errors.TransportError) as info:
            client.acquire(unique_key, 30, token=token, request_id=request_id)
        assert info.value.request_id == request_id
        admin_server.set_faults(None)
        held = client.get(unique_key)
        assert held.held  # the server did acquire, the client could not know
        recovered = client.acquire(unique_key, 30, token=token, request_id=request_id)
        assert recovered.fencing_token == held.fencing_token
        assert len(requests_for(admin_server, request_id)) == 3
        client.release(unique_key, recovered)
    finally:
        close()


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("status=503:count=2:op=acquire", errors.Unavailable),
        ("drop:count=2:op=acquire", errors.TransportError),
    ],
)
def test_two_failures_surface_the_last(
    admin_server: LocalServer, unique_key: str, fault: str, error: type[Exception]
) -> None:
    with VolcanoLocks(admin_server.url, service_key=admin_server.service_key) as client:
        admin_server.set_faults(fault)
        with pytest.raises(error):
            client.acquire(unique_key, 30)
        assert client.requests_sent == 2


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize(
    ("status", "error"), [(400, errors.InvalidRequest), (500, errors.ServerError), (429, errors.RateLimited)]
)
def test_no_retry_on_other_statuses(
    admin_server: LocalServer, unique_key: str, kind: str, status: int, error: type[Exception]
) -> None:
    client, close = make_client(kind, admin_server.url, admin_server.service_key)
    request_id = str(uuid.uuid4())
    try:
        admin_server.set_faults(f"status={status}:count=1:op=acquire")
        with pytest.raises(error):
            client.acquire(unique_key, 30, request_id=request_id)
        # One acquire only. A 500 leaves the outcome uncertain, so the client may already be
        # releasing behind the caller (fresh request ids, see test_abandoned.py): not a retry.
        acquires = [r for r in admin_server.requests() if r["op"] == "acquire" and unique_key in r["path"]]
        assert len(acquires) == 1 and len(requests_for(admin_server, request_id)) == 1
        assert client.requests_sent == 1 or status == 500
    finally:
        close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_no_retry_on_auth_and_contention(admin_server: LocalServer, unique_key: str, kind: str) -> None:
    anon, close_anon = make_client(kind, admin_server.url, admin_server.anon_key)
    forged, close_forged = make_client(kind, admin_server.url, "not-a-jwt")
    owner, close_owner = make_client(kind, admin_server.url, admin_server.service_key)
    try:
        with pytest.raises(errors.AuthError) as info:
            anon.acquire(unique_key, 30)
        assert info.value.status == 403
        with pytest.raises(errors.AuthError) as info:
            forged.acquire(unique_key, 30)
        assert info.value.status == 401
        lease = owner.acquire(unique_key, 30)
        with pytest.raises(errors.LockContention):
            owner.acquire(unique_key, 30)
        assert (anon.requests_sent, forged.requests_sent, owner.requests_sent) == (1, 1, 2)
        owner.release(unique_key, lease)
    finally:
        close_anon(), close_forged(), close_owner()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_rate_limited_with_retry_after(tmp_path: Any, unique_key: str, kind: str) -> None:
    with LocalServer(db=str(tmp_path / "q.sqlite3"), quota=3) as srv:
        client, close = make_client(kind, srv.url, srv.service_key)
        try:
            with pytest.raises(errors.RateLimited) as info:
                for _ in range(20):  # a minute boundary may reset the window once
                    client.get(unique_key)
            exc = info.value
            assert exc.status == 429 and exc.code == "lock_rate_limited"
            assert exc.retry_after is not None and 1 <= exc.retry_after <= 60
            before = client.requests_sent
            with pytest.raises(errors.RateLimited):
                client.acquire(unique_key, 30)
            assert client.requests_sent == before + 1  # 429 is not retried
        finally:
            close()


def test_renew_and_others_never_retry(admin_server: LocalServer, unique_key: str) -> None:
    with VolcanoLocks(admin_server.url, service_key=admin_server.service_key) as client:
        lease = client.acquire(unique_key, 30)
        admin_server.set_faults("status=503:count=1:op=renew|release|get|force_release")
        with pytest.raises(errors.Unavailable):
            client.renew(unique_key, lease)
        assert client.requests_sent == 2
        admin_server.set_faults("drop:count=1:op=release")
        with pytest.raises(errors.TransportError):
            client.release(unique_key, lease)
        assert client.requests_sent == 3
        admin_server.set_faults(None)
        client.release(unique_key, lease)


def test_validation_sends_nothing(client: Any) -> None:
    for call in (
        lambda: client.acquire("bad key", 30),
        lambda: client.acquire("k", 4),
        lambda: client.acquire("k", 30, token="nope"),
        lambda: client.acquire("k", 30, request_id="nope"),
        lambda: client.get("/etc"),
        lambda: client.force_release(""),
    ):
        with pytest.raises(errors.InvalidRequest):
            call()
    assert client.requests_sent == 0


def test_transport_error_on_unreachable_server() -> None:
    import socket

    with socket.socket() as sock:  # a free port nobody listens on: bind, read it, close
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with VolcanoLocks(f"http://127.0.0.1:{port}", service_key="k", timeout=2) as client:
        with pytest.raises(errors.TransportError) as info:
            client.acquire("k", 30)
        assert isinstance(info.value.__cause__, httpx.TransportError)
        assert client.requests_sent == 2  # the one acquisition retry


# ---------------------------------------------------------------- responses no correct server can produce


def _mock(status: int, content: bytes, headers: dict[str, str] | None = None) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(status, content=content, headers=headers))


@pytest.mark.parametrize(
    ("status", "content", "match"),
    [
        (201, b"[1, 2]", "JSON list"),
        (201, b'{"expires_at": "2026-11-29T10:00:00Z", "fencing_token": 1', "not JSON"),
        (201, b'{"expires_at": "2026-11-29T10:00:00Z"}', "fencing_token missing"),
        (201, b'{"expires_at": "2026-11-29T10:00:00Z", "fencing_token": false}', "fencing_token False"),
        (201, b'{"expires_at": "2026-11-29T10:00:00Z", "fencing_token": "12"}', "fencing_token '12'"),
        (201, b'{"expires_at": "soon", "fencing_token": 12}', "expires_at 'soon'"),
        (200, b'{"expires_at": "2026-11-29T10:00:00Z", "fencing_token": 12}', "unexpected status 200"),
    ],
)
def test_contract_breaking_responses_sync(status: int, content: bytes, match: str) -> None:
    with (
        VolcanoLocks("http://volcano.invalid", service_key="k", transport=_mock(status, content)) as client,
        pytest.raises(errors.ProtocolError, match=match),
    ):
        client.acquire("k", 30)


async def test_contract_breaking_responses_async() -> None:
    from volcano_locks import AsyncVolcanoLocks

    transport = httpx.MockTransport(lambda request: httpx.Response(200))
    async with AsyncVolcanoLocks("http://volcano.invalid", service_key="k", transport=transport) as client:
        lease_transport = httpx.MockTransport(
            lambda r: httpx.Response(201, json={"expires_at": "2026-11-29T10:00:00Z", "fencing_token": 3})
        )
        async with AsyncVolcanoLocks(
            "http://volcano.invalid", service_key="k", transport=lease_transport
        ) as other:
            lease = await other.acquire("k", 30)
        with pytest.raises(errors.ProtocolError, match="release: unexpected status 200"):
            await client.release("k", lease)
        with pytest.raises(errors.ProtocolError, match="JSON"):
            await client.get("k")


def test_every_request_carries_credential_and_ids() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "GET":
            return httpx.Response(200, json={"held": False})
        if request.method == "DELETE":
            return httpx.Response(204)
        return httpx.Response(
            201 if request.method == "POST" else 200,
            json={"expires_at": "2026-11-29T10:00:00Z", "fencing_token": 3},
        )

    with VolcanoLocks(
        "http://volcano.invalid/base", service_key="svc", transport=httpx.MockTransport(handler)
    ) as client:
        lease = client.acquire("k", 30)
        lease = client.renew("k", lease)
        client.get("k")
        client.release("k", lease)
        client.force_release("k")
    assert [r.url.path for r in seen] == ["/base/locks/k/lease"] * 2 + [
        "/base/locks/k",
        "/base/locks/k/lease",
        "/base/locks/k",
    ]
    assert all(r.headers["authorization"] == "Bearer svc" for r in seen)
    assert len({r.headers["x-volcano-request-id"] for r in seen}) == 5
    assert [("x-volcano-lock-token" in r.headers) for r in seen] == [True, True, False, True, False]
