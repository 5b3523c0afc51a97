"""The request pipeline for the locks contract (LockApp), independent of the HTTP connection layer.

Order of checks for a request (each failure answers with the JSON error body `{"error", "code"}`):
route (404 unknown path, 405 + `Allow` for a method the path does not take; everything under
`/locks/` names a key, so `/locks/a/b` is a 400 invalid key, as is `%2F`), injected faults
(`when=before`), credentials (401/403, not counted), quota (429 + `Retry-After`, counted in the
store, so a store that fails or hangs is a 503 here already), body size (over 64 KiB: 400
`body_too_large`), request id, key, lock token, body, the service (409s; 503 `unavailable` when the
store fails), injected faults (`when=after`). The connection layer (`http11`) bounds what reaches here.

`/__admin/*` exists only when the app is given an admin key, and needs `Authorization: Bearer <admin key>`:
the server's own credential (`serve --admin` prints it as VOLCANO_ADMIN_KEY), never a project's key, which
gets a 403 however privileged it is. The request log it serves keeps at most 10,000 entries with paths cut
to 400 characters, and nothing at all when admin is off. `/__admin/clock` reads and moves the server's
clock when it is a `SkewedClock` (`{"jump": seconds}` steps it, `{"rate": r}` runs it fast or slow).

Each entry of the request log says what the service decided, for a model checker to replay: `key`,
`ttl`, `served` (the service's status, before any `when=after` fault replaced it), `answer` (its body),
`now_us` (the server clock reading the decision was made at) and `mono` / `mono_end` (this machine's
`time.monotonic()` just before and after the service ran: the decision happened in between). A history
file also gets a `recv` record when a lock request is routed, before anything can change: a server killed
with SIGKILL may have decided, unlogged, only requests it had received.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from .auth import AdminGate, Authenticator
from .clock import Clock, SkewedClock, check_clock_offset, check_clock_rate, system_clock
from .errors import ApiError, StoreUnavailable
from .faults import FaultAction, FaultInjector
from .quota import QuotaLimiter
from .requestlog import RequestLog
from .service import LockService, hash_token
from .validation import (
    MAX_BODY_BYTES,
    load_json_body,
    parse_ttl_body,
    validate_key,
    validate_request_id,
    validate_token,
)

__all__ = [
    "DROP",
    "LOGGED_PATH_CHARS",
    "LockApp",
    "Request",
    "Response",
    "error_response",
    "is_request_id",
    "method_not_allowed",
]

log = logging.getLogger("volcano_locks.server")

LOGGED_PATH_CHARS = 400
"""Paths are cut to this length in the request log: the longest valid lock path is 397 characters
(`/locks/` + 128 key characters percent-encoded as `%3A` + `/lease`)."""
_LOGGED_METHOD_CHARS = 16
_REQUEST_LOG_ENTRIES = 10_000

_LEASE_OPS = {"POST": "acquire", "PATCH": "renew", "DELETE": "release"}
_LOCK_OPS = {"GET": "get", "DELETE": "force_release"}


@dataclass(frozen=True, slots=True)
class Request:
    """One parsed HTTP request as the app sees it."""

    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes = b""
    body_too_large: bool = False


@dataclass(slots=True)
class Response:
    """A response to write, or `drop=True` to close the connection without answering."""

    status: int
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False


DROP = Response(0, drop=True)


def error_response(exc: ApiError) -> Response:
    """Build the contract's error response `{"error", "code"}` for `exc`."""
    return Response(exc.status, {"error": exc.message, "code": exc.code}, dict(exc.headers))


