"""The server's HTTP/1.1 connection layer: h11 parses, this module bounds connections, heads, bodies and time.

h11 (the sans-I/O HTTP/1.1 library httpx is built on) turns bytes into requests and responses into bytes,
and rejects what RFC 9112 calls malformed (a space before a header's colon, a non-digit Content-Length,
conflicting lengths, a missing Host) as its `RemoteProtocolError`, answered here with a 400. A body is
framed by its Content-Length whatever the method, so the bytes of a `HEAD` body are never read as a
second request. This module owns everything h11 leaves to its caller, and bounds every resource a client
can make the server hold (see `Limits`):

- connections (one thread each): at most `max_connections`, lowered to fit the open-file limit. At the cap a
  new connection displaces the connection idle longest between requests, else one that has spent over a
  second sending its request (a legitimate client sends a request in milliseconds); a request being
  answered is never displaced. If none can go, the new connection gets a 503 and is closed.
- memory per request: the request line at most `max_line` bytes (414), each header line too (431), the
  whole head at most `max_head` bytes (h11's `max_incomplete_event_size`) and `max_headers` lines (431),
  the body `MAX_BODY_BYTES` (400; up to 16 MiB are drained so the connection stays usable, larger bodies
  are refused unread).
- time: once a request's first byte arrives, its head and body must all arrive within `request_timeout`
  seconds, however the bytes trickle in (408, then close); a connection waits at most `idle_timeout` for
  the next request.
- accept: at the open-file limit (EMFILE) the accept loop frees an idle connection and pauses instead of
  spinning.

Repeated identity headers (Authorization, the lock token and request id) are a 400, as h11 makes repeated
Host and conflicting Content-Length; a Transfer-Encoding (chunked bodies) is a 400 `invalid_body`. A `drop`
fault closes the connection without writing anything.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import re
import socket
import socketserver
import sys
import threading
import time
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

import h11

from .app import LockApp, Request, Response, error_response, is_request_id, method_not_allowed
from .errors import ApiError
from .validation import MAX_BODY_BYTES

__all__ = ["Limits", "LockHTTPServer", "build_server", "serve_in_thread"]

log = logging.getLogger("volcano_locks.server")

# A body larger than MAX_BODY_BYTES is read and discarded up to this size so the client still gets
# its 400 on a healthy connection; beyond it the connection is closed after the 400.
_DRAIN_LIMIT = 16 * 1024 * 1024
# A connection that has been sending one request for longer than this is slow enough to be displaced
# by a new connection when the server is full; real clients send a whole request in one write.
_SLOW_SENDER = 1.0
# File descriptors kept free for everything that is not a client connection (database files or
# connections, logs, the listening socket).
_FD_RESERVE = 48
_RECV = 65536
# h11 already refuses a repeated Host and conflicting Content-Length values (identical ones are one value,
# as RFC 9110 8.6 allows); these say who is asking and for which lease, so two of them are ambiguous.
_REPEAT_FORBIDDEN = frozenset({"authorization", "x-volcano-lock-token", "x-volcano-request-id"})
_DISPATCHED = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"})
_ALLOWED = "GET, POST, PATCH, DELETE"
# h11's messages quote the offending bytes (which may be a credential): keep only the words before them.
_QUOTED = re.compile(r":?\s*(?:b'|b\"|bytearray\().*", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what one client can make the server hold (see the module docstring)."""

    max_connections: int = 128
    request_timeout: float = 10.0
    idle_timeout: float = 15.0
    max_line: int = 8192
    max_head: int = 16384
    max_headers: int = 100

    def __post_init__(self) -> None:
        """Reject limits that cannot work, naming the value."""
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        for name in ("request_timeout", "idle_timeout"):
            value = getattr(self, name)
            if not 0 < value <= 3600:
                raise ValueError(f"{name} must be 0 < seconds <= 3600, got {value!r}")


