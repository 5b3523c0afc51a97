"""HTTP for the locks contract: routing and the request pipeline (LockApp) on stdlib http.server.

Order of checks for a request (each failure answers with the JSON error body `{"error", "code"}`):
route (404 unknown path, 405 + `Allow` for a method the path does not take; everything under
`/locks/` names a key, so `/locks/a/b` is a 400 invalid key, as is `%2F`), injected faults
(`when=before`), credentials (401/403, not counted), quota (429 + `Retry-After`, counted in the
store, so a store that fails or hangs is a 503 here already), body size
(over 64 KiB: 400 `body_too_large`; bodies up to 16 MiB are drained so the connection stays usable,
larger ones get the 400 and `Connection: close`), request id, key, lock token, body, the service
(409s; 503 `unavailable` when the store fails), injected faults (`when=after`). Chunked bodies are 400.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from .auth import Authenticator
from .clock import Clock, system_clock
from .errors import ApiError, StoreUnavailable
from .faults import FaultAction, FaultInjector
from .quota import QuotaLimiter
from .requestlog import RequestLog
from .service import LockService, hash_token
from .validation import (
    MAX_BODY_BYTES,
    parse_ttl_body,
    validate_key,
    validate_request_id,
    validate_token,
)

__all__ = ["DROP", "LockApp", "LockHTTPServer", "Request", "Response", "build_server"]

log = logging.getLogger("volcano_locks.server")

# A body larger than MAX_BODY_BYTES is read and discarded up to this size so the client still gets
# its 400 on a healthy connection; beyond it the connection is closed after the 400.
_DRAIN_LIMIT = 16 * 1024 * 1024

_MAX_LINE = 65536
_MAX_HEADERS = 100

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
        admin: bool = False,
        clock: Clock = system_clock,
        log_requests: bool = True,
    ) -> None:
        """Wire the pipeline; `admin` exposes /__admin/faults and /__admin/requests."""
        self.service = service
        self.authenticator = authenticator
        self.quota = quota
        self.faults = faults or FaultInjector()
        self.admin = admin
        self.clock = clock
        self.log_requests = log_requests
        self.requests = RequestLog()

    def handle(self, req: Request) -> Response:
        """Answer one request (never raises for anything about the request's shape)."""
        path = req.path.partition("?")[0]
        if path.startswith("/__admin/"):
            return self._admin(req, path)
        rid = req.headers.get("x-volcano-request-id")
        token = req.headers.get("x-volcano-lock-token")
        entry: dict[str, Any] = {
            "time": self.clock(),
            "method": req.method,
            "path": path,
            "op": None,
            "status": None,
            "request_id": rid[:64] if rid is not None else None,
            "token_sha256": hash_token(token)[:12] if token is not None else None,
            "project": None,
            "fault": None,
        }
        try:
            resp = self._handle_lock(req, path, entry)
        except Exception:  # a bug, not the caller's fault: answer 500 with the JSON body, and say so
            log.exception("internal error on %s %s", req.method, path[:200])
            resp = Response(500, {"error": "internal server error", "code": "internal_error"})
        entry["status"] = None if resp.drop else resp.status
        self.requests.add(entry)
        if self.log_requests:
            log.info(
                "%s %s %s request_id=%s",
                req.method,
                path[:300].encode("unicode_escape").decode("ascii"),
                "drop" if resp.drop else resp.status,
                rid if rid is not None and _is_uuid(rid) else "-",
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

        before = self.faults.decide(op, "before") if self.faults.enabled() else None
        if before is not None and before.fired:
            entry["fault"] = ",".join(before.fired)
            faulted = self._apply_fault(before)
            if faulted is not None:
                return faulted

        resp = self._serve_op(req, op, raw_key, entry)

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

    def _serve_op(self, req: Request, op: str, raw_key: str, entry: dict[str, Any]) -> Response:
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
                raise ApiError(400, "body_too_large", f"request body is larger than {MAX_BODY_BYTES} bytes")
            validate_request_id(req.headers.get("x-volcano-request-id"))
            key = validate_key(unquote(raw_key, errors="strict"))
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
            if op == "acquire":
                return Response(201, self.service.acquire(project, key, token, ttl).to_json())
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
        if not self.admin:
            return error_response(ApiError(404, "not_found", f"no such endpoint: {path[:100]!r}"))
        if path == "/__admin/faults":
            if req.method == "GET":
                return Response(200, {"faults": self.faults.spec})
            if req.method == "PUT":
                try:
                    doc = json.loads(req.body or b"null")
                    spec = doc.get("faults") if isinstance(doc, dict) else None
                    if spec is not None and not isinstance(spec, str):
                        raise ValueError('body must be {"faults": "<spec>"}')
                    self.faults.set(spec)
                except ValueError as exc:
                    return error_response(ApiError(400, "invalid_faults", str(exc)))
                log.info("faults set to %r", self.faults.spec)
                return Response(200, {"faults": self.faults.spec})
            return _method_not_allowed(req.method, "GET, PUT")
        if path == "/__admin/requests":
            if req.method == "GET":
                return Response(200, {"requests": self.requests.entries()})
            if req.method == "DELETE":
                self.requests.clear()
                return Response(204)
            return _method_not_allowed(req.method, "GET, DELETE")
        return error_response(ApiError(404, "not_found", f"no such admin endpoint: {path[:100]!r}"))


def _method_not_allowed(method: str, allow: str) -> Response:
    return error_response(
        ApiError(
            405,
            "method_not_allowed",
            f"method {method} is not allowed here; use {allow}",
            headers={"Allow": allow},
        )
    )


def _is_uuid(value: str) -> bool:
    try:
        validate_request_id(value)
    except ApiError:
        return False
    return True


class _Handler(BaseHTTPRequestHandler):
    """Adapts http.server to LockApp: keep-alive HTTP/1.1, bounded bodies, JSON errors, real drops."""

    protocol_version = "HTTP/1.1"
    server_version = "volcano-locks"
    sys_version = ""
    timeout = 120  # idle keep-alive connections end after this many seconds
    server: LockHTTPServer

    lower_headers: dict[str, str]
    raw_requestline: bytes  # set by handle_one_request before parse_request

    def setup(self) -> None:
        super().setup()
        self.lower_headers = {}
        # Responses are written in one send; disable Nagle so keep-alive round trips are not delayed.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def parse_request(self) -> bool:
        """Parse the request line and headers (a lean replacement for http.server's email-based parser)."""
        self.command = ""
        self.request_version = "HTTP/0.9"
        self.close_connection = True
        self.lower_headers = {}
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if len(words) != 3 or not words[2].startswith("HTTP/1."):
            self.send_error(HTTPStatus.BAD_REQUEST, "bad request line (expected METHOD PATH HTTP/1.x)")
            return False
        self.command, self.path, self.request_version = words
        headers: dict[str, str] = {}
        for _ in range(_MAX_HEADERS + 1):
            line = self.rfile.readline(_MAX_LINE + 1)
            if line in (b"\r\n", b"\n", b""):
                break
            if len(line) > _MAX_LINE:
                self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "header line too long")
                return False
            name, sep, value = str(line, "iso-8859-1").partition(":")
            if not sep or not name.strip():
                self.send_error(HTTPStatus.BAD_REQUEST, "malformed header line")
                return False
            headers[name.strip().lower()] = value.strip()
        else:
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too many headers")
            return False
        self.lower_headers = headers
        connection = headers.get("connection", "").lower()
        self.close_connection = connection == "close" or (
            self.request_version == "HTTP/1.0" and connection != "keep-alive"
        )
        if headers.get("expect", "").lower() == "100-continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return True

    def _dispatch(self) -> None:
        app = self.server.app
        headers = self.lower_headers
        if "transfer-encoding" in headers:
            self.close_connection = True
            self._write(
                error_response(ApiError(400, "invalid_body", "chunked request bodies are not supported"))
            )
            return
        try:
            length = int(headers.get("content-length", "0") or "0")
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            self._write(error_response(ApiError(400, "invalid_body", "invalid Content-Length header")))
            return
        too_large = length > MAX_BODY_BYTES
        body = b""
        if too_large:
            if length > _DRAIN_LIMIT:
                self.close_connection = True
            else:
                remaining = length
                while remaining > 0:
                    chunk = self.rfile.read(min(remaining, 65536))
                    if not chunk:
                        self.close_connection = True
                        return
                    remaining -= len(chunk)
        elif length:
            body = self.rfile.read(length)
            if len(body) < length:  # the client went away mid-body
                self.close_connection = True
                return
        resp = app.handle(Request(self.command, self.path, headers, body, too_large))
        if resp.drop:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._write(resp)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_TRACE = do_CONNECT = _dispatch

    def do_HEAD(self) -> None:
        self._write(_method_not_allowed("HEAD", "GET, POST, PATCH, DELETE"), head=True)

    def _write(self, resp: Response, *, head: bool = False) -> None:
        payload = b"" if resp.body is None else json.dumps(resp.body, separators=(",", ":")).encode()
        try:
            reason = HTTPStatus(resp.status).phrase
        except ValueError:
            reason = "Error"
        lines = [
            f"HTTP/1.1 {resp.status} {reason}",
            f"Date: {formatdate(usegmt=True)}",
            "Server: volcano-locks",
        ]
        if resp.body is not None:
            lines.append("Content-Type: application/json")
        if resp.status != 204:
            lines.append(f"Content-Length: {len(payload)}")
        rid = self.lower_headers.get("x-volcano-request-id")
        if rid is not None and _is_uuid(rid):
            lines.append(f"X-Volcano-Request-Id: {rid}")
        lines.extend(f"{k}: {v}" for k, v in resp.headers.items())
        if self.close_connection:
            lines.append("Connection: close")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else payload)
        try:
            self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Answer http.server's own protocol errors with the JSON error body too."""
        self.close_connection = True
        if code == HTTPStatus.NOT_IMPLEMENTED:  # an HTTP method we do not know at all
            resp = _method_not_allowed(self.command or "?", "GET, POST, PATCH, DELETE")
        else:
            resp = error_response(ApiError(code, "bad_request", message or HTTPStatus(code).phrase))
        self._write(resp)

    def log_message(self, format: str, *args: Any) -> None:
        """Silence http.server's access log; LockApp logs one line per request without secrets."""


class LockHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server bound to one LockApp."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], app: LockApp) -> None:
        """Bind `address` (port 0 picks a free port) and serve `app`."""
        self.app = app
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        """The base URL clients should use."""
        host, port = self.server_address[:2]
        host = host if isinstance(host, str) else host.decode()
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}"


def build_server(host: str, port: int, app: LockApp) -> LockHTTPServer:
    """Bind a LockHTTPServer for `app` on (host, port); call `serve_forever()` to run it."""
    return LockHTTPServer((host, port), app)


def serve_in_thread(server: LockHTTPServer) -> threading.Thread:
    """Run `server.serve_forever()` on a daemon thread and return the thread."""
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="volcano-locks-http", daemon=True
    )
    thread.start()
    return thread
