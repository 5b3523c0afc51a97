"""An HTTP proxy in front of the S3-compatible server that loses chosen responses in transit, on purpose.

Every request is forwarded whole to the server (moto, ``s3_server.MotoServer``) and its response relayed,
except for a request matching an armed rule: the server gets it and applies it, then the proxy runs the
rule's ``then`` (another writer acting in between, say) and closes the client's connection without a
byte of the response. The client sees what a lost response looks like (botocore: a closed connection,
which it retries), while the store holds what the request did.

    with LosingProxy(s3_server.url) as proxy:
        proxy.lose("PUT", "lake/_manifest.json", then=publish_a_newer_version)
        FencedS3Prefix(client_for(proxy.url), bucket, "lake").publish(...)
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["LosingProxy"]

_HOP_BY_HOP = frozenset({"connection", "keep-alive", "expect", "transfer-encoding", "proxy-connection"})


@dataclass
class _Rule:
    method: str
    key: str
    then: Callable[[], None] | None
    count: int
    every: int
    seen: int = 0


class LosingProxy:
    """Forward 127.0.0.1:<port> to ``upstream`` (an ``http://host:port`` URL), losing armed responses."""

    def __init__(self, upstream: str) -> None:
        split = urlsplit(upstream)
        self.upstream = (split.hostname or "127.0.0.1", split.port or 80)
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.lost: list[str] = []
        """``METHOD /path`` of every request whose response was lost, in order."""

    @property
    def url(self) -> str:
        """The proxy's endpoint URL."""
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def lose(
        self,
        method: str,
        key: str,
        *,
        then: Callable[[], None] | None = None,
        count: int = 1,
        every: int = 1,
    ) -> None:
        """Lose the response of every ``every``-th ``method`` request on object ``key``, ``count`` times.

        ``then`` runs after the server answered the request and before the client's connection is closed.
        """
        with self._lock:
            self._rules.append(_Rule(method.upper(), key, then, count, every))

    def _take(self, method: str, path: str) -> _Rule | None:
        key = unquote(urlsplit(path).path).lstrip("/").partition("/")[2]  # path-style: /bucket/key
        with self._lock:
            for rule in self._rules:
                if rule.count > 0 and rule.method == method and rule.key == key:
                    rule.seen += 1
                    if rule.seen % rule.every == 0:
                        rule.count -= 1
                        self.lost.append(f"{method} {path}")
                        return rule
        return None

    def start(self) -> LosingProxy:
        """Listen on a free loopback port."""
        proxy = self

        class Handler(_Forward):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="losing-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> LosingProxy:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class _Forward(BaseHTTPRequestHandler):
    owner: LosingProxy
    protocol_version = "HTTP/1.1"  # keep-alive, and "100 Continue" for botocore's Expect header

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads ``LosingProxy.lost``, not a log."""

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        upstream = http.client.HTTPConnection(*self.owner.upstream, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
        finally:
            upstream.close()
        rule = self.owner._take(self.command, self.path)
        if rule is not None:
            if rule.then is not None:
                rule.then()
            self.close_connection = True  # the server applied it; the client never hears
            return
        self.send_response_only(response.status, response.reason)
        head = self.command == "HEAD"  # its Content-Length is the object's, with no body
        for name, value in response.getheaders():
            if name.lower() not in _HOP_BY_HOP and (head or name.lower() != "content-length"):
                self.send_header(name, value)
        if not head:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward
