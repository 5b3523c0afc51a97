"""The server fuzzed with malformed requests (raw HTTP over a socket, and httpx): never a 500, never down.

Every answer must be a status below 500 (no faults are injected here, and the store is up, so not even a
503) with the JSON error body for errors, or the connection closed by the server for bytes that are not
HTTP at all. After every example the server must still be alive and answer a well-formed request.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.server.helpers import exchange, responses
from volcano_locks.server.harness import LocalServer

from .fuzzing import FUZZ

METHODS = ["GET", "POST", "PATCH", "DELETE", "PUT", "HEAD", "OPTIONS", "TRACE", "CONNECT", "BREW", "get", ""]


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    """A server of its own: fuzzing must not disturb the session server other tests share."""
    with LocalServer(quota=1_000_000, log_requests=False) as srv:
        yield srv


@pytest.fixture(scope="module")
def auth(server: LocalServer) -> dict[str, str]:
    return {
        "service": server.service_key,
        "anon": server.anon_key,
        "scoped": server.mint_key(permissions=["locks.read"]),
        "other-project": server.mint_key(project="elsewhere"),
        "expired": server.mint_key(ttl_seconds=-10),
        "garbage": "not.a.jwt",
        "empty": "",
    }


path_segments = st.one_of(
    st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._:-]{0,20}\Z"),
    st.text(alphabet="abcXYZ019._:-/%?#&=+ ~é", max_size=30),
    st.sampled_from(
        ["", "%", "%zz", "%ff%fe", "%c3%28", "a%00b", "..", "a" * 129, "a" * 5000, "%2F", "\u2603"]
    ),
)
paths = st.one_of(
    path_segments.map(lambda s: f"/locks/{s}/lease"),
    path_segments.map(lambda s: f"/locks/{s}"),
    path_segments.map(lambda s: f"/locks/{s}/lease/extra"),
    path_segments.map(lambda s: f"/{s}"),
    st.sampled_from(
        [
            "/",
            "/locks",
            "/locks/",
            "//locks/a/lease",
            "/locks/a/lease?x=1",
            "*",
            "http://x/locks/a",
            "/__admin/faults",
            "/__admin/requests",
        ]
    ),
)
bodies = st.one_of(
    st.just(b""),
    st.builds(
        lambda v: json.dumps({"ttl_seconds": v}).encode(),
        st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=5), st.booleans(), st.none()),
    ),
    st.builds(
        lambda d: json.dumps(d).encode(), st.dictionaries(st.text(max_size=8), st.integers(), max_size=3)
    ),
    st.binary(max_size=200),
    st.just(b'{"ttl_seconds": 30'),
    st.just(b'{"ttl_seconds": 1e400}'),
    st.just(b"[" * 5000),
    st.just(b'{"ttl_seconds": 30, "ttl_seconds": 40}'),
)


@st.composite
def raw_requests(draw: st.DrawFn, auth: dict[str, str]) -> bytes:
    method = draw(st.sampled_from(METHODS))
    path = draw(paths)
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/x", ""]))
    body = draw(bodies)
    # Without Connection: close the body's framing decides where a next request would start.
    headers: list[tuple[str, str]] = [("Host", "localhost")]
    if draw(st.booleans()):
        headers.append(("Connection", "close"))
    who = draw(st.sampled_from([*auth, None]))
    if who is not None:
        scheme = draw(st.sampled_from(["Bearer ", "bearer ", "Basic ", ""]))
        headers.append(("Authorization", scheme + auth[who]))
    uuids = st.one_of(st.uuids().map(str), st.text(alphabet="0123456789abcdef-", max_size=40), st.just(""))
    if draw(st.booleans()):
        headers.append(("X-Volcano-Request-Id", draw(uuids)))
    if draw(st.booleans()):
        headers.append(("X-Volcano-Lock-Token", draw(uuids)))
    if draw(st.booleans()):
        headers.append(
            ("Content-Type", draw(st.sampled_from(["application/json", "text/plain", "", "x/y; z"])))
        )
    length = draw(
        st.sampled_from(
            [
                "exact",
                "exact",
                "none",
                "short",
                "long",
                "negative",
                "junk",
                "huge",
                "chunked",
                "spaced",
                "digit",
            ]
        )
    )
    if length == "exact":
        headers.append(("Content-Length", str(len(body))))
    elif length == "short" and body:
        headers.append(("Content-Length", str(len(body) - 1)))
    elif length == "long":
        headers.append(("Content-Length", str(len(body) + 10)))
    elif length == "negative":
        headers.append(("Content-Length", "-1"))
    elif length == "junk":
        headers.append(("Content-Length", "ten"))
    elif length == "huge":
        headers.append(("Content-Length", str(10**12)))
    elif length == "chunked":
        headers.append(("Transfer-Encoding", "chunked"))
    elif length == "spaced":  # RFC 9112 5.1: no whitespace between a field name and its colon
        headers.append(("Content-Length ", str(len(body))))
    elif length == "digit":  # a digit to str.isdigit(), not to HTTP
        headers.append(("Content-Length", "\u00b2"))
    extra = draw(
        st.lists(
            st.tuples(
                st.from_regex(r"\A[A-Za-z-]{1,20}\Z"),
                st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
            ),
            max_size=3,
        )
    )
    headers.extend(extra)
    if draw(st.booleans()):
        headers.append(("X-Junk", "v" * draw(st.sampled_from([10, 70_000]))))
    head = f"{method} {path} {version}".rstrip() + "\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers)
    raw = head.encode("utf-8", "surrogatepass") + b"\r\n" + body
    if draw(st.integers(0, 9)) == 0:  # sometimes not HTTP at all
        raw = draw(st.binary(min_size=1, max_size=300))
    return raw


def _assert_alive(server: LocalServer) -> None:
    assert server.running, server.stderr()[-2000:]
    r = httpx.get(
        f"{server.url}/locks/fuzz-alive-check",
        timeout=10,
        headers={"Authorization": f"Bearer {server.service_key}", "X-Volcano-Request-Id": str(uuid.uuid4())},
    )
    assert r.status_code == 200 and r.json() == {"held": False}


def test_raw_http_never_gets_a_500_and_never_kills_the_server(
    server: LocalServer, auth: dict[str, str]
) -> None:
    @FUZZ
    @given(raw=raw_requests(auth))
    def check(raw: bytes) -> None:
        answer = exchange(server.port, raw, timeout=10)
        for status, body in responses(answer):
            assert status < 500, (status, raw[:300], answer[:500])
            if status >= 400 and body:
                doc = json.loads(body)
                assert isinstance(doc.get("error"), str), answer[:500]
        _assert_alive(server)

    check()
    assert "Traceback" not in server.stderr(), server.stderr()[-3000:]


@FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "PATCH", "DELETE", "PUT", "OPTIONS"]),
    key=path_segments,
    lease=st.booleans(),
    headers=st.dictionaries(
        st.sampled_from(
            ["X-Volcano-Request-Id", "X-Volcano-Lock-Token", "Content-Type", "Authorization", "X-Other"]
        ),
        st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=60),
        max_size=5,
    ),
    body=bodies,
    with_auth=st.booleans(),
)
def test_httpx_requests_with_fuzzed_parts_never_get_a_500(
    server: LocalServer,
    method: str,
    key: str,
    lease: bool,
    headers: dict[str, str],
    body: bytes,
    with_auth: bool,
) -> None:
    if with_auth and "Authorization" not in headers:
        headers["Authorization"] = f"Bearer {server.service_key}"
    url = f"{server.url}/locks/{key}" + ("/lease" if lease else "")
    try:
        r = httpx.request(method, url, headers=headers, content=body, timeout=10)
    except (httpx.InvalidURL, httpx.LocalProtocolError):
        return  # httpx refused to send it (bad URL or header value); nothing reached the server
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        assert isinstance(r.json().get("error"), str)
    assert server.running
