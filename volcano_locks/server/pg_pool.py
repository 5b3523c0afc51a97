"""PostgreSQL connections for the server: a bounded pool in which every database interaction is bounded.

A PostgreSQL that hangs (accepts TCP but never answers, or keeps a row locked) must not hang lock
requests, and a burst of requests must not take every connection the database has: they fail closed
with 503 `unavailable` instead. The pool is psycopg_pool's, holding at most `?pool_size=N` connections
(default 10, open or being opened); every other bound is `timeout` seconds, set with `?timeout=S` on the
DSN (default 3; the client's own default timeout is 10 s):

- getting a connection from the pool (all busy, or none can be opened): the pool's wait timeout;
- connecting: libpq's `connect_timeout` (psycopg makes it at least 2 s);
- in the database: `statement_timeout` and `lock_timeout` end a slow statement or a long row-lock wait
  with an error, and `idle_in_transaction_session_timeout` frees the row locks of a session whose
  client gave up in the middle of a transaction;
- in this process: a watchdog shuts down the socket of a session still busy one second after its
  database-side timeouts should have answered, for a server that answers nothing at all.

Every failure is raised as StoreUnavailable. Explicit libpq settings in the DSN (`connect_timeout=`,
`options=-c statement_timeout=...`) win over the ones derived from `timeout`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

from .errors import StoreUnavailable

__all__ = ["DEFAULT_POOL_SIZE", "DEFAULT_SCHEMA", "DEFAULT_TIMEOUT", "PgPool", "PgSettings", "parse_dsn"]

DEFAULT_SCHEMA = "volcano_locks"
DEFAULT_TIMEOUT = 3.0
"""Seconds any one database interaction may take before the request fails closed (DSN `?timeout=`)."""
DEFAULT_POOL_SIZE = 10
"""Most PostgreSQL connections one server process holds (DSN `?pool_size=`)."""
_MAX_POOL_SIZE = 100

# How much longer than the database-side timeouts the watchdog waits before cutting a session: long
# enough for a timeout error to arrive from a live but slow server, so its connection stays usable.
_WATCHDOG_GRACE = 1.0

log = logging.getLogger("volcano_locks.server")

Connection = psycopg.Connection[tuple[object, ...]]


@dataclass(frozen=True, slots=True)
class PgSettings:
    """What `parse_dsn` takes out of a server DSN: the libpq DSN, our schema, time bound and pool size."""

    dsn: str
    schema: str
    timeout: float
    pool_size: int = DEFAULT_POOL_SIZE


def parse_dsn(dsn: str) -> PgSettings:
    """Split our own `schema=`, `timeout=` and `pool_size=` query parameters off a `postgresql://` DSN."""
    parts = urlsplit(dsn)
    schema = DEFAULT_SCHEMA
    timeout = DEFAULT_TIMEOUT
    pool_size = DEFAULT_POOL_SIZE
    rest = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name == "schema":
            schema = value
        elif name == "timeout":
            try:
                timeout = float(value)
            except ValueError:
                raise ValueError(f"timeout= in the PostgreSQL DSN must be seconds, got {value!r}") from None
            if not 0 < timeout <= 3600:
                raise ValueError(f"timeout= in the PostgreSQL DSN must be 0 < S <= 3600, got {value!r}")
        elif name == "pool_size":
            if not value.isdigit() or not 1 <= int(value) <= _MAX_POOL_SIZE:
                raise ValueError(
                    f"pool_size= in the PostgreSQL DSN must be 1-{_MAX_POOL_SIZE}, got {value!r}"
                )
            pool_size = int(value)
        else:
            rest.append((name, value))
    if not schema:
        raise ValueError("empty schema= in the PostgreSQL DSN")
    # libpq decodes %20 but not '+' in URIs, so spaces (as in options=-c ...) are quoted as %20.
    query = urlencode(rest, quote_via=quote)
    return PgSettings(urlunsplit(parts._replace(query=query)), schema, timeout, pool_size)


class _Watch:
    """One armed session: its socket, deadline, and whether the watchdog cut it."""

    __slots__ = ("cut", "deadline", "fd")

    def __init__(self, fd: int, deadline: float) -> None:
        self.fd = fd
        self.deadline = deadline
        self.cut = False


class _Watchdog:
    """A daemon thread that shuts down the socket of any session past its deadline."""

    def __init__(self, tick: float) -> None:
        self._tick = tick
        self._cond = threading.Condition()
        self._armed: set[_Watch] = set()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def arm(self, fd: int, seconds: float) -> _Watch:
        watch = _Watch(fd, time.monotonic() + seconds)
        with self._cond:
            self._armed.add(watch)
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, name="volcano-locks-pg-watchdog")
                self._thread.daemon = True
                self._thread.start()
        return watch

    def disarm(self, watch: _Watch) -> bool:
        """Stop watching; True if the session was cut. Under the lock, so a cut never hits a reused fd."""
        with self._cond:
            self._armed.discard(watch)
            return watch.cut

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                for watch in [w for w in self._armed if w.deadline <= now]:
                    self._armed.discard(watch)
                    watch.cut = True
                    # Shutting down a duplicate of the fd wakes the thread blocked on the original with
                    # an EOF, which psycopg reports as an OperationalError; the fd itself stays valid.
                    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(watch.fd)) as sock:
                        sock.shutdown(socket.SHUT_RDWR)
                self._cond.wait(self._tick)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=5)


class PgPool:
    """A psycopg_pool of at most `pool_size` autocommit connections, every use time-bounded."""

    def __init__(self, dsn: str) -> None:
        """Prepare connections for a server DSN (see `parse_dsn`); none is opened until one is needed."""
        settings = parse_dsn(dsn)
        self.schema = settings.schema
        self.timeout = settings.timeout
        self.size = settings.pool_size
        self._watchdog = _Watchdog(tick=min(0.25, self.timeout / 4))
        self._pool: ConnectionPool[Connection] = ConnectionPool(
            self._bounded(settings),
            kwargs={"autocommit": True},
            min_size=0,
            max_size=self.size,
            timeout=self.timeout,
            # Give up on a failed connection attempt at once (after one immediate retry) instead of
            # retrying in the background for minutes: the next request asks again, and until then
            # requests wait at most `timeout` and get a 503.
            reconnect_timeout=0,
            name="volcano-locks",
            open=True,
        )

    @staticmethod
    def _bounded(settings: PgSettings) -> str:
        """The libpq conninfo with the time bounds added (the DSN's own settings win)."""
        params = conninfo_to_dict(settings.dsn)
        ms = max(1, round(settings.timeout * 1000))
        ours = f"-c statement_timeout={ms} -c lock_timeout={ms} -c idle_in_transaction_session_timeout={ms}"
        # Later -c settings win, so the DSN's own options go last.
        params["options"] = f"{ours} {params.get('options') or ''}".strip()
        params.setdefault("connect_timeout", max(2, math.ceil(settings.timeout)))
        return make_conninfo("", **params)

    def open_connections(self) -> int:
        """How many connections the pool holds now (in use, idle or being opened)."""
        return self._pool.get_stats()["pool_size"]

    def _borrow(self) -> Connection:
        try:
            return self._pool.getconn(timeout=self.timeout)
        except PoolTimeout as exc:
            stats = self._pool.get_stats()
            if stats["pool_size"] >= self.size and stats["pool_available"] == 0:
                raise StoreUnavailable(
                    f"all {self.size} PostgreSQL connections stayed busy for {self.timeout:g} s"
                ) from exc
            raise StoreUnavailable(f"cannot connect to PostgreSQL within {self.timeout:g} s") from exc

    def _release(self, conn: Connection, *, reusable: bool) -> None:
        if not (
            reusable
            and not conn.closed
            and not conn.broken
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        ):
            conn.close()  # the pool then replaces it when it is next needed
        self._pool.putconn(conn)

    @contextlib.contextmanager
    def session(self) -> Iterator[Connection]:
        """Lend a connection for one bounded interaction; psycopg errors become StoreUnavailable.

        Exceptions that are not database errors (a decision refusing a change, say) pass through and
        the connection is reused if its transaction ended cleanly.
        """
        conn = self._borrow()
        watch = self._watchdog.arm(conn.fileno(), self.timeout + _WATCHDOG_GRACE)
        reusable = False
        try:
            yield conn
            reusable = True
        except psycopg.Error as exc:
            if self._watchdog.disarm(watch):
                raise StoreUnavailable(f"PostgreSQL did not answer within {self.timeout:g} s") from exc
            # A statement or lock timeout leaves a healthy connection (checked in _release): keep it, so a
            # burst of timeouts does not churn connections.
            reusable = True
            raise StoreUnavailable(f"PostgreSQL error: {type(exc).__name__}: {exc}") from exc
        except BaseException:
            reusable = True
            raise
        finally:
            cut = self._watchdog.disarm(watch)
            self._release(conn, reusable=reusable and not cut)

    def close(self) -> None:
        """Close every pooled connection and stop the watchdog."""
        self._watchdog.stop()
        self._pool.close(timeout=5)
