"""Credentials (401/403) and the fixed-minute quota (429), over loopback with the server's clock faked."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import jwt
import pytest

from volcano_locks.server.auth import mint_key
from volcano_locks.server.clock import ManualClock
from volcano_locks.server.harness import InProcessServer

from .conftest import START
from .helpers import Raw, new_id


def _forged(claims: dict[str, object]) -> str:
    return jwt.encode(claims, "another-secret-that-is-long-enough-for-hs256!", algorithm="HS256")


def _unauthorized_keys(server: InProcessServer) -> list[tuple[str, str | None]]:
    secret = server.secret
    return [
        ("missing", None),
        ("garbage", "not-a-jwt"),
        ("forged", _forged({"project_id": "local", "role": "service", "iat": int(START)})),
        ("expired", mint_key(secret, "local", "service", ttl_seconds=60, now=START - 61)),
        ("none-alg", jwt.encode({"project_id": "local", "role": "service"}, None, algorithm="none")),
        ("no-project", jwt.encode({"role": "service", "iat": 1}, secret, algorithm="HS256")),
        ("bad-permissions", jwt.encode({"project_id": "p", "role": "service", "permissions": "*"}, secret)),
    ]


def _forbidden_keys(server: InProcessServer) -> list[tuple[str, str]]:
    return [
        ("anon", server.anon_key),
        ("authenticated", server.mint_key(role="authenticated")),
        ("platform", server.mint_key(role="platform")),
        ("scoped-read", server.mint_key(permissions=["locks.read"])),
        ("scoped-empty", server.mint_key(permissions=[])),
    ]


def test_401_for_missing_invalid_expired_forged(server: InProcessServer, raw: Raw) -> None:
    lease = raw.acquire("job", new_id(), 30).json()
    for name, key in _unauthorized_keys(server):
        other = Raw(server.url, None)
        headers = other.headers(new_id())
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        for r in (
            other.http.post("/locks/job/lease", json={"ttl_seconds": 30}, headers=headers),
            other.http.delete("/locks/job", headers=headers),
        ):
            assert r.status_code == 401, (name, r.text)
            assert r.json()["code"] == "unauthorized" and r.json()["error"], name
            if key is not None:
                assert key not in r.text
        other.close()
    assert raw.get("job").json() == {"held": True, **lease}


def test_401_for_wrong_scheme(server: InProcessServer) -> None:
    headers = {"Authorization": f"Basic {server.service_key}", "X-Volcano-Request-Id": new_id()}
    r = httpx.get(server.url + "/locks/job", headers=headers)
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"


def test_key_with_exp_in_future_is_accepted(server: InProcessServer, clock: ManualClock) -> None:
    key = mint_key(server.secret, "local", "service", ttl_seconds=60, now=START - 30)
    raw = Raw(server.url, key)
    assert raw.get("job").status_code == 200
    clock.advance(30)  # the server's clock decides expiry
    assert raw.get("job").status_code == 401
    raw.close()


def test_403_for_non_service_and_unscoped_keys(server: InProcessServer, raw: Raw) -> None:
    lease = raw.acquire("job", new_id(), 30).json()
    for name, key in _forbidden_keys(server):
        other = Raw(server.url, key)
        for r in (other.acquire("job", new_id()), other.get("job"), other.force_release("job")):
            assert r.status_code == 403, (name, r.text)
            assert r.json()["code"] == "forbidden"
        other.close()
    assert raw.get("job").json() == {"held": True, **lease}


def test_scoped_keys_with_locks_manage_or_star_are_allowed(server: InProcessServer) -> None:
    for i, perms in enumerate((["locks.manage"], ["*"], ["storage.read", "locks.manage"])):
        raw = Raw(server.url, server.mint_key(permissions=perms))
        token = new_id()
        assert raw.acquire(f"job-{i}", token).status_code == 201, perms
        raw.close()


@pytest.fixture
def limited(storage_db: str, clock: ManualClock) -> Iterator[InProcessServer]:
    with InProcessServer(db=storage_db, clock=clock, quota=5) as srv:
        yield srv


def test_quota_429_with_retry_after(limited: InProcessServer, clock: ManualClock) -> None:
    raw = Raw(limited.url, limited.service_key)
    clock.set(START + 45.5)
    token = new_id()
    # every authorised request counts: acquire, read, force release, a retry, and an invalid one
    assert raw.acquire("job", token).status_code == 201
    assert raw.get("job").status_code == 200
    assert raw.acquire("job", token).status_code == 201
    assert raw.acquire("job", token, ttl=4).status_code == 400
    assert raw.force_release("other").status_code == 204
    r = raw.acquire("job2", new_id())
    assert r.status_code == 429
    assert r.json()["code"] == "lock_rate_limited" and r.json()["error"]
    assert r.headers["retry-after"] == "15"  # 14.5 s left in the window, whole seconds
    # the quota is checked before validation: a bad request is a 429 too, and changes nothing
    assert raw.acquire("job", new_id(), ttl="bad").status_code == 429
    clock.set(START + 59.5)
    assert raw.get("job").headers["retry-after"] == "1"  # at least 1
    clock.set(START + 60)  # the next clock minute
    assert raw.get("job").json()["held"] is True
    raw.close()


def test_quota_is_per_project_and_ignores_401_403(limited: InProcessServer, clock: ManualClock) -> None:
    anon = Raw(limited.url, limited.anon_key)
    nobody = Raw(limited.url, "garbage")
    for _ in range(10):
        assert anon.get("job").status_code == 403
        assert nobody.get("job").status_code == 401
    alpha = Raw(limited.url, limited.mint_key(project="alpha"))
    beta = Raw(limited.url, limited.mint_key(project="beta"))
    for _ in range(5):
        assert alpha.get("job").status_code == 200
    assert alpha.get("job").status_code == 429
    assert beta.get("job").status_code == 200
    for client in (anon, nobody, alpha, beta):
        client.close()