class _Reject(Exception):
    """End the request with this error response and close the connection."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.response = error_response(ApiError(status, code, message))


class _Gone(Exception):
    """The client went away, or the connection was displaced: close without answering."""


_IDLE, _SENDING, _BUSY = "idle", "sending", "busy"


class _Conn:
    """One client connection: its socket, its h11 state, and what it is doing (for displacement)."""

    __slots__ = ("displaced", "h11", "lock", "pending", "since", "sock", "state")

    def __init__(self, sock: socket.socket, max_head: int) -> None:
        self.sock = sock
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head)
        self.lock = threading.Lock()
        self.state = _IDLE
        self.since = time.monotonic()
        self.pending = False  # bytes of a next request already received (not idle, even between requests)
        self.displaced = False

    def set_state(self, state: str) -> None:
        with self.lock:
            if self.displaced:
                raise _Gone
            self.state = state
            self.since = time.monotonic()

    def displace(self) -> None:
        """Wake the thread serving this connection with an EOF; it then closes the socket."""
        with self.lock:
            self.displaced = True
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)

    def fill(self, deadline: float) -> bytes:
        """Receive bytes before `deadline` (b"" on EOF or displacement). Raises TimeoutError when late."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        self.sock.settimeout(remaining)
        data = self.sock.recv(_RECV)
        return b"" if self.displaced else data


class LockHTTPServer(socketserver.TCPServer):
    """An HTTP/1.1 server for one LockApp: a thread per connection, every resource bounded."""

    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], app: LockApp, limits: Limits | None = None) -> None:
        """Bind `address` (port 0 picks a free port) and serve `app` within `limits`."""
        self.app = app
        self.limits = limits or Limits()
        self.max_connections = _fit_fd_limit(self.limits.max_connections)
        self._conns: set[_Conn] = set()
        self._conns_lock = threading.Lock()
        self._last_fd_warning = 0.0
        super().__init__(address, socketserver.BaseRequestHandler)

    @property
    def url(self) -> str:
        """The base URL clients should use."""
        host, port = self.server_address[:2]
        host = host if isinstance(host, str) else host.decode()
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}"

    def connection_count(self) -> int:
        """How many client connections are open now."""
        with self._conns_lock:
            return len(self._conns)

    def get_request(self) -> tuple[Any, Any]:
        """Accept a connection; at the open-file limit free an idle connection and pause, never spin."""
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                now = time.monotonic()
                if now - self._last_fd_warning > 10:
                    self._last_fd_warning = now
                    log.warning("cannot accept connections: %s; freeing idle connections", exc.strerror)
                with self._conns_lock:
                    victim = self._pick_victim(idle_only=True)
                    if victim is not None:
                        self._conns.discard(victim)
                if victim is not None:
                    victim.displace()
                # The listening socket stays readable while the limit lasts: pause instead of spinning.
                time.sleep(0.05)
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        """Admit the connection (displacing an idle or slow one at the cap) and serve it on a thread."""
        sock: socket.socket = request
        conn = _Conn(sock, self.limits.max_head)
        with self._conns_lock:
            victim = None
            if len(self._conns) >= self.max_connections:
                victim = self._pick_victim(idle_only=False)
                if victim is None:
                    self._refuse(sock)
                    return
                self._conns.discard(victim)
            self._conns.add(conn)
        if victim is not None:
            victim.displace()
        thread = threading.Thread(
            target=self._serve_conn, args=(conn,), name="volcano-locks-conn", daemon=True
        )
        try:
            thread.start()
        except RuntimeError:  # cannot start a thread: refuse rather than die
            with self._conns_lock:
                self._conns.discard(conn)
            self._refuse(sock)

    def _pick_victim(self, *, idle_only: bool) -> _Conn | None:
        idle = [c for c in self._conns if c.state == _IDLE and not c.pending]
        if idle:
            return min(idle, key=lambda c: c.since)
        if idle_only:
            return None
        slow_before = time.monotonic() - _SLOW_SENDER
        slow = [c for c in self._conns if c.state == _SENDING and c.since < slow_before]
        return min(slow, key=lambda c: c.since) if slow else None

    def _refuse(self, sock: socket.socket) -> None:
        # Runs on the accept thread, which must never block on a client.
        resp = Response(
            503,
            {"error": f"server busy: all {self.max_connections} connections in use", "code": "unavailable"},
            {"Retry-After": "1"},
        )
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(_encode(h11.Connection(h11.SERVER), resp, None, close=True))
        with contextlib.suppress(OSError):
            sock.close()

    def _serve_conn(self, conn: _Conn) -> None:
        try:
            _Exchange(self, conn).run()
        except (_Gone, OSError):
            pass
        except Exception:  # a bug: log it and close this connection, never the server
            log.exception("internal error serving a connection")
        finally:
            with self._conns_lock:
                self._conns.discard(conn)
            with contextlib.suppress(OSError):
                conn.sock.close()

    def server_close(self) -> None:
        """Stop listening and end every open connection."""
        super().server_close()
        with self._conns_lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            conn.displace()


