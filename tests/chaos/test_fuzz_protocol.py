"""Fuzzed keys, TTLs, tokens and server responses into the core client: a typed error or a correct result.

Inputs go through the real client against the real local server (valid ones must give a correct lease;
invalid ones an ``InvalidRequest`` before any request is sent). Responses a correct server can never send
(wrong statuses, truncated or mistyped JSON, junk headers) come from ``httpx.MockTransport``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from volcano_locks import AsyncVolcanoLocks, LockLease, LockState, VolcanoLocks, errors

from .fuzzing import FUZZ

KEY_RE = r"\A[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z"
UUID_RE = r"\A[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\Z"
MAX_FENCE = 2**63 - 1

valid_keys = st.from_regex(KEY_RE)
any_keys = st.one_of(
    valid_keys,
    st.text(max_size=140),
    st.text(alphabet="abc:._-/ %é\x00\n", max_size=10),
    st.just(""),
    st.just("a" * 129),
    st.integers(),
    st.none(),
    st.binary(max_size=10),
)
valid_ttls = st.integers(5, 7_776_000)
any_ttls = st.one_of(
    valid_ttls,
    st.integers(),
    st.floats(allow_nan=True),
    st.booleans(),
    st.text(max_size=5),
    st.none(),
    st.sampled_from([4, 0, -1, 7_776_001, 30.0, "30"]),
)
any_uuids = st.one_of(
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    st.text(max_size=40),
    st.uuids().map(lambda u: str(u)[:-1]),
    st.uuids().map(lambda u: u.hex),
    st.integers(),
    st.none(),
)


def _is_match(pattern: str, value: object) -> bool:
    import re

    return isinstance(value, str) and re.match(pattern, value) is not None


def _valid_ttl(ttl: object) -> bool:
    return isinstance(ttl, int) and not isinstance(ttl, bool) and 5 <= ttl <= 7_776_000


@FUZZ
@given(
    key=any_keys,
    ttl=any_ttls,
    token=st.one_of(st.none(), any_uuids),
    request_id=st.one_of(st.none(), any_uuids),
)
def test_acquire_input_gives_invalid_request_before_sending_or_a_correct_lease(
    volcano_client: VolcanoLocks, key: Any, ttl: Any, token: Any, request_id: Any
) -> None:
    valid = (
        _is_match(KEY_RE, key)
        and _valid_ttl(ttl)
        and (token is None or _is_match(UUID_RE, token))
        and (request_id is None or _is_match(UUID_RE, request_id))
    )
    # A fuzzed key is namespaced so no other test's lock is touched; the suffix keeps it valid or invalid.
    if isinstance(key, str) and _is_match(KEY_RE, key) and len(key) <= 100:
        key = f"fz{uuid.uuid4().hex[:12]}{key}"
        valid = valid and _is_match(KEY_RE, key)
    sent = volcano_client.requests_sent
    if not valid:
        with pytest.raises(errors.InvalidRequest) as err:
            volcano_client.acquire(key, ttl, token=token, request_id=request_id)
        assert volcano_client.requests_sent == sent, "validation must happen before any request is sent"
        assert isinstance(err.value, ValueError)
        if isinstance(token, str) and len(token) >= 12:
            assert token not in str(err.value) and token not in repr(err.value)
        return
    before = datetime.now(UTC)
    lease = volcano_client.acquire(key, ttl, token=token, request_id=request_id)
    try:
        assert isinstance(lease, LockLease)
        assert lease.key == key and lease.ttl == ttl
        assert token is None or lease.token == token
        assert 0 < lease.fencing_token <= MAX_FENCE
        assert lease.expires_at.tzinfo is not None
        expected = before + timedelta(seconds=min(ttl, 90 * 24 * 3600))
        assert abs((lease.expires_at - expected).total_seconds()) < 30
        assert lease.token not in repr(lease)
        assert volcano_client.get(key).held
    finally:
        volcano_client.release(key, lease)
    assert not volcano_client.get(key).held


@FUZZ
@given(key=any_keys, ttl=any_ttls)
def test_with_lock_and_wait_acquire_reject_bad_input_before_sending(
    volcano_client: VolcanoLocks, key: Any, ttl: Any
) -> None:
    assume(not (_is_match(KEY_RE, key) and _valid_ttl(ttl)))
    sent = volcano_client.requests_sent
    with pytest.raises(errors.InvalidRequest), volcano_client.with_lock(key, ttl):
        pytest.fail("the body must not run")
    with pytest.raises(errors.InvalidRequest):
        volcano_client.wait_acquire(key, ttl, timeout=1.0)
    assert volcano_client.requests_sent == sent


@FUZZ
@given(key=any_keys, request_id=st.one_of(st.none(), any_uuids))
def test_get_and_force_release_validate_or_answer(
    volcano_client: VolcanoLocks, key: Any, request_id: Any
) -> None:
    valid = _is_match(KEY_RE, key) and (request_id is None or _is_match(UUID_RE, request_id))
    if isinstance(key, str) and valid:
        key = f"fz{uuid.uuid4().hex[:12]}{key}"[:128]
    if not valid:
        with pytest.raises(errors.InvalidRequest):
            volcano_client.get(key, request_id=request_id)
        with pytest.raises(errors.InvalidRequest):
            volcano_client.force_release(key, request_id=request_id)
        return
    assert volcano_client.get(key, request_id=request_id) == LockState(held=False)
    assert volcano_client.force_release(key, request_id=request_id) is None


# ------------------------------------------------------------------------------- responses (MockTransport)

SERVICE_KEY = "fuzz-service-key-4f1c2e0b9a7d6c5b"
TOKEN = "0f8e3c2a-1b4d-4e6f-8a9b-0c1d2e3f4a5b"

aware_datetimes = st.datetimes(
    min_value=datetime(1970, 1, 2), max_value=datetime(9998, 12, 31), timezones=st.just(UTC)
)


@st.composite
def timestamps(draw: st.DrawFn) -> tuple[object, datetime | None]:
    """An ``expires_at`` value and the instant it denotes (None: not a valid RFC 3339 UTC timestamp)."""
    if draw(st.booleans()):
        dt = draw(aware_datetimes)
        style = draw(st.sampled_from(["Z", "offset", "nanos", "other-offset"]))
        if style == "Z":
            return dt.isoformat().replace("+00:00", "Z"), dt
        if style == "offset":
            return dt.isoformat(), dt
        if style == "nanos":
            return dt.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z", dt
        shifted = dt.astimezone(timezone(timedelta(hours=2)))
        return shifted.isoformat(), dt
    junk = draw(
        st.one_of(
            st.text(max_size=30),
            st.integers(),
            st.floats(),
            st.none(),
            st.booleans(),
            st.lists(st.integers(), max_size=2),
            aware_datetimes.map(lambda d: d.replace(tzinfo=None).isoformat()),  # naive: no offset
        )
    )
    return junk, None


fences = st.one_of(
    st.integers(0, MAX_FENCE).map(lambda n: (n, n)),
    st.one_of(
        st.integers(max_value=-1),
        st.integers(min_value=MAX_FENCE + 1),
        st.floats(),
        st.booleans(),
        st.text(max_size=10),
        st.none(),
    ).map(lambda v: (v, None)),
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children, max_size=3)
    ),
    max_leaves=8,
)

statuses = st.one_of(
    st.sampled_from([200, 201, 204, 400, 401, 403, 404, 409, 429, 500, 502, 503, 504]),
    st.integers(200, 599),
)


@st.composite
def replies(draw: st.DrawFn) -> dict[str, Any]:
    """A fuzzed response: status, headers, body; plus what a correct client must make of a 2xx body."""
    status = draw(statuses)
    ts, instant = draw(timestamps())
    fence_value, fence = draw(fences)
    shape = draw(st.sampled_from(["lease", "state", "error", "json", "bytes", "empty"]))
    body: Any
    content: bytes
    if shape == "lease":
        body = {"expires_at": ts, "fencing_token": fence_value}
        if draw(st.booleans()):
            del body[draw(st.sampled_from(["expires_at", "fencing_token"]))]
        content = json.dumps(body).encode()
    elif shape == "state":
        body = {
            "held": draw(st.one_of(st.booleans(), json_values)),
            "expires_at": ts,
            "fencing_token": fence_value,
        }
        content = json.dumps(body).encode()
    elif shape == "error":
        code = draw(st.one_of(st.sampled_from(["lock_held", "lock_ownership_lost", "x"]), json_values))
        message = (
            draw(st.one_of(st.text(max_size=30), json_values))
            if draw(st.booleans())
            else (f"bad key {SERVICE_KEY} token {TOKEN}")
        )
        body = {"error": message, "code": code}
        content = json.dumps(body).encode()
    elif shape == "json":
        body = draw(json_values)
        content = json.dumps(body).encode()
    elif shape == "bytes":
        body = None
        content = draw(st.binary(max_size=40))
        if draw(st.booleans()):
            content = b'{"expires_at": "2030-01-01T00:00:00Z", "fencing_tok'  # truncated JSON
    else:
        body, content = None, b""
    headers = {"Content-Type": draw(st.sampled_from(["application/json", "text/html", "junk"]))}
    if draw(st.booleans()):
        headers["Retry-After"] = draw(
            st.one_of(
                st.sampled_from(["1", "0", "-5", "nan", "inf", "1e9", "soon", ""]),
                st.text(alphabet="0123456789.-e", max_size=8),
            )
        )
    return {
        "status": status,
        "headers": headers,
        "content": content,
        "body": body,
        "instant": instant,
        "fence": fence,
    }


transport_failures = st.sampled_from(
    [httpx.ConnectError, httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError]
)


def _mock(reply: dict[str, Any], calls: list[httpx.Request]) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(reply["status"], headers=reply["headers"], content=reply["content"])

    return handler


def _lease(fence: int = 7) -> LockLease:
    now = datetime.now(UTC)
    return LockLease(
        key="fuzz-key",
        token=TOKEN,
        expires_at=now,
        fencing_token=fence,
        ttl=30,
        acquired_at=now,
        local_deadline=0.0,
        absolute_deadline=1e12,
    )


def _expected_error(status: int, reply: dict[str, Any]) -> type[errors.VolcanoError]:
    if status == 400:
        return errors.InvalidRequest
    if status in (401, 403):
        return errors.AuthError
    if status == 409:
        body = reply["body"]
        code = body.get("code") if isinstance(body, dict) else None
        return errors.OwnershipLost if code == "lock_ownership_lost" else errors.LockContention
    if status == 429:
        return errors.RateLimited
    if status == 503:
        return errors.Unavailable
    if 500 <= status < 600:
        return errors.ServerError
    return errors.ProtocolError


def _check_error(
    exc: errors.VolcanoError,
    expected: type[errors.VolcanoError],
    reply: dict[str, Any],
    *,
    holds_token: bool = True,
) -> None:
    """``holds_token``: the call carried the ownership token (get and force_release never know one)."""
    assert type(exc) is expected or isinstance(exc, expected), (type(exc), expected)
    if expected is not errors.OwnershipLost and expected is errors.LockContention:
        assert not isinstance(exc, errors.OwnershipLost)
    text = f"{exc} {exc!r} {exc.code} {exc.request_id}"
    assert SERVICE_KEY not in text
    if holds_token:
        assert TOKEN not in text
    if isinstance(exc, errors.RateLimited | errors.Unavailable) and exc.retry_after is not None:
        assert exc.retry_after >= 0 and exc.retry_after != float("inf")


def _valid_lease_body(reply: dict[str, Any], *, fence_required: bool) -> bool:
    body = reply["body"]
    if not isinstance(body, dict) or reply["instant"] is None or "expires_at" not in body:
        return False
    if "fencing_token" not in body:
        return not fence_required
    return reply["fence"] is not None


@FUZZ
@given(reply=replies())
def test_acquire_maps_any_response_to_a_lease_or_a_typed_error(reply: dict[str, Any]) -> None:
    calls: list[httpx.Request] = []
    with VolcanoLocks(
        "http://volcano.invalid", service_key=SERVICE_KEY, transport=httpx.MockTransport(_mock(reply, calls))
    ) as c:
        try:
            lease = c.acquire("fuzz-key", 30, token=TOKEN)
        except errors.VolcanoError as exc:
            status = reply["status"]
            if status == 201:
                assert isinstance(exc, errors.ProtocolError)
                assert not _valid_lease_body(reply, fence_required=True)
            else:
                _check_error(exc, _expected_error(status, reply), reply)
            # Exactly one retry, only after a 503.
            assert len(calls) == (2 if status == 503 else 1)
            return
    assert reply["status"] == 201 and _valid_lease_body(reply, fence_required=True)
    assert lease.expires_at == reply["instant"]
    assert lease.fencing_token == reply["fence"]
    assert lease.token == TOKEN and lease.key == "fuzz-key"


@FUZZ
@given(reply=replies())
def test_renew_release_get_force_release_map_any_response(reply: dict[str, Any]) -> None:
    calls: list[httpx.Request] = []
    status = reply["status"]
    with VolcanoLocks(
        "http://volcano.invalid", service_key=SERVICE_KEY, transport=httpx.MockTransport(_mock(reply, calls))
    ) as c:
        # renew: 200 with a lease body; the fencing token may be omitted (kept from the lease).
        try:
            renewed = c.renew("fuzz-key", _lease(), 30)
        except errors.VolcanoError as exc:
            if status == 200:
                assert isinstance(exc, errors.ProtocolError) and not _valid_lease_body(
                    reply, fence_required=False
                )
            else:
                _check_error(exc, _expected_error(status, reply), reply)
        else:
            assert status == 200 and _valid_lease_body(reply, fence_required=False)
            assert renewed.fencing_token == (reply["fence"] if "fencing_token" in reply["body"] else 7)
            assert renewed.token == TOKEN
        # release and force release: 204 only.
        for call, holds_token in (
            (lambda: c.release("fuzz-key", _lease()), True),
            (lambda: c.force_release("fuzz-key"), False),
        ):
            try:
                assert call() is None
            except errors.VolcanoError as exc:
                expected = errors.ProtocolError if status == 204 else _expected_error(status, reply)
                _check_error(exc, expected, reply, holds_token=holds_token)
            else:
                assert status == 204
        # get: 200 with {"held": bool, ...}.
        try:
            state = c.get("fuzz-key")
        except errors.VolcanoError as exc:
            if status == 200:
                assert isinstance(exc, errors.ProtocolError)
            else:
                _check_error(exc, _expected_error(status, reply), reply, holds_token=False)
        else:
            body = reply["body"]
            assert status == 200 and isinstance(body, dict) and isinstance(body.get("held"), bool)
            assert state.held is body["held"]
            if state.held:
                assert state.fencing_token == reply["fence"] and state.expires_at is not None
            else:
                assert state == LockState(held=False)
    assert len(calls) == 4  # no call but acquisition ever retries on its own


@FUZZ
@given(
    failure=transport_failures, op=st.sampled_from(["acquire", "renew", "release", "get", "force_release"])
)
def test_no_response_is_a_transport_error_and_only_acquire_retries(
    failure: type[httpx.TransportError], op: str
) -> None:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise failure("boom " + SERVICE_KEY, request=request)

    with VolcanoLocks(
        "http://volcano.invalid", service_key=SERVICE_KEY, transport=httpx.MockTransport(handler)
    ) as c:
        actions: dict[str, Callable[[], object]] = {
            "acquire": lambda: c.acquire("fuzz-key", 30, token=TOKEN),
            "renew": lambda: c.renew("fuzz-key", _lease()),
            "release": lambda: c.release("fuzz-key", _lease()),
            "get": lambda: c.get("fuzz-key"),
            "force_release": lambda: c.force_release("fuzz-key"),
        }
        with pytest.raises(errors.TransportError) as err:
            actions[op]()
    assert len(calls) == (2 if op == "acquire" else 1)
    if op == "acquire":  # the retry is the same request: same token, same request id
        assert calls[0].headers["x-volcano-request-id"] == calls[1].headers["x-volcano-request-id"]
        assert calls[0].headers["x-volcano-lock-token"] == calls[1].headers["x-volcano-lock-token"] == TOKEN
    assert TOKEN not in str(err.value)


@FUZZ
@given(reply=replies())
async def test_async_client_maps_responses_like_the_sync_one(reply: dict[str, Any]) -> None:
    def outcome_sync() -> object:
        with VolcanoLocks(
            "http://volcano.invalid", service_key=SERVICE_KEY, transport=httpx.MockTransport(_mock(reply, []))
        ) as c:
            try:
                return c.acquire("fuzz-key", 30, token=TOKEN).fencing_token
            except errors.VolcanoError as exc:
                return type(exc)

    async with AsyncVolcanoLocks(
        "http://volcano.invalid", service_key=SERVICE_KEY, transport=httpx.MockTransport(_mock(reply, []))
    ) as ac:
        try:
            result: object = (await ac.acquire("fuzz-key", 30, token=TOKEN)).fencing_token
        except errors.VolcanoError as exc:
            result = type(exc)
    assert result == outcome_sync()
