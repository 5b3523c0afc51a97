"""The sans-I/O core of the client: validation, request building and response mapping.

Each operation is a *flow*: a generator that yields the :class:`Call` to send and receives the
:class:`Reply` (or has the shell's :class:`~volcano_locks.errors.TransportError` thrown into it), and
finally returns the result. The sync and async clients only drive flows; every decision, including
the single acquisition retry, is made here once.
"""

from __future__ import annotations

import json
import logging
import math
import re
import uuid
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar
from urllib.parse import quote

from volcano_locks.clock import lease_clock
from volcano_locks.errors import (
    AuthError,
    InvalidRequest,
    LockContention,
    OwnershipLost,
    ProtocolError,
    RateLimited,
    ServerError,
    TransportError,
    Unavailable,
    VolcanoError,
)
from volcano_locks.models import ABSOLUTE_LEASE_SECONDS, LeaseRef, LockLease, LockState

__all__ = [
    "HEADER_LOCK_TOKEN",
    "HEADER_REQUEST_ID",
    "MAX_RETRY_AFTER",
    "MAX_TTL",
    "MIN_TTL",
    "Call",
    "Flow",
    "Reply",
    "acquire_flow",
    "error_from_reply",
    "force_release_flow",
    "get_flow",
    "new_request_id",
    "parse_timestamp",
    "release_flow",
    "renew_flow",
    "validate_key",
    "validate_lease",
    "validate_poll",
    "validate_ref",
    "validate_request_id",
    "validate_token",
    "validate_ttl",
    "validate_wait_timeout",
]

logger = logging.getLogger("volcano_locks.client")

T = TypeVar("T")

HEADER_REQUEST_ID = "X-Volcano-Request-Id"
HEADER_LOCK_TOKEN = "X-Volcano-Lock-Token"
MIN_TTL = 5
MAX_TTL = 7_776_000
_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_UUID_RE = re.compile(r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}")
_FRACTION_RE = re.compile(r"(\.\d{6})\d+")
_MAX_FENCING = 2**63 - 1
MAX_RETRY_AFTER = 60.0
"""The longest ``Retry-After`` honoured, in seconds: the length of the quota window."""
_SKEW_WARNING = 2.0  # seconds by which the server's expiry may undercut the local deadline silently


@dataclass(frozen=True)
class Call:
    """One HTTP request to send: everything but the credential, which the shell's pool carries."""

    op: str
    method: str
    path: str
    request_id: str
    headers: Mapping[str, str] = field(repr=False)
    body: bytes | None = None
    timeout: float | None = None
    key: str | None = None
    """The lock key the call is about (for the lock metrics; the path carries it encoded)."""


@dataclass(frozen=True)
class Reply:
    """What came back for a :class:`Call`, with the clocks read just before it was sent."""

    status: int
    headers: Mapping[str, str]
    content: bytes
    sent_at: float
    sent_wall: datetime


Flow = Generator[Call, Reply, T]
"""An operation: yields calls, receives replies (or a thrown ``TransportError``), returns the result."""


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def new_request_id() -> str:
    """Return a fresh request id (a random UUID)."""
    return str(uuid.uuid4())


def validate_key(key: object) -> str:
    """Check a lock key against the contract (1-128 of letters, digits, ``._:-``; first alphanumeric)."""
    if not isinstance(key, str) or _KEY_RE.fullmatch(key) is None:
        raise InvalidRequest(
            f"invalid lock key {_show(key)}: expected 1-128 of letters, digits, '.', '_', ':', '-' "
            "starting with a letter or digit"
        )
    return key


def validate_ttl(ttl: object, *, name: str = "ttl") -> int:
    """Check a TTL: an int (not a bool) of seconds from 5 through 7,776,000 (90 days).

    Args:
        ttl: The TTL.
        name: The argument's name, for the message (``ttl``, ``handoff_ttl``).
    """
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not MIN_TTL <= ttl <= MAX_TTL:
        raise InvalidRequest(
            f"invalid {name} {_show(ttl)}: expected an integer number of seconds, {MIN_TTL}..{MAX_TTL}"
        )
    return int(ttl)


