"""Bad input: each a 4xx with the JSON error body naming the problem, never a 500, state unchanged."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx
import pytest

from volcano_locks.server.harness import InProcessServer

from .helpers import Raw, new_id

LOCK = "held-lock"


@pytest.fixture
def held(raw: Raw) -> dict[str, object]:
    """A live lease on LOCK; each test checks it is untouched afterwards."""
    r = raw.acquire(LOCK, new_id(), 60)
    assert r.status_code == 201
    return dict(r.json())


def assert_error(
    r: httpx.Response, status: int, code: str | None = None, mentions: str | None = None
) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert isinstance(body["error"], str) and body["error"]
    assert set(body) <= {"error", "code"}
    if code is not None:
        assert body["code"] == code, body
    if mentions is not None:
        assert mentions in body["error"], body


def assert_unchanged(raw: Raw, held: dict[str, object]) -> None:
    assert raw.get(LOCK).json() == {"held": True, **held}


def _post(raw: Raw, content: bytes, token: str | None = None) -> httpx.Response:
    return raw.http.post(f"/locks/{LOCK}/lease", content=content, headers=raw.headers(token or new_id()))


@pytest.mark.parametrize(
    ("body", "code", "mentions"),
    [
        (b'{"ttl_seconds": ', "invalid_body", "not valid JSON"),
        (b"", "invalid_body", "missing JSON body"),
        (b"\xff\xfe", "invalid_body", "not valid JSON"),
        (b'{"ttl_seconds": NaN}', "invalid_body", "NaN"),
        (b"[30]", "invalid_body", "list"),
        (b'"30"', "invalid_body", "str"),
        (b"{}", "invalid_ttl", "ttl_seconds"),
        (b'{"ttl_seconds": 30.0}', "invalid_ttl", "30.0"),
        (b'{"ttl_seconds": "30"}', "invalid_ttl", '"30"'),
        (b'{"ttl_seconds": true}', "invalid_ttl", "true"),
        (b'{"ttl_seconds": null}', "invalid_ttl", "null"),
        (b'{"ttl_seconds": 4}', "invalid_ttl", "4"),
        (b'{"ttl_seconds": 7776001}', "invalid_ttl", "7776001"),
        (b'{"ttl_seconds": -30}', "invalid_ttl", "-30"),
        (b'{"ttl_seconds": 1e400}', "invalid_ttl", None),
        (b'{"ttl_seconds": 30, "force": true}', "invalid_body", "'force'"),
    ],
)
def test_bad_bodies_on_acquire_and_renew(
    raw: Raw, held: dict[str, object], body: bytes, code: str, mentions: str | None
) -> None:
    assert_error(_post(raw, body), 400, code, mentions)
    r = raw.http.patch(f"/locks/{LOCK}/lease", content=body, headers=raw.headers(new_id()))
    assert_error(r, 400, code, mentions)
    assert_unchanged(raw, held)


def test_ttl_boundaries_are_accepted(raw: Raw) -> None:
    assert raw.acquire("five", new_id(), 5).status_code == 201
    assert raw.acquire("ninety-days", new_id(), 7_776_000).status_code == 201


@pytest.mark.parametrize(
    "path_key",
    [
        "k" * 129,
        "a/b",
        "a%2Fb",
        "a%2fb",
        "-starts-with-dash",
        ".dot",
        "sp%20ace",
        "%C3%A9t%C3%A9",
        "%FF",
        "",
        "a%00b",
    ],
)
def test_bad_keys(raw: Raw, held: dict[str, object], path_key: str) -> None:
    token = new_id()
    for r in (
        raw.http.post(f"/locks/{path_key}/lease", json={"ttl_seconds": 30}, headers=raw.headers(token)),
        raw.http.patch(f"/locks/{path_key}/lease", json={"ttl_seconds": 30}, headers=raw.headers(token)),
        raw.http.delete(f"/locks/{path_key}/lease", headers=raw.headers(token)),
        raw.http.get(f"/locks/{path_key}", headers=raw.headers()),
        raw.http.delete(f"/locks/{path_key}", headers=raw.headers()),
    ):
        assert_error(r, 400, "invalid_key", "lock key")
    assert_unchanged(raw, held)


def test_longest_key_is_accepted(raw: Raw) -> None:
    assert raw.acquire("k" * 128, new_id()).status_code == 201
    assert raw.acquire("A0._:-z", new_id()).status_code == 201


@pytest.mark.parametrize(
    "token", ["not-a-uuid", "1234", "{" + "0" * 8 + "-0000-0000-0000-" + "0" * 12 + "}", ""]
)
def test_bad_tokens_are_400_and_never_echoed(raw: Raw, held: dict[str, object], token: str) -> None:
    for send in (
        lambda: raw.acquire(LOCK, token),
        lambda: raw.renew(LOCK, token),
        lambda: raw.release(LOCK, token),
    ):
        r = send()
        assert_error(r, 400, "invalid_token", "X-Volcano-Lock-Token")
        if len(token) > 3:
            assert token not in r.text
    assert_unchanged(raw, held)


def test_missing_token_is_400(raw: Raw, held: dict[str, object]) -> None:
    r = raw.http.post(f"/locks/{LOCK}/lease", json={"ttl_seconds": 30}, headers=raw.headers())
    assert_error(r, 400, "invalid_token", "missing")
    r = raw.http.delete(f"/locks/{LOCK}/lease", headers=raw.headers())
    assert_error(r, 400, "invalid_token", "missing")
    assert_unchanged(raw, held)


@pytest.mark.parametrize("rid", [None, "", "req-1", "0" * 32])
def test_bad_or_missing_request_id(raw: Raw, held: dict[str, object], rid: str | None) -> None:
    headers = raw.headers(new_id())
    if rid is None:
        del headers["X-Volcano-Request-Id"]
    else:
        headers["X-Volcano-Request-Id"] = rid
    for r in (
        raw.http.post(f"/locks/{LOCK}/lease", json={"ttl_seconds": 30}, headers=headers),
        raw.http.delete(f"/locks/{LOCK}", headers=headers),
        raw.http.get(f"/locks/{LOCK}", headers=headers),
    ):
        assert_error(r, 400, "invalid_request_id", "X-Volcano-Request-Id")
    assert_unchanged(raw, held)


@pytest.mark.parametrize("size", [64 * 1024 + 1, 1024 * 1024])
def test_huge_bodies_are_400(raw: Raw, held: dict[str, object], size: int) -> None:
    body = json.dumps({"ttl_seconds": 30, "pad": "x" * size}).encode()
    assert_error(_post(raw, body), 400, "body_too_large", "65536")
    # the connection stays usable after a drained oversized body
    assert_unchanged(raw, held)


def _raw_exchange(server: InProcessServer, data: bytes) -> tuple[int, dict[str, object], bytes]:
    parts = urlsplit(server.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    reply = b"".join(chunks)
    head, _, body = reply.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body), head


def test_gigantic_declared_body_is_refused_without_reading_it(
    server: InProcessServer, raw: Raw, held: dict[str, object]
) -> None:
    request = (
        f"POST /locks/{LOCK}/lease HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.service_key}\r\n"
        f"X-Volcano-Request-Id: {new_id()}\r\nX-Volcano-Lock-Token: {new_id()}\r\n"
        "Content-Length: 1000000000\r\n\r\n"
    ).encode()
    status, body, head = _raw_exchange(server, request)
    assert status == 400 and body["code"] == "body_too_large"
    assert b"Connection: close" in head
    assert_unchanged(raw, held)


@pytest.mark.parametrize(
    ("headers", "code"),
    [("Content-Length: abc\r\n", "invalid_body"), ("Transfer-Encoding: chunked\r\n", "invalid_body")],
)
def test_bad_framing(
    server: InProcessServer, raw: Raw, held: dict[str, object], headers: str, code: str
) -> None:
    request = (
        f"POST /locks/{LOCK}/lease HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.service_key}\r\n"
        f"X-Volcano-Request-Id: {new_id()}\r\nX-Volcano-Lock-Token: {new_id()}\r\n{headers}\r\n"
    ).encode()
    status, body, _ = _raw_exchange(server, request)
    assert status == 400 and body["code"] == code
    assert_unchanged(raw, held)


def test_garbage_request_line_gets_json_error(server: InProcessServer) -> None:
    status, body, _ = _raw_exchange(server, b"HELLO\r\n\r\n")
    assert status == 400 and body["error"]


@pytest.mark.parametrize("path", ["/", "/locks", "/lock/x", "/v1/locks/x"])
def test_unknown_paths_are_404(raw: Raw, path: str) -> None:
    r = raw.http.get(path, headers=raw.headers())
    assert_error(r, 404, "not_found")


def test_an_unknown_admin_path_is_404_only_behind_the_admin_key(server: InProcessServer, raw: Raw) -> None:
    # The admin key is checked first: a project's key learns nothing about which admin paths exist.
    assert_error(raw.http.get("/__admin/x", headers=raw.headers()), 403, "forbidden")
    r = raw.http.get("/__admin/x", headers=raw.headers(key=server.admin_key))
    assert_error(r, 404, "not_found")


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", f"/locks/{LOCK}/lease", "POST, PATCH, DELETE"),
        ("PUT", f"/locks/{LOCK}/lease", "POST, PATCH, DELETE"),
        ("POST", f"/locks/{LOCK}", "GET, DELETE"),
        ("PATCH", f"/locks/{LOCK}", "GET, DELETE"),
        ("OPTIONS", f"/locks/{LOCK}", "GET, DELETE"),
        ("BREW", f"/locks/{LOCK}", None),
    ],
)
def test_wrong_methods_are_405(
    raw: Raw, held: dict[str, object], method: str, path: str, allow: str | None
) -> None:
    r = raw.http.request(method, path, headers=raw.headers(new_id()), content=b'{"ttl_seconds": 30}')
    assert_error(r, 405, "method_not_allowed", method)
    if allow is not None:
        assert r.headers["allow"] == allow
    assert_unchanged(raw, held)


def test_head_is_405_without_body(raw: Raw) -> None:
    r = raw.http.head(f"/locks/{LOCK}", headers=raw.headers())
    assert r.status_code == 405 and r.content == b""


def test_bad_requests_never_500(server: InProcessServer, raw: Raw, held: dict[str, object]) -> None:
    """A sweep of odd shapes: whatever comes back is a 4xx with the JSON error body."""
    sends: list[Callable[[], httpx.Response]] = [
        lambda: raw.http.post(f"/locks/{LOCK}/lease", content=b"\x00" * 100, headers=raw.headers(new_id())),
        lambda: raw.http.post(f"/locks/{LOCK}/lease", content=b"{" * 10_000, headers=raw.headers(new_id())),
        lambda: raw.http.post(f"/locks/{LOCK}/lease", content=b"[" * 60_000, headers=raw.headers(new_id())),
        lambda: raw.http.post(
            f"/locks/{LOCK}/lease",
            content=b'{"ttl_seconds": 1' + b"0" * 5000 + b"}",
            headers=raw.headers(new_id()),
        ),
        lambda: raw.http.get(f"/locks/{'%' * 3}", headers=raw.headers()),
        lambda: raw.http.get(f"/locks/{LOCK}?x=1", headers={**raw.headers(), "Authorization": "Bearer"}),
        lambda: raw.http.get(f"/locks/{LOCK}", headers={**raw.headers(), "Authorization": "Bearer a.b.c"}),
    ]
    for send in sends:
        r = send()
        assert 400 <= r.status_code < 500, r.text
        assert r.json()["error"]
    assert_unchanged(raw, held)
