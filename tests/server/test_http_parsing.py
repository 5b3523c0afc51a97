"""What a hand-written HTTP parser got wrong (issue 21), each over a raw loopback socket, and nested JSON
wherever the server reads JSON: every case is a clean 4xx with the JSON error body and changes nothing."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import httpx
import pytest

from volcano_locks.server.harness import InProcessServer

from .helpers import Raw, exchange, new_id, responses

NESTED = b"[" * 60_000  # deep enough for RecursionError, small enough for the 64 KiB body limit


@pytest.fixture
def srv() -> Iterator[InProcessServer]:
    with InProcessServer(admin=True, quota=1_000_000) as server:
        yield server


def _held(srv: InProcessServer, key: str) -> bool:
    raw = Raw(srv.url, srv.service_key)
    state = raw.get(key).json()
    raw.close()
    return bool(state["held"])


def _head(srv: InProcessServer, request_line: str, *lines: str) -> bytes:
    head = [
        request_line,
        "Host: x",
        f"Authorization: Bearer {srv.service_key}",
        f"X-Volcano-Request-Id: {new_id()}",
    ]
    return ("\r\n".join([*head, *lines]) + "\r\n\r\n").encode("latin-1")


def test_a_head_body_is_not_read_as_a_second_request(srv: InProcessServer) -> None:
    raw = Raw(srv.url, srv.service_key)
    assert raw.acquire("victim", new_id()).status_code == 201
    raw.close()
    smuggled = _head(srv, "DELETE /locks/victim HTTP/1.1")  # force release, if it were ever parsed
    answer = exchange(
        srv.port, _head(srv, "HEAD /locks/victim HTTP/1.1", f"Content-Length: {len(smuggled)}") + smuggled
    )
    assert answer.startswith(b"HTTP/1.1 405 ") and answer.count(b"HTTP/1.1 ") == 1, answer
    assert _held(srv, "victim")
    assert [e["op"] for e in srv.requests()] == ["acquire", "get"]  # no force_release ever reached the app


@pytest.mark.parametrize("digit", [b"\xb2", b"\xb3", b"\xb9", b"\xbd", b"\xd9\xa3", b"\xef\xbc\x95"])
def test_a_content_length_of_non_ascii_digits_is_a_clean_400(srv: InProcessServer, digit: bytes) -> None:
    # '²' (latin-1 0xB2) passes str.isdigit() and then int() raises: the request died without an answer.
    request = _head(srv, "POST /locks/job/lease HTTP/1.1", f"X-Volcano-Lock-Token: {new_id()}")
    request = request[:-2] + b"Content-Length: " + digit + b"\r\n\r\n" + b'{"ttl_seconds": 30}'
    [(status, body)] = responses(exchange(srv.port, request))
    assert status == 400 and json.loads(body)["code"] == "invalid_body"
    assert not _held(srv, "job")


@pytest.mark.parametrize(
    "line", ["Content-Length : 19", "Content-Length\t: 19", "X-Volcano-Lock-Token : {token}"]
)
def test_whitespace_before_a_header_colon_is_a_400(srv: InProcessServer, line: str) -> None:
    # RFC 9112 5.1: "A server MUST reject, with a response status code of 400 (Bad Request), any received
    # request message that contains whitespace between a header field name and colon."
    token = new_id()
    others = [f"X-Volcano-Lock-Token: {token}", "Content-Length: 19"]
    others = [o for o in others if o.split(":")[0] != line.split()[0]]
    request = _head(srv, "POST /locks/job/lease HTTP/1.1", *others, line.format(token=token))
    [(status, body)] = responses(exchange(srv.port, request + b'{"ttl_seconds": 30}'))
    doc = json.loads(body)
    assert status == 400 and doc["code"] == "bad_request" and "RFC 9112" in doc["error"]
    assert srv.service_key not in doc["error"] and token not in doc["error"]  # the rule, never the bytes
    assert not _held(srv, "job")


def test_malformed_heads_never_echo_a_credential(srv: InProcessServer) -> None:
    request = _head(srv, "GET /locks/job HTTP/1.1").replace(b"Authorization:", b"Authorization :")
    answer = exchange(srv.port, request)
    assert answer.startswith(b"HTTP/1.1 400 ") and srv.service_key.encode() not in answer


def _jwt_with_header(header: bytes) -> str:
    b64 = base64.urlsafe_b64encode(header).rstrip(b"=").decode()
    return f"{b64}.e30.c2ln"


@pytest.mark.parametrize(
    "where", ["acquire", "renew", "admin faults", "admin faults (too large)", "key header"]
)
def test_nested_json_anywhere_is_a_clean_4xx(srv: InProcessServer, where: str) -> None:
    srv.set_faults("delay=0:op=get")
    token = new_id()
    raw = Raw(srv.url, srv.service_key)
    admin = {"Authorization": f"Bearer {srv.admin_key}"}
    with httpx.Client(base_url=srv.url, timeout=20) as http:
        if where == "acquire":
            r = http.post("/locks/job/lease", content=NESTED, headers=raw.headers(token))
        elif where == "renew":
            assert raw.acquire("job", token).status_code == 201
            r = http.patch(
                "/locks/job/lease", content=b'{"ttl_seconds": ' + NESTED, headers=raw.headers(token)
            )
        elif where == "admin faults":
            r = http.put("/__admin/faults", content=NESTED, headers=admin)
        elif where == "admin faults (too large)":  # past the body limit: refused, not taken for "no body"
            r = http.put("/__admin/faults", content=b"[" * 100_000, headers=admin)
        else:
            r = http.get("/locks/job", headers=raw.headers(key=_jwt_with_header(b'{"alg":' + b"[" * 5_000)))
    expected = {"acquire": 400, "renew": 400, "key header": 401}.get(where, 400)
    assert r.status_code == expected and r.json()["error"], r.text
    if where.startswith("admin"):
        assert r.json()["code"] in ("invalid_faults", "body_too_large")
    assert srv.faults() == "delay=0:op=get"  # an admin PUT that was refused changed nothing
    assert raw.get("job").json()["held"] is (where == "renew")
    raw.close()
