"""The clients' HTTP lanes, and the total deadline a sync request enforces in its caller's own thread.

Every client holds two httpx pools, its *lanes* (:func:`lane_for`): ``keeping`` carries renewals and
releases, ``other`` everything else (acquires, reads, force releases). A renewal or release never
waits for a connection or a pool slot behind a waiter's read, however slow the reads are.

The sync client sends each request in the thread that called it: there is no worker pool to queue
in, and nothing is left running when the caller gives up. The request's *total* deadline is enforced
by :class:`DeadlineBackend`, an httpcore network backend whose connect, read and write each use
``min(timeout, deadline - now)`` for the request running in this context (:func:`deadline` sets it
in a context variable around the request). A server that drips bytes is cut at the deadline: the
read raises a timeout and httpcore closes that connection, so a timed-out request leaves no thread
and no socket behind, and the pool stays usable. Name resolution is not bounded (it is the
resolver's; a numeric or ``localhost`` URL needs none).

The default lanes honour ``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``NO_PROXY`` as the standard library
reads them (one decision per client: it talks to one base URL).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import httpcore
import httpx

from volcano_locks.errors import TransportError

__all__ = [
    "KEEPING_OPS",
    "DeadlineBackend",
    "DeadlineTransport",
    "deadline",
    "env_proxy",
    "lane_for",
    "translate_transport_errors",
]

KEEPING_OPS = frozenset({"renew", "release"})
"""Operations that travel on the keeping lane; every other operation takes the other lane."""

_DEADLINE: ContextVar[float | None] = ContextVar("volcano_locks_request_deadline", default=None)


def lane_for(op: str) -> str:
    """The lane an operation travels on: ``"keeping"`` for renew and release, else ``"other"``."""
    return "keeping" if op in KEEPING_OPS else "other"


@contextmanager
def deadline(at: float) -> Iterator[None]:
    """Bound every network wait of the requests sent in this block by ``at`` (``time.monotonic``)."""
    token = _DEADLINE.set(at)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _bounded(timeout: float | None, late: type[Exception]) -> float | None:
    at = _DEADLINE.get()
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise late("the request's total deadline has passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A network stream whose every read and write ends by the current request's deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, bounded))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's sync backend with every connect, read and write cut at the request's deadline."""

    def __init__(self, inner: httpcore.NetworkBackend | None = None) -> None:
        self._inner = inner if inner is not None else httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.connect_tcp(host, port, bounded, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.connect_unix_socket(path, bounded, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's own HTTP transport, connecting through :class:`DeadlineBackend`."""

    def __init__(self, proxy: str | None = None) -> None:
        super().__init__(proxy=proxy)
        # httpx builds its httpcore pool without a way to name the backend; the pool (and a proxy
        # pool, its subclass) reads this attribute whenever it opens a connection.
        pool: Any = self._pool
        if not isinstance(getattr(pool, "_network_backend", None), httpcore.NetworkBackend):
            raise RuntimeError(
                "this httpx/httpcore version has no network backend to bound"
            )  # pragma: no cover
        pool._network_backend = DeadlineBackend(pool._network_backend)


def env_proxy(api_url: str) -> str | None:
    """The proxy the environment names for ``api_url`` (``None``: connect directly)."""
    url = httpx.URL(api_url)
    if not url.host or urllib.request.proxy_bypass(url.host):
        return None
    return urllib.request.getproxies().get(url.scheme)


@contextmanager
def translate_transport_errors(op: str, request_id: str) -> Iterator[None]:
    """Turn httpx's transport exceptions raised inside the block into :class:`TransportError`."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise TransportError(f"{op} timed out ({type(exc).__name__})", request_id=request_id) from exc
    except httpx.TransportError as exc:
        raise TransportError(f"{op} got no response ({type(exc).__name__})", request_id=request_id) from exc
    except httpx.StreamError as exc:
        raise TransportError(
            f"{op} response stream failed ({type(exc).__name__})", request_id=request_id
        ) from exc