class _Exchange:
    """The request loop of one connection: h11 events in, the app's responses out, within the limits."""

    def __init__(self, server: LockHTTPServer, conn: _Conn) -> None:
        self.server = server
        self.conn = conn
        self.h11 = conn.h11
        self.limits = server.limits
        # The first bytes of a request head still being received, until its request line has ended.
        self._line: bytearray | None = None

    def run(self) -> None:
        conn = self.conn
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            conn.pending = bool(self.h11.trailing_data[0])
            conn.set_state(_IDLE)
            self._line = bytearray()
            first = b""
            if not conn.pending:
                try:
                    first = conn.fill(time.monotonic() + self.limits.idle_timeout)
                except TimeoutError:
                    return
                if not first:
                    return
            conn.set_state(_SENDING)
            deadline = time.monotonic() + self.limits.request_timeout
            try:
                if first:
                    self._receive(first)
                keep = self._one_request(deadline)
            except _Reject as rej:
                self._send(rej.response, None, close=True)
                return
            except h11.RemoteProtocolError as exc:
                self._send(_malformed(exc, self.limits.max_head), None, close=True)
                return
            except TimeoutError:
                message = f"request not received within {self.limits.request_timeout:g} s"
                self._send(error_response(ApiError(408, "request_timeout", message)), None, close=True)
                return
            if not keep:
                return
            self.h11.start_next_cycle()

    def _receive(self, data: bytes) -> None:
        """Hand `data` to h11, first checking the request line's length while it is still arriving."""
        line = self._line
        if line is not None:
            limit = self.limits.max_line + 2  # the line and its CRLF
            line += data[: limit - len(line)]
            if b"\n" in line:
                self._line = None
            elif len(line) >= limit:
                raise _Reject(414, "bad_request", f"request line longer than {self.limits.max_line} bytes")
        self.h11.receive_data(data)

    def _next_event(self, deadline: float, *, in_body: bool) -> Any:
        """The next h11 event, receiving bytes until one is complete (EOF mid-body: the client is gone)."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = self.conn.fill(deadline)
            if not data and in_body:
                raise _Gone
            self._receive(data)

    def _read_head(self, deadline: float) -> tuple[str, str, dict[str, str]]:
        """Method, target and headers (lower-cased names) of the next request, within the limits."""
        event = self._next_event(deadline, in_body=False)
        if not isinstance(event, h11.Request):  # ConnectionClosed; PAUSED cannot happen (cycles are answered)
            raise _Gone
        limits = self.limits
        if len(event.target) + len(event.method) + 10 > limits.max_line:
            raise _Reject(414, "bad_request", f"request line longer than {limits.max_line} bytes")
        if not event.http_version.startswith(b"1."):
            raise _Reject(400, "bad_request", "bad request line (expected METHOD PATH HTTP/1.x)")
        if len(event.headers) > limits.max_headers:
            raise _Reject(431, "bad_request", f"more than {limits.max_headers} header lines")
        headers: dict[str, str] = {}
        for raw_name, raw_value in event.headers:
            if len(raw_name) + len(raw_value) + 2 > limits.max_line:
                raise _Reject(431, "bad_request", f"header line longer than {limits.max_line} bytes")
            name = raw_name.decode("ascii")  # h11 lower-cases names and allows only token characters
            if name in headers and name in _REPEAT_FORBIDDEN:
                raise _Reject(400, "bad_request", f"repeated {name} header")
            headers[name] = raw_value.decode("iso-8859-1")
        return event.method.decode("ascii"), event.target.decode("iso-8859-1"), headers

    def _one_request(self, deadline: float) -> bool:
        """Read, answer and return whether the connection stays open."""
        method, target, headers = self._read_head(deadline)
        if method not in _DISPATCHED and method != "HEAD":
            # An unknown method's body framing is not ours to guess: answer and close.
            return self._send(method_not_allowed(method[:16], _ALLOWED), headers, close=True)
        if "transfer-encoding" in headers:
            raise _Reject(400, "invalid_body", "chunked request bodies are not supported")
        length = int(headers.get("content-length", "0"))  # h11 checked it is 1-20 ASCII digits
        if self.h11.they_are_waiting_for_100_continue and length <= _DRAIN_LIMIT:
            self.conn.sock.sendall(self.h11.send(h11.InformationalResponse(status_code=100, headers=[])))
        too_large = length > MAX_BODY_BYTES
        # Beyond the drain limit the body is refused unread, and the connection closes after the answer.
        body = self._read_body(deadline, keep=not too_large) if length <= _DRAIN_LIMIT else b""
        if method == "HEAD":  # its body (if any) is read above, so it cannot pose as the next request
            return self._send(method_not_allowed("HEAD", _ALLOWED), headers, close=False, head=True)
        self.conn.set_state(_BUSY)
        resp = self.server.app.handle(Request(method, target, headers, body, body_too_large=too_large))
        if resp.drop:
            with contextlib.suppress(OSError):
                self.conn.sock.shutdown(socket.SHUT_RDWR)
            return False
        return self._send(resp, headers, close=False)

    def _read_body(self, deadline: float, *, keep: bool) -> bytes:
        """The request body up to its end; with keep=False it is drained (counted, not kept)."""
        chunks: list[bytes] = []
        while True:
            event = self._next_event(deadline, in_body=True)
            if isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
            if isinstance(event, h11.Data) and keep:
                chunks.append(bytes(event.data))

    def _send(
        self, resp: Response, headers: dict[str, str] | None, *, close: bool, head: bool = False
    ) -> bool:
        """Write `resp`; whether the connection can carry another request."""
        sock = self.conn.sock
        sock.settimeout(self.limits.request_timeout)
        if self.h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return False  # nothing more can be said on this connection
        # A body not read to its end leaves the connection unusable for another request.
        close = close or self.h11.their_state not in (h11.DONE, h11.IDLE)
        try:
            sock.sendall(_encode(self.h11, resp, headers, close=close, head=head))
        except OSError:
            return False
        return set(self.h11.states.values()) == {h11.DONE}  # both sides done: ready for the next cycle


def _malformed(exc: h11.RemoteProtocolError, max_head: int) -> Response:
    """The 400 (or 431) for a request h11 refused, naming the rule and never the bytes."""
    if exc.error_status_hint == 431:
        return error_response(ApiError(431, "bad_request", f"request head larger than {max_head} bytes"))
    reason = _QUOTED.sub("", str(exc)).strip() or "malformed request"
    framing = "content-length" in reason.lower() or "transfer-encoding" in reason.lower()
    code = "invalid_body" if framing else "bad_request"
    return error_response(ApiError(400, code, f"malformed HTTP/1.1 request (RFC 9112): {reason}"))


def _encode(
    conn: h11.Connection, resp: Response, headers: dict[str, str] | None, *, close: bool, head: bool = False
) -> bytes:
    """The bytes of `resp` through `conn` (h11 frames it; HEAD answers carry the headers only)."""
    payload = b"" if resp.body is None else json.dumps(resp.body, separators=(",", ":")).encode()
    try:
        reason = HTTPStatus(resp.status).phrase.encode("ascii")
    except ValueError:
        reason = b"Error"
    # Bytes, not str: h11 validates every header either way, and converting each str costs as much again.
    lines = [(b"Date", formatdate(usegmt=True).encode("ascii")), (b"Server", b"volcano-locks")]
    if resp.body is not None:
        lines.append((b"Content-Type", b"application/json"))
    if resp.status != 204:
        lines.append((b"Content-Length", b"%d" % len(payload)))
    rid = headers.get("x-volcano-request-id") if headers is not None else None
    if rid is not None and is_request_id(rid):
        lines.append((b"X-Volcano-Request-Id", rid.encode("ascii")))
    lines.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in resp.headers.items())
    if close:
        lines.append((b"Connection", b"close"))
    out = conn.send(h11.Response(status_code=resp.status, headers=lines, reason=reason))
    if payload and not head:
        out += conn.send(h11.Data(data=payload))
    return out + conn.send(h11.EndOfMessage())


def _fit_fd_limit(wanted: int) -> int:
    """Lower the connection cap so connections cannot exhaust this process's open-file limit."""
    if sys.platform == "win32":
        return wanted
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    fitted = min(wanted, max(4, soft - _FD_RESERVE))
    if fitted < wanted:
        log.warning("open-file limit %d: at most %d client connections (wanted %d)", soft, fitted, wanted)
    return fitted


def build_server(host: str, port: int, app: LockApp, limits: Limits | None = None) -> LockHTTPServer:
    """Bind a LockHTTPServer for `app` on (host, port); call `serve_forever()` to run it."""
    return LockHTTPServer((host, port), app, limits)


def serve_in_thread(server: LockHTTPServer) -> threading.Thread:
    """Run `server.serve_forever()` on a daemon thread and return the thread."""
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="volcano-locks-http", daemon=True
    )
    thread.start()
    return thread
