"""The sans-I/O layer: validation before any request, request building, response mapping, the one retry."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from volcano_locks import errors, protocol
from volcano_locks.models import ABSOLUTE_LEASE_SECONDS

from .helpers import EXPIRES, REQUEST_ID, TOKEN, lease, reply, run_flow

OK = {"expires_at": EXPIRES, "fencing_token": 4503599627370497}


# ------------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize("key", ["a", "A" * 128, "daily-rollup", "a.b_c:d-e", "0"])
def test_valid_keys(key: str) -> None:
    assert protocol.validate_key(key) == key


@pytest.mark.parametrize("key", ["", "A" * 129, "-a", ".a", "a/b", "a b", "a\n", "ä", None, 5, b"abc"])
def test_invalid_keys_are_named(key: object) -> None:
    with pytest.raises(errors.InvalidRequest, match="invalid lock key") as info:
        protocol.validate_key(key)
    if isinstance(key, str) and key:
        assert repr(key)[:40] in str(info.value)


@pytest.mark.parametrize("ttl", [5, 30, 7_776_000])
def test_valid_ttls(ttl: int) -> None:
    assert protocol.validate_ttl(ttl) == ttl


@pytest.mark.parametrize("ttl", [4, 7_776_001, 0, -5, True, False, 30.0, "30", None])
def test_invalid_ttls(ttl: object) -> None:
    with pytest.raises(errors.InvalidRequest, match="invalid ttl") as info:
        protocol.validate_ttl(ttl)
    assert repr(ttl) in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "token", ["not-a-uuid", "3f0e8d1c6a1b4c2d9e8f0a1b2c3d4e5f", "{" + TOKEN + "}", 42, None]
)
def test_invalid_token_is_never_echoed(token: object) -> None:
    with pytest.raises(errors.InvalidRequest, match="invalid ownership token") as info:
        protocol.validate_token(token)
    if isinstance(token, str):
        assert token not in str(info.value)


def test_request_id_kept_verbatim_and_checked() -> None:
    assert protocol.validate_request_id(REQUEST_ID) == REQUEST_ID
    with pytest.raises(errors.InvalidRequest, match="'nope'"):
        protocol.validate_request_id("nope")


def test_lease_must_belong_to_key() -> None:
    with pytest.raises(errors.InvalidRequest, match="belongs to lock key 'k', not 'other'"):
        run_flow(protocol.renew_flow("other", lease(key="k"), None, request_id=None), [])
    with pytest.raises(errors.InvalidRequest, match="expected a LockLease"):
        run_flow(protocol.release_flow("k", {"token": TOKEN}, request_id=None), [])  # type: ignore[arg-type]


def test_validation_happens_before_any_call() -> None:
    flow = protocol.acquire_flow("bad key", 30, token=None, request_id=None)
    with pytest.raises(errors.InvalidRequest):
        next(flow)


# ------------------------------------------------------------------------------------------ requests


def test_acquire_call_shape_keeps_token_and_request_id_verbatim() -> None:
    upper = TOKEN.upper()
    result, calls = run_flow(
        protocol.acquire_flow("job:1", 30, token=upper, request_id=REQUEST_ID), [reply(201, OK, sent_at=50.0)]
    )
    (call,) = calls
    assert (call.method, call.path) == ("POST", "/locks/job%3A1/lease")
    assert call.headers[protocol.HEADER_LOCK_TOKEN] == upper
    assert call.headers[protocol.HEADER_REQUEST_ID] == REQUEST_ID
    assert json.loads(call.body or b"") == {"ttl_seconds": 30}
    assert result.token == upper
    assert result.fencing_token == 4503599627370497
    assert result.expires_at == datetime(2026, 11, 29, 10, 0, 30, 123456, tzinfo=UTC)
    assert result.local_deadline == 80.0
    assert TOKEN.upper() not in repr(result) and TOKEN.upper() not in repr(call)


def test_each_operation_gets_a_fresh_request_id_and_generated_token() -> None:
    _, calls1 = run_flow(protocol.acquire_flow("k", 30, token=None, request_id=None), [reply(201, OK)])
    _, calls2 = run_flow(protocol.acquire_flow("k", 30, token=None, request_id=None), [reply(201, OK)])
    ids = {calls1[0].request_id, calls2[0].request_id}
    tokens = {calls1[0].headers[protocol.HEADER_LOCK_TOKEN], calls2[0].headers[protocol.HEADER_LOCK_TOKEN]}
    assert len(ids) == 2 and len(tokens) == 2


def test_other_calls_shape() -> None:
    held = lease(key="k")
    _, (renew,) = run_flow(protocol.renew_flow("k", held, 60, request_id=None), [reply(200, OK)])
    assert (renew.method, renew.path, json.loads(renew.body or b"")) == (
        "PATCH",
        "/locks/k/lease",
        {"ttl_seconds": 60},
    )
    assert renew.headers[protocol.HEADER_LOCK_TOKEN] == TOKEN
    _, (release,) = run_flow(protocol.release_flow("k", held, request_id=None), [reply(204)])
    assert (release.method, release.path, release.body) == ("DELETE", "/locks/k/lease", None)
    assert release.headers[protocol.HEADER_LOCK_TOKEN] == TOKEN
    _, (get,) = run_flow(protocol.get_flow("k", request_id=None), [reply(200, {"held": False})])
    assert (get.method, get.path) == ("GET", "/locks/k") and protocol.HEADER_LOCK_TOKEN not in get.headers
    _, (force,) = run_flow(protocol.force_release_flow("k", request_id=None), [reply(204)])
    assert (force.method, force.path) == (
        "DELETE",
        "/locks/k",
    ) and protocol.HEADER_LOCK_TOKEN not in force.headers


# ------------------------------------------------------------------------------------------ the one retry


@pytest.mark.parametrize("first", [errors.TransportError("dropped"), reply(503, {"error": "down"})])
def test_acquire_retries_once_with_the_same_call(first: object) -> None:
    result, calls = run_flow(
        protocol.acquire_flow("k", 30, token=TOKEN, request_id=REQUEST_ID),
        [first, reply(201, OK, sent_at=200.0)],
    )
    assert len(calls) == 2 and calls[0] == calls[1]
    assert calls[1].headers[protocol.HEADER_LOCK_TOKEN] == TOKEN
    assert result.local_deadline == 230.0  # from the attempt that succeeded


@pytest.mark.parametrize(
    ("second", "error"),
    [
        (errors.TransportError("again"), errors.TransportError),
        (reply(503, {"error": "x"}), errors.Unavailable),
        (reply(409, {}), errors.LockContention),
    ],
)
def test_two_failures_surface_the_last(second: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        run_flow(
            protocol.acquire_flow("k", 30, token=TOKEN, request_id=None),
            [errors.TransportError("first"), second],
        )


@pytest.mark.parametrize("status", [400, 401, 403, 409, 429, 500])
def test_other_statuses_are_not_retried(status: int) -> None:
    with pytest.raises(Exception) as info:
        run_flow(
            protocol.acquire_flow("k", 30, token=TOKEN, request_id=None), [reply(status, {"error": "no"})]
        )
    assert getattr(info.value, "status", None) == status  # one reply consumed, no second call


@pytest.mark.parametrize("status", [503])
def test_renew_is_never_retried(status: int) -> None:
    with pytest.raises(errors.Unavailable):
        run_flow(protocol.renew_flow("k", lease(), None, request_id=None), [reply(status)])
    with pytest.raises(errors.TransportError):
        run_flow(protocol.release_flow("k", lease(), request_id=None), [errors.TransportError("x")])


# ------------------------------------------------------------------------------------------ responses


@pytest.mark.parametrize(
    ("status", "body", "headers", "error", "code"),
    [
        (400, {"error": "bad ttl", "code": "invalid_ttl"}, {}, errors.InvalidRequest, "invalid_ttl"),
        (401, {"error": "who"}, {}, errors.AuthError, None),
        (403, {"error": "anon", "code": "forbidden"}, {}, errors.AuthError, "forbidden"),
        (409, {"error": "held", "code": "lock_held"}, {}, errors.LockContention, "lock_held"),
        (
            409,
            {"error": "lapsed", "code": "lock_ownership_lost"},
            {},
            errors.OwnershipLost,
            "lock_ownership_lost",
        ),
        (
            429,
            {"error": "slow", "code": "lock_rate_limited"},
            {"retry-after": "17"},
            errors.RateLimited,
            "lock_rate_limited",
        ),
        (503, {"error": "down"}, {}, errors.Unavailable, None),
        (500, None, {}, errors.ServerError, None),
        (502, {"error": "gw"}, {}, errors.ServerError, None),
        (404, {"error": "no route"}, {}, errors.ProtocolError, None),
    ],
)
def test_error_mapping(
    status: int, body: object, headers: dict[str, str], error: type[Exception], code: str | None
) -> None:
    with pytest.raises(error) as info:
        run_flow(protocol.get_flow("k", request_id=REQUEST_ID), [reply(status, body, headers=headers)])
    exc = info.value
    assert type(exc) is error
    assert (exc.status, exc.code, exc.request_id) == (status, code, REQUEST_ID)  # type: ignore[attr-defined]
    if error is errors.RateLimited:
        assert exc.retry_after == 17.0  # type: ignore[attr-defined]


def test_server_text_is_scrubbed_of_secrets() -> None:
    body = {"error": f"token {TOKEN} rejected for key sk-secret", "code": "lock_held"}
    with pytest.raises(errors.LockContention) as info:
        run_flow(
            protocol.acquire_flow("k", 30, token=TOKEN, request_id=None, secrets=("sk-secret",)),
            [reply(409, body)],
        )
    assert TOKEN not in str(info.value) and "sk-secret" not in str(info.value) and "***" in str(info.value)


@pytest.mark.parametrize(
    ("body", "raw", "match"),
    [
        (["not", "an", "object"], None, "JSON list, expected an object"),
        (None, b'{"expires_at": "2026-11-29T10:00:30Z", "fenc', "not JSON"),
        ({"expires_at": EXPIRES}, None, "fencing_token missing"),
        ({"expires_at": EXPIRES, "fencing_token": True}, None, "fencing_token True is not a 64-bit integer"),
        ({"expires_at": EXPIRES, "fencing_token": "5"}, None, "fencing_token '5' is not"),
        ({"expires_at": EXPIRES, "fencing_token": 5.0}, None, "fencing_token 5.0 is not"),
        ({"expires_at": EXPIRES, "fencing_token": 2**64}, None, "is not a 64-bit integer"),
        ({"expires_at": "yesterday", "fencing_token": 5}, None, "expires_at 'yesterday' is not an RFC 3339"),
        ({"expires_at": "2026-11-29T10:00:30", "fencing_token": 5}, None, "is not an RFC 3339"),
        ({"fencing_token": 5}, None, "expires_at None"),
    ],
)
def test_contract_breaking_acquire_responses(body: object, raw: bytes | None, match: str) -> None:
    with pytest.raises(errors.ProtocolError, match=match):
        run_flow(protocol.acquire_flow("k", 30, token=TOKEN, request_id=None), [reply(201, body, raw=raw)])


@pytest.mark.parametrize(
    ("flow", "status"),
    [
        (lambda: protocol.release_flow("k", lease(), request_id=None), 200),
        (lambda: protocol.force_release_flow("k", request_id=None), 200),
        (lambda: protocol.acquire_flow("k", 30, token=None, request_id=None), 200),
        (lambda: protocol.get_flow("k", request_id=None), 204),
    ],
)
def test_unexpected_success_status_is_a_protocol_error(flow: object, status: int) -> None:
    with pytest.raises(errors.ProtocolError, match=f"unexpected status {status}"):
        run_flow(flow(), [reply(status, OK)])  # type: ignore[operator]


def test_renew_keeps_fencing_token_when_omitted_and_measures_from_send() -> None:
    old = lease(sent=0.0, fencing=99)
    new, _ = run_flow(
        protocol.renew_flow("k", old, 60, request_id=None),
        [reply(200, {"expires_at": "2026-11-29T10:01:00.2Z"}, sent_at=9.5)],  # 60.2 s after it was sent
    )
    assert new.fencing_token == 99
    assert (new.ttl, new.local_deadline, new.absolute_deadline) == (60, 69.5, old.absolute_deadline)
    assert new.acquired_at == old.acquired_at and new.token == old.token
    assert old.ttl == 30  # immutable: a new lease was returned


def test_renew_clamps_local_deadline_to_absolute_deadline() -> None:
    old = lease(sent=0.0, absolute=40.0)
    new, _ = run_flow(protocol.renew_flow("k", old, None, request_id=None), [reply(200, OK, sent_at=20.0)])
    assert new.local_deadline == 40.0


def test_acquire_absolute_deadline_from_start() -> None:
    clock = iter([1000.0])
    result, _ = run_flow(
        protocol.acquire_flow("k", 30, token=None, request_id=None, clock=lambda: next(clock)),
        [reply(201, OK, sent_at=1001.0)],
    )
    assert result.absolute_deadline == 1000.0 + ABSOLUTE_LEASE_SECONDS


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"held": False}, (False, None, None)),
        (
            {"held": True, "expires_at": "2026-11-29T10:00:30+00:00", "fencing_token": 3},
            (True, "10:00:30", 3),
        ),
    ],
)
def test_get_states(body: dict[str, object], expected: tuple[object, ...]) -> None:
    state, _ = run_flow(protocol.get_flow("k", request_id=None), [reply(200, body)])
    assert state.held is expected[0]
    assert (state.expires_at.strftime("%H:%M:%S") if state.expires_at else None) == expected[1]
    assert state.fencing_token == expected[2]


@pytest.mark.parametrize(
    "body", [{}, {"held": "yes"}, {"held": True, "fencing_token": 3}, {"held": True, "expires_at": EXPIRES}]
)
def test_get_contract_breaks(body: dict[str, object]) -> None:
    with pytest.raises(errors.ProtocolError):
        run_flow(protocol.get_flow("k", request_id=None), [reply(200, body)])


def test_timestamps() -> None:
    assert protocol.parse_timestamp("2026-11-29T10:00:30.5+02:00") == datetime(
        2026, 11, 29, 8, 0, 30, 500000, tzinfo=UTC
    )
    for bad in ["2026-11-29", "", 5, "2026-13-29T10:00:00Z"]:
        with pytest.raises(ValueError):
            protocol.parse_timestamp(bad)