def validate_wait_timeout(value: object, *, name: str = "wait_timeout") -> float | None:
    """Check a bound on waiting: ``None`` (no bound), or finite seconds >= 0 (a ``timedelta`` too).

    Args:
        value: The bound.
        name: The argument's name, for the message (``wait_timeout``, ``timeout``).
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value >= 0)
    ):
        raise InvalidRequest(f"invalid {name} {_show(value)}: expected None or seconds >= 0")
    return float(value)


def validate_poll(value: object, *, name: str = "poll") -> float:
    """Check a poll interval: finite seconds > 0 (``name`` is the argument's, for the message)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        raise InvalidRequest(f"invalid {name} {_show(value)}: expected seconds > 0")
    return float(value)


def validate_token(token: object) -> str:
    """Check an ownership token is a UUID string; the value is a secret and never echoed."""
    if not isinstance(token, str) or _UUID_RE.fullmatch(token) is None:
        raise InvalidRequest(
            f"invalid ownership token: expected a UUID string, got a {type(token).__name__} (value hidden)"
        )
    return token


def validate_request_id(request_id: object) -> str:
    """Check a request id is a UUID string (kept verbatim)."""
    if not isinstance(request_id, str) or _UUID_RE.fullmatch(request_id) is None:
        raise InvalidRequest(f"invalid request id {_show(request_id)}: expected a UUID string")
    return request_id


_Held = TypeVar("_Held", LockLease, LeaseRef)


def validate_lease(key: str, lease: object) -> LockLease:
    """Check ``lease`` is a :class:`LockLease` of ``key``."""
    if not isinstance(lease, LockLease):
        raise InvalidRequest(f"expected a LockLease, got {type(lease).__name__}")
    return _of_key(key, lease)


def validate_ref(key: str, lease: object) -> LeaseRef:
    """Check ``lease`` is a :class:`LockLease` or :class:`LeaseRef` of ``key``; return its reference."""
    if not isinstance(lease, LockLease | LeaseRef):
        raise InvalidRequest(f"expected a LockLease or a LeaseRef, got {type(lease).__name__}")
    if isinstance(lease, LockLease):
        return _of_key(key, lease).ref()
    return _of_key(key, lease)


def _of_key(key: str, lease: _Held) -> _Held:
    if lease.key != key:
        raise InvalidRequest(f"lease belongs to lock key {_show(lease.key)}, not {_show(key)}")
    validate_token(lease.token)
    return lease


def _request_id(request_id: object | None) -> str:
    return new_request_id() if request_id is None else validate_request_id(request_id)


def _path(key: str, lease: bool) -> str:
    path = "/locks/" + quote(key, safe="")
    return path + "/lease" if lease else path


def _call(
    op: str,
    method: str,
    key: str,
    request_id: str,
    *,
    on_lease: bool,
    token: str | None = None,
    ttl: int | None = None,
    timeout: float | None = None,
) -> Call:
    headers = {HEADER_REQUEST_ID: request_id, "Accept": "application/json"}
    body = None
    if token is not None:
        headers[HEADER_LOCK_TOKEN] = token
    if ttl is not None:
        headers["Content-Type"] = "application/json"
        body = json.dumps({"ttl_seconds": ttl}).encode()
    return Call(op, method, _path(key, on_lease), request_id, headers, body, timeout, key)


# ---------------------------------------------------------------------------------------------- responses


def _scrub(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text[:300]


def _json(call: Call, reply: Reply) -> object:
    try:
        return json.loads(reply.content)
    except (ValueError, RecursionError) as exc:  # deep nesting makes the decoder raise RecursionError
        raise ProtocolError(
            f"{call.op}: response body is not JSON (status {reply.status}, {len(reply.content)} bytes)",
            status=reply.status,
            request_id=call.request_id,
        ) from exc


def _object(call: Call, reply: Reply) -> dict[str, object]:
    body = _json(call, reply)
    if not isinstance(body, dict):
        raise ProtocolError(
            f"{call.op}: response body is a JSON {type(body).__name__}, expected an object",
            status=reply.status,
            request_id=call.request_id,
        )
    return body


def parse_timestamp(value: object) -> datetime:
    """Parse an RFC 3339 timestamp into an aware UTC datetime (``ValueError`` if it is not one)."""
    if not isinstance(value, str) or "T" not in value.upper():
        raise ValueError("not an RFC 3339 timestamp")
    text = value.strip()
    if text[-1:] in ("z", "Z"):
        text = text[:-1] + "+00:00"
    # Python 3.11 takes at most microseconds; servers may send nanoseconds.
    parsed = datetime.fromisoformat(_FRACTION_RE.sub(r"\1", text))
    if parsed.tzinfo is None:
        raise ValueError("timestamp has no UTC offset")
    return parsed.astimezone(UTC)


def _expires_at(call: Call, reply: Reply, body: Mapping[str, object]) -> datetime:
    try:
        return parse_timestamp(body.get("expires_at"))
    except (ValueError, OverflowError) as exc:
        raise ProtocolError(
            f"{call.op}: expires_at {_show(body.get('expires_at'))} is not an RFC 3339 timestamp",
            status=reply.status,
            request_id=call.request_id,
        ) from exc


def _fencing_token(call: Call, reply: Reply, body: Mapping[str, object]) -> int:
    value = body.get("fencing_token")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_FENCING:
        what = "missing" if "fencing_token" not in body else f"{_show(value)} is not a 64-bit integer"
        raise ProtocolError(
            f"{call.op}: fencing_token {what}", status=reply.status, request_id=call.request_id
        )
    return value


def _retry_after(headers: Mapping[str, str]) -> float | None:
    raw = headers.get("retry-after")
    if raw is None or len(raw) > 32:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    # The quota window is one minute: no honest Retry-After is longer. A larger one (99999999, 1e308)
    # is a broken server's, and obeying it literally would stall renewals and waits for ever.
    return min(value, MAX_RETRY_AFTER)


def _holder(body: Mapping[str, object]) -> LockState | None:
    # The contract's 409 body is only {"error", "code"}; a server may add the holder's expiry.
    try:
        expires = parse_timestamp(body["expires_at"]) if "expires_at" in body else None
    except (ValueError, OverflowError):
        expires = None
    fence = body.get("fencing_token")
    if isinstance(fence, bool) or not isinstance(fence, int):
        fence = None
    return LockState(held=True, expires_at=expires, fencing_token=fence) if expires or fence else None


def error_from_reply(call: Call, reply: Reply, secrets: tuple[str, ...] = ()) -> VolcanoError:
    """Map a non-success reply to the error of the tree; ``secrets`` are scrubbed from server text."""
    status = reply.status
    message, code, holder = None, None, None
    try:
        body = json.loads(reply.content) if reply.content else None
    except (ValueError, RecursionError):
        body = None
    if isinstance(body, dict):
        if isinstance(body.get("error"), str):
            message = _scrub(body["error"], secrets)
        if isinstance(body.get("code"), str):
            code = _scrub(body["code"], secrets)[:64]
        if status == 409:
            holder = _holder(body)
    text = f"{call.op} failed: {message or f'HTTP {status}'}"
    if status == 400:
        return InvalidRequest(text, status=status, code=code, request_id=call.request_id)
    if status in (401, 403):
        return AuthError(text, status=status, code=code, request_id=call.request_id)
    if status == 409:
        cls = OwnershipLost if code == "lock_ownership_lost" else LockContention
        return cls(text, status=status, code=code, request_id=call.request_id, holder=holder)
    if status in (429, 503):
        refused = RateLimited if status == 429 else Unavailable
        retry_after = _retry_after(reply.headers)
        return refused(text, status=status, code=code, request_id=call.request_id, retry_after=retry_after)
    if 500 <= status < 600:
        return ServerError(text, status=status, code=code, request_id=call.request_id)
    hint = (
        " (is the API URL the Volcano API's base URL?)" if status in (404, 405) or 300 <= status < 400 else ""
    )
    return ProtocolError(
        f"{call.op}: unexpected status {status}{hint}", status=status, code=code, request_id=call.request_id
    )


def local_deadline(reply: Reply, ttl: int, expires_at: datetime, absolute: float, call: Call) -> float:
    """When the holder must consider a lease gone, on the lease clock: the earliest of the TTL from
    when the request was sent, the server's ``expires_at`` (translated to the lease clock at the same
    instant) and the 90-day absolute deadline. Safety over liveness: the earlier one wins."""
    by_ttl = reply.sent_at + ttl
    by_server = reply.sent_at + (expires_at - reply.sent_wall).total_seconds()
    if by_server < by_ttl - _SKEW_WARNING:
        logger.warning(
            "%s: the server's expires_at is %.1f s earlier than the TTL says (clock skew, or the lease's "
            "90-day cap); keeping the earlier deadline (request id %s)",
            call.op,
            by_ttl - by_server,
            call.request_id,
        )
    return min(by_ttl, by_server, absolute)


def _expect(call: Call, reply: Reply, status: int, secrets: tuple[str, ...]) -> None:
    if reply.status != status:
        raise error_from_reply(call, reply, secrets)


# ---------------------------------------------------------------------------------------------- flows


def acquire_flow(
    key: str,
    ttl: int,
    *,
    token: str | None,
    request_id: str | None,
    secrets: tuple[str, ...] = (),
    clock: Callable[[], float] = lease_clock,
) -> Flow[LockLease]:
    """Acquire ``key``; retried exactly once, same call, on a transport failure or a 503."""
    key = validate_key(key)
    ttl = validate_ttl(ttl)
    token = str(uuid.uuid4()) if token is None else validate_token(token)
    call = _call("acquire", "POST", key, _request_id(request_id), on_lease=True, token=token, ttl=ttl)
    secrets = (*secrets, token)
    started = clock()
    for attempt in (1, 2):
        try:
            reply = yield call
        except TransportError as exc:
            if attempt == 2:
                raise
            logger.warning(
                "acquire got no response (%s), retrying once; request id %s", exc.message, call.request_id
            )
            continue
        if reply.status == 503 and attempt == 1:
            logger.warning("acquire got 503, retrying once; request id %s", call.request_id)
            continue
        _expect(call, reply, 201, secrets)
        body = _object(call, reply)
        absolute = started + ABSOLUTE_LEASE_SECONDS
        expires_at = _expires_at(call, reply, body)
        return LockLease(
            key=key,
            token=token,
            expires_at=expires_at,
            fencing_token=_fencing_token(call, reply, body),
            ttl=ttl,
            acquired_at=reply.sent_wall,
            local_deadline=local_deadline(reply, ttl, expires_at, absolute, call),
            absolute_deadline=absolute,
        )
    raise AssertionError("unreachable")  # pragma: no cover


def renew_flow(
    key: str,
    lease: LockLease,
    ttl: int | None,
    *,
    request_id: str | None,
    timeout: float | None = None,
    secrets: tuple[str, ...] = (),
) -> Flow[LockLease]:
    """Renew ``lease``; the new lease keeps the fencing token when the response omits it."""
    key = validate_key(key)
    lease = validate_lease(key, lease)
    ttl = lease.ttl if ttl is None else validate_ttl(ttl)
    call = _call(
        "renew",
        "PATCH",
        key,
        _request_id(request_id),
        on_lease=True,
        token=lease.token,
        ttl=ttl,
        timeout=timeout,
    )
    reply = yield call
    _expect(call, reply, 200, (*secrets, lease.token))
    body = _object(call, reply)
    fence = _fencing_token(call, reply, body) if "fencing_token" in body else lease.fencing_token
    expires_at = _expires_at(call, reply, body)
    return LockLease(
        key=key,
        token=lease.token,
        expires_at=expires_at,
        fencing_token=fence,
        ttl=ttl,
        acquired_at=lease.acquired_at,
        local_deadline=local_deadline(reply, ttl, expires_at, lease.absolute_deadline, call),
        absolute_deadline=lease.absolute_deadline,
    )


def release_flow(
    key: str, lease: LockLease | LeaseRef, *, request_id: str | None, secrets: tuple[str, ...] = ()
) -> Flow[None]:
    """Release ``lease`` (a lease or a reference to one; 204, also when the lock is already gone)."""
    key = validate_key(key)
    ref = validate_ref(key, lease)
    call = _call("release", "DELETE", key, _request_id(request_id), on_lease=True, token=ref.token)
    reply = yield call
    _expect(call, reply, 204, (*secrets, ref.token))


def get_flow(key: str, *, request_id: str | None, secrets: tuple[str, ...] = ()) -> Flow[LockState]:
    """Read the state of ``key`` without a lock token."""
    key = validate_key(key)
    call = _call("get", "GET", key, _request_id(request_id), on_lease=False)
    reply = yield call
    _expect(call, reply, 200, secrets)
    body = _object(call, reply)
    held = body.get("held")
    if not isinstance(held, bool):
        raise ProtocolError(
            f"get: held {_show(held)} is not a boolean", status=reply.status, request_id=call.request_id
        )
    if not held:
        return LockState(held=False)
    return LockState(True, _expires_at(call, reply, body), _fencing_token(call, reply, body))


def force_release_flow(key: str, *, request_id: str | None, secrets: tuple[str, ...] = ()) -> Flow[None]:
    """Drop whatever lease holds ``key`` (204, also when absent)."""
    key = validate_key(key)
    call = _call("force_release", "DELETE", key, _request_id(request_id), on_lease=False)
    reply = yield call
    _expect(call, reply, 204, secrets)
