"""The server's HTTP/1.1 connection layer: bounded connections, bounded request heads, a total send time.

Every resource a client can make the server hold is bounded (see `Limits`):

- connections (one thread each): at most `max_connections`, lowered to fit the open-file limit. At the cap a
  new connection displaces the connection idle longest between requests, else one that has spent over a
  second sending its request (a legitimate client sends a request in milliseconds); a request being
  answered is never displaced. If none can go, the new connection gets a 503 and is closed.
- memory per request: the request line and each header line at most `max_line` bytes (414/431), the whole
  head at most `max_head` bytes and `max_headers` lines (431), the body `MAX_BODY_BYTES` (400; up to 16 MiB
  are drained so the connection stays usable, larger bodies are refused unread).
- time: once a request's first byte arrives, its head and body must all arrive within `request_timeout`
  seconds, however the bytes trickle in (408, then close); a connection waits at most `idle_timeout` for
  the next request.
- accept: at the open-file limit (EMFILE) the accept loop frees an idle connection and pauses instead of
  spinning.

Repeated framing or identity headers (Content-Length, Authorization, the lock token and request id, Host,
Transfer-Encoding) are a 400. A `drop` fault closes the connection without writing anything.
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
_REPEAT_FORBIDDEN = frozenset(
    {
        "content-length",
        "authorization",
        "x-volcano-lock-token",
        "x-volcano-request-id",
        "host",
        "transfer-encoding",
    }
)
_DISPATCHED = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"})
_HEAD_END = re.compile(rb"\r?\n\r?\n")


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
    """One client connection: its socket, unread bytes, and what it is doing (for displacement)."""

    __slots__ = ("buf", "displaced", "lock", "since", "sock", "state")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.lock = threading.Lock()
        self.state = _IDLE
        self.since = time.monotonic()
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

    def fill(self, deadline: float) -> bool:
        """Receive more bytes into `buf` before `deadline`; False on EOF. Raises TimeoutError when late."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        self.sock.settimeout(remaining)
        data = self.sock.recv(_RECV)
        if not data or self.displaced:
            return False
        self.buf += data
        return True


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
        conn = _Conn(sock)
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
        idle = [c for c in self._conns if c.state == _IDLE and not c.buf]
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
            sock.send(_encode(resp, None, close=True))
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
    """The request loop of one connection."""

    def __init__(self, server: LockHTTPServer, conn: _Conn) -> None:
        self.server = server
        self.conn = conn
        self.limits = server.limits

    def run(self) -> None:
        conn = self.conn
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            conn.set_state(_IDLE)
            if not conn.buf:
                try:
                    if not conn.fill(time.monotonic() + self.limits.idle_timeout):
                        return
                except TimeoutError:
                    return
            conn.set_state(_SENDING)
            deadline = time.monotonic() + self.limits.request_timeout
            try:
                keep = self._one_request(deadline)
            except _Reject as rej:
                self._send(rej.response, None, close=True)
                return
            except TimeoutError:
                message = f"request not received within {self.limits.request_timeout:g} s"
                self._send(error_response(ApiError(408, "request_timeout", message)), None, close=True)
                return
            if not keep:
                return

    def _read_head(self, deadline: float) -> bytes:
        conn = self.conn
        start = 0
        while True:
            found = _HEAD_END.search(conn.buf, start)
            if found is not None:
                head = bytes(conn.buf[: found.start()])
                del conn.buf[: found.end()]
                return head
            if len(conn.buf) > self.limits.max_line and conn.buf.find(b"\n", 0, self.limits.max_line + 2) < 0:
                raise _Reject(414, "bad_request", f"request line longer than {self.limits.max_line} bytes")
            if len(conn.buf) > self.limits.max_head:
                raise _Reject(431, "bad_request", f"request head larger than {self.limits.max_head} bytes")
            start = max(0, len(conn.buf) - 3)
            if not conn.fill(deadline):
                if conn.buf.strip():
                    raise _Reject(400, "bad_request", "incomplete request head")
                raise _Gone

    def _parse_head(self, head: bytes) -> tuple[str, str, str, dict[str, str]]:
        limits = self.limits
        lines = head.split(b"\n")
        request_line = lines[0].rstrip(b"\r")
        if len(request_line) > limits.max_line:
            raise _Reject(414, "bad_request", f"request line longer than {limits.max_line} bytes")
        words = str(request_line, "iso-8859-1").split()
        if len(words) != 3 or not words[2].startswith("HTTP/1."):
            raise _Reject(400, "bad_request", "bad request line (expected METHOD PATH HTTP/1.x)")
        method, target, version = words
        if len(lines) - 1 > limits.max_headers:
            raise _Reject(431, "bad_request", f"more than {limits.max_headers} header lines")
        headers: dict[str, str] = {}
        for raw in lines[1:]:
            if len(raw) > limits.max_line:
                raise _Reject(431, "bad_request", f"header line longer than {limits.max_line} bytes")
            name, sep, value = str(raw.rstrip(b"\r"), "iso-8859-1").partition(":")
            name = name.strip().lower()
            if not sep or not name:
                raise _Reject(400, "bad_request", "malformed header line")
            if name in headers and name in _REPEAT_FORBIDDEN:
                raise _Reject(400, "bad_request", f"repeated {name} header")
            headers[name] = value.strip()
        return method, target, version, headers

    def _one_request(self, deadline: float) -> bool:
        """Read, answer and return whether the connection stays open."""
        method, target, version, headers = self._parse_head(self._read_head(deadline))
        connection = headers.get("connection", "").lower()
        close = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
        if method == "HEAD":
            return self._send(
                method_not_allowed("HEAD", "GET, POST, PATCH, DELETE"), headers, close, head=True
            )
        if method not in _DISPATCHED:
            return self._send(method_not_allowed(method[:16], "GET, POST, PATCH, DELETE"), headers, True)
        if "transfer-encoding" in headers:
            raise _Reject(400, "invalid_body", "chunked request bodies are not supported")
        raw_length = headers.get("content-length", "0") or "0"
        if not raw_length.isdigit() or len(raw_length) > 18:
            raise _Reject(400, "invalid_body", "invalid Content-Length header")
        length = int(raw_length)
        if headers.get("expect", "").lower() == "100-continue" and length <= _DRAIN_LIMIT:
            self.conn.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        too_large = length > MAX_BODY_BYTES
        body = b""
        if too_large:
            if length > _DRAIN_LIMIT:
                close = True  # refuse without reading: the next bytes on this connection are body
            else:
                self._drain(length, deadline)
        elif length:
            body = self._read_body(length, deadline)
        self.conn.set_state(_BUSY)
        resp = self.server.app.handle(Request(method, target, headers, body, too_large))
        if resp.drop:
            with contextlib.suppress(OSError):
                self.conn.sock.shutdown(socket.SHUT_RDWR)
            return False
        return self._send(resp, headers, close)

    def _read_body(self, length: int, deadline: float) -> bytes:
        conn = self.conn
        while len(conn.buf) < length:
            if not conn.fill(deadline):
                raise _Gone  # the client went away mid-body
        body = bytes(conn.buf[:length])
        del conn.buf[:length]
        return body

    def _drain(self, length: int, deadline: float) -> None:
        conn = self.conn
        remaining = length
        while True:
            taken = min(remaining, len(conn.buf))
            del conn.buf[:taken]
            remaining -= taken
            if remaining == 0:
                return
            if not conn.fill(deadline):
                raise _Gone

    def _send(
        self, resp: Response, headers: dict[str, str] | None, close: bool, *, head: bool = False
    ) -> bool:
        sock = self.conn.sock
        sock.settimeout(self.limits.request_timeout)
        try:
            sock.sendall(_encode(resp, headers, close=close, head=head))
        except OSError:
            return False
        return not close


def _encode(resp: Response, headers: dict[str, str] | None, *, close: bool, head: bool = False) -> bytes:
    payload = b"" if resp.body is None else json.dumps(resp.body, separators=(",", ":")).encode()
    try:
        reason = HTTPStatus(resp.status).phrase
    except ValueError:
        reason = "Error"
    lines = [f"HTTP/1.1 {resp.status} {reason}", f"Date: {formatdate(usegmt=True)}", "Server: volcano-locks"]
    if resp.body is not None:
        lines.append("Content-Type: application/json")
    if resp.status != 204:
        lines.append(f"Content-Length: {len(payload)}")
    rid = headers.get("x-volcano-request-id") if headers is not None else None
    if rid is not None and is_request_id(rid):
        lines.append(f"X-Volcano-Request-Id: {rid}")
    lines.extend(f"{k}: {v}" for k, v in resp.headers.items())
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else payload)


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