class LockApp:
    """The request pipeline: route, faults, auth, quota, validation, the service, faults, log."""

    def __init__(
        self,
        service: LockService,
        authenticator: Authenticator,
        quota: QuotaLimiter,
        faults: FaultInjector | None = None,
        *,
        admin_key: str | None = None,
        clock: Clock = system_clock,
        log_requests: bool = True,
        history: str | None = None,
    ) -> None:
        """Wire the pipeline; an `admin_key` exposes /__admin/faults, /requests and /clock behind it.

        `history` names a file every request's log entry is appended to (JSON lines), admin or not.
        """
        self.service = service
        self.authenticator = authenticator
        self.quota = quota
        self.faults = faults or FaultInjector()
        self._admin_gate = AdminGate(admin_key, authenticator) if admin_key is not None else None
        self.admin = self._admin_gate is not None
        self.clock = clock
        self.log_requests = log_requests
        # Only the admin endpoint reads the log; without it the log keeps nothing.
        self.requests = RequestLog(_REQUEST_LOG_ENTRIES if self.admin else 0, history)

    def handle(self, req: Request) -> Response:
        """Answer one request (never raises for anything about the request's shape)."""
        path = req.path.partition("?")[0]
        if path.startswith("/__admin/"):
            return self._admin(req, path)
        rid = req.headers.get("x-volcano-request-id")
        token = req.headers.get("x-volcano-lock-token")
        entry: dict[str, Any] = {
            "time": self.clock(),
            "method": req.method[:_LOGGED_METHOD_CHARS],
            "path": path[:LOGGED_PATH_CHARS],
            "op": None,
            "status": None,
            "request_id": rid[:64] if rid is not None else None,
            "token_sha256": hash_token(token)[:12] if token is not None else None,
            "project": None,
            "fault": None,
            "key": None,
            "ttl": None,
            "served": None,
            "answer": None,
            "now_us": None,
            "mono": None,
            "mono_end": None,
        }
        try:
            resp = self._handle_lock(req, path, entry)
        except Exception:  # a bug, not the caller's fault: answer 500 with the JSON body, and say so
            log.exception("internal error on %s %s", req.method[:_LOGGED_METHOD_CHARS], path[:200])
            resp = Response(500, {"error": "internal server error", "code": "internal_error"})
        entry["status"] = None if resp.drop else resp.status
        self.requests.add(entry)
        if self.log_requests:
            log.info(
                "%s %s %s request_id=%s",
                req.method[:_LOGGED_METHOD_CHARS],
                path[:300].encode("unicode_escape").decode("ascii"),
                "drop" if resp.drop else resp.status,
                rid if rid is not None and is_request_id(rid) else "-",
            )
        return resp

    def _handle_lock(self, req: Request, path: str, entry: dict[str, Any]) -> Response:
        if not path.startswith("/locks/"):
            return error_response(ApiError(404, "not_found", f"no such endpoint: {path[:100]!r}"))
        rest = path[len("/locks/") :]
        if rest.endswith("/lease"):
            raw_key, ops = rest[: -len("/lease")], _LEASE_OPS
        else:
            raw_key, ops = rest, _LOCK_OPS
        op = ops.get(req.method)
        if op is None:
            allow = ", ".join(ops)
            return error_response(
                ApiError(
                    405,
                    "method_not_allowed",
                    f"method {req.method} is not allowed here; use {allow}",
                    headers={"Allow": allow},
                )
            )
        entry["op"] = op
        # Received: what a model checker needs to know which requests a killed server may have decided
        # without logging them (those it had received, and had not logged, when it died).
        self.requests.note(
            {
                "ev": "recv",
                "op": op,
                "request_id": entry["request_id"],
                "token_sha256": entry["token_sha256"],
                "mono": time.monotonic(),
            }
        )

        before = self.faults.decide(op, "before") if self.faults.enabled() else None
        if before is not None and before.fired:
            entry["fault"] = ",".join(before.fired)
            faulted = self._apply_fault(before)
            if faulted is not None:
                return faulted

        self.service.decision_time()  # forget a decision this thread made for an earlier request
        entry["mono"] = time.monotonic()
        resp = self._serve_op(req, op, raw_key, entry, grant_held=before is not None and before.grant_held)
        entry["mono_end"] = time.monotonic()
        entry["now_us"] = self.service.decision_time()
        entry["served"], entry["answer"] = resp.status, resp.body

        after = self.faults.decide(op, "after") if self.faults.enabled() else None
        if after is not None and after.fired:
            entry["fault"] = ",".join(filter(None, [entry["fault"], *after.fired]))
            faulted = self._apply_fault(after)
            if faulted is not None:
                return faulted
        return resp

    @staticmethod
    def _apply_fault(action: FaultAction) -> Response | None:
        if action.delay > 0:
            time.sleep(action.delay)
        if action.drop:
            return DROP
        if action.status is not None:
            headers = {}
            code = "injected_fault"
            if action.status == 429:
                headers["Retry-After"] = "1"
                code = "lock_rate_limited"
            elif action.status == 503:
                code = "unavailable"
            return Response(
                action.status, {"error": f"injected fault (status {action.status})", "code": code}, headers
            )
        return None

    def _serve_op(
        self, req: Request, op: str, raw_key: str, entry: dict[str, Any], *, grant_held: bool = False
    ) -> Response:
        try:
            principal = self.authenticator.authenticate(req.headers.get("authorization"))
            entry["project"] = principal.project
            retry_after = self.quota.hit(principal.project)
            if retry_after is not None:
                raise ApiError(
                    429,
                    "lock_rate_limited",
                    f"rate limit of {self.quota.limit} lock requests per minute reached for this project",
                    headers={"Retry-After": str(retry_after)},
                )
            if req.body_too_large:
                raise _body_too_large()
            validate_request_id(req.headers.get("x-volcano-request-id"))
            key = validate_key(unquote(raw_key, errors="strict"))
            entry["key"] = key
            project = principal.project
            if op == "get":
                return Response(200, self.service.read(project, key).to_json())
            if op == "force_release":
                self.service.force_release(project, key)
                return Response(204)
            token = validate_token(req.headers.get("x-volcano-lock-token"))
            if op == "release":
                self.service.release(project, key, token)
                return Response(204)
            ttl = parse_ttl_body(req.body)
            entry["ttl"] = ttl
            if op == "acquire":
                lease = self.service.acquire(project, key, token, ttl, ignore_holder=grant_held)
                return Response(201, lease.to_json())
            return Response(200, self.service.renew(project, key, token, ttl).to_json())
        except UnicodeDecodeError:
            return error_response(
                ApiError(400, "invalid_key", f"lock key {raw_key[:80]!r} is not valid percent-encoded UTF-8")
            )
        except ApiError as exc:
            return error_response(exc)
        except StoreUnavailable as exc:
            log.warning("lock store unavailable: %s", exc)
            return Response(
                503, {"error": "lock store unavailable; lock operations fail closed", "code": "unavailable"}
            )

    def _admin(self, req: Request, path: str) -> Response:
        if self._admin_gate is None:
            return error_response(ApiError(404, "not_found", f"no such endpoint: {path[:100]!r}"))
        try:
            self._admin_gate.check(req.headers.get("authorization"))
            return self._admin_op(req, path)
        except ApiError as exc:
            return error_response(exc)
        except Exception:  # a bug: the admin caller still gets an answer
            log.exception("internal error on admin %s %s", req.method[:_LOGGED_METHOD_CHARS], path[:200])
            return Response(500, {"error": "internal server error", "code": "internal_error"})

    def _admin_op(self, req: Request, path: str) -> Response:
        if path == "/__admin/faults":
            if req.method == "GET":
                return Response(200, {"faults": self.faults.spec})
            if req.method == "PUT":
                if req.body_too_large:
                    raise _body_too_large()
                doc = load_json_body(req.body or b"null", "invalid_faults")
                spec = doc.get("faults") if isinstance(doc, dict) else None
                if spec is not None and not isinstance(spec, str):
                    raise ApiError(400, "invalid_faults", 'body must be {"faults": "<spec>"}')
                try:
                    self.faults.set(spec)
                except ValueError as exc:
                    raise ApiError(400, "invalid_faults", str(exc)) from None
                log.info("faults set to %r", self.faults.spec)
                return Response(200, {"faults": self.faults.spec})
            return method_not_allowed(req.method, "GET, PUT")
        if path == "/__admin/clock":
            return self._admin_clock(req)
        if path == "/__admin/requests":
            if req.method == "GET":
                return Response(200, {"requests": self.requests.entries()})
            if req.method == "DELETE":
                self.requests.clear()
                return Response(204)
            return method_not_allowed(req.method, "GET, DELETE")
        return error_response(ApiError(404, "not_found", f"no such admin endpoint: {path[:100]!r}"))

    def _admin_clock(self, req: Request) -> Response:
        clock = self.clock
        if not isinstance(clock, SkewedClock):
            raise ApiError(
                409, "clock_fixed", "this server's clock cannot be moved (it is not a SkewedClock)"
            )
        if req.method == "GET":
            return Response(200, clock.state())
        if req.method != "PUT":
            return method_not_allowed(req.method, "GET, PUT")
        if req.body_too_large:
            raise _body_too_large()
        jump, rate = _clock_change(req.body)
        try:  # both checked before either applies: a bad request changes nothing
            jump = None if jump is None else check_clock_offset(jump)
            rate = None if rate is None else check_clock_rate(rate)
        except ValueError as exc:
            raise ApiError(400, "invalid_clock", str(exc)) from None
        if rate is not None:
            clock.set_rate(rate)
        if jump is not None:
            clock.jump(jump)
        state = clock.state()
        log.info(
            "clock moved: jump %s, rate %s; now offset %+.3f s, rate %g",
            jump,
            rate,
            state["offset"],
            state["rate"],
        )
        self.requests.note({"ev": "clock", "jump": jump, "rate": rate, "mono": time.monotonic(), **state})
        return Response(200, state)


def _clock_change(body: bytes) -> tuple[float | None, float | None]:
    doc = load_json_body(body or b"null", "invalid_clock")
    if not isinstance(doc, dict) or not doc or set(doc) - {"jump", "rate"}:
        raise ApiError(
            400, "invalid_clock", 'body must be {"jump": seconds} and/or {"rate": times real time}'
        )
    values: list[float | None] = []
    for name in ("jump", "rate"):
        value = doc.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
        ):
            raise ApiError(400, "invalid_clock", f"{name} {value!r} is not a finite number")
        values.append(None if value is None else float(value))
    return values[0], values[1]


def _body_too_large() -> ApiError:
    return ApiError(400, "body_too_large", f"request body is larger than {MAX_BODY_BYTES} bytes")


def method_not_allowed(method: str, allow: str) -> Response:
    """A 405 `method_not_allowed` naming the method, with the `Allow` header."""
    return error_response(
        ApiError(
            405,
            "method_not_allowed",
            f"method {method} is not allowed here; use {allow}",
            headers={"Allow": allow},
        )
    )


def is_request_id(value: str) -> bool:
    """Whether `value` is a well-formed request id (a UUID), safe to echo back."""
    try:
        validate_request_id(value)
    except ApiError:
        return False
    return True
