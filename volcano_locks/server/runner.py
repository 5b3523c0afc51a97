"""`volcano-locks serve`: defaults, wiring the server together, printing keys, and clean shutdown."""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import signal
import stat
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TextIO

from .app import LockApp
from .auth import Authenticator, check_admin_key, check_secret, mint_key, new_admin_key
from .backends import open_store
from .clock import Clock, SkewedClock, system_clock
from .faults import FaultInjector
from .http11 import Limits, LockHTTPServer, build_server, serve_in_thread
from .quota import QuotaLimiter
from .service import LockService
from .store import LockStore

__all__ = [
    "ADMIN_KEY_ENV",
    "PARENT_ENV",
    "SECRET_ENV",
    "ServeConfig",
    "build_app",
    "default_db_path",
    "load_or_create_secret",
    "read_kept_secret",
    "serve",
]

SECRET_ENV = "VOLCANO_LOCAL_SECRET"
"""Environment variable read when `--secret` is not given (keeps the secret out of `ps`)."""

ADMIN_KEY_ENV = "VOLCANO_LOCAL_ADMIN_KEY"
"""Environment variable read when `--admin-key` is not given; without either, each start makes a new key."""

PARENT_ENV = "VOLCANO_LOCAL_PARENT_PID"
"""If set (the harness sets it), the server stops when that process is no longer its parent."""

log = logging.getLogger("volcano_locks.server")


def default_data_dir() -> Path:
    """The user data directory the server keeps its default database and secret in."""
    from platformdirs import user_data_dir

    return Path(user_data_dir("volcano-locks", appauthor=False))


def default_db_path() -> str:
    """The default SQLite database file."""
    return str(default_data_dir() / "locks.sqlite3")


def secret_path_for(db: str) -> Path:
    """Where the generated secret lives: beside a SQLite file, or in the data dir for PostgreSQL."""
    if db.startswith(("postgresql://", "postgres://")):
        return default_data_dir() / "secret"
    return Path(db + ".secret")


def read_kept_secret(path: Path) -> str:
    """Read the secret kept at `path`, refusing a file another user owns or others may read.

    Raises:
        ValueError: the file is not ours, is group/world readable or writable, or holds a short secret.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "r", encoding="utf-8") as fh:
        st = os.fstat(fh.fileno())
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise ValueError(f"refusing the secret file {path}: owned by uid {st.st_uid}, not by this user")
        if st.st_mode & 0o077:
            raise ValueError(
                f"refusing the secret file {path}: mode {stat.filemode(st.st_mode)} lets others read or"
                f" change it; run chmod 600 {path} if you trust its content, or delete it"
            )
        return check_secret(fh.read().strip())


def load_or_create_secret(path: Path) -> str:
    """Read the secret kept at `path` (see `read_kept_secret`), or generate one there with mode 0600."""
    if path.exists() or path.is_symlink():
        return read_kept_secret(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(48)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(secret + "\n")
    return secret


@dataclass
class ServeConfig:
    """Options of `volcano-locks serve`."""

    host: str = "127.0.0.1"
    port: int = 8000
    db: str | None = None
    secret: str | None = None
    quota: int = 600
    faults: str | None = None
    admin: bool = False
    admin_key: str | None = None
    log_requests: bool = True
    limits: Limits = field(default_factory=Limits)
    clock_offset: float = 0.0
    clock_rate: float = 1.0
    history: str | None = None

    def clock(self) -> Clock:
        """The server's clock: the system's, or a movable `SkewedClock` when skewed or with --admin."""
        if self.admin or self.clock_offset or self.clock_rate != 1.0:
            return SkewedClock(offset=self.clock_offset, rate=self.clock_rate)
        return system_clock


def build_app(
    store: LockStore,
    secret: str,
    *,
    quota: int = 600,
    faults: str | None = None,
    admin_key: str | None = None,
    clock: Clock = system_clock,
    log_requests: bool = True,
    history: str | None = None,
) -> LockApp:
    """Wire a LockApp over `store` with one clock for leases, key expiry and quota windows.

    An `admin_key` turns the admin endpoints on, behind that key; `history` names a file that every
    request's log entry is appended to.
    """
    return LockApp(
        LockService(store, clock),
        Authenticator(secret, clock),
        QuotaLimiter(quota, clock, store.quota_counter()),
        FaultInjector(faults),
        admin_key=admin_key,
        clock=clock,
        log_requests=log_requests,
        history=history,
    )


def serve(config: ServeConfig, out: TextIO = sys.stdout) -> int:
    """Run the server until SIGTERM/SIGINT; print the URL, keys and `ready`; return an exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    db = config.db or default_db_path()
    secret = config.secret or os.environ.get(SECRET_ENV) or load_or_create_secret(secret_path_for(db))
    check_secret(secret)
    admin_key = None
    if config.admin:
        admin_key = check_admin_key(config.admin_key or os.environ.get(ADMIN_KEY_ENV) or new_admin_key())
    clock = config.clock()
    store = open_store(db)
    httpd: LockHTTPServer | None = None
    app: LockApp | None = None
    try:
        app = build_app(
            store,
            secret,
            quota=config.quota,
            faults=config.faults,
            admin_key=admin_key,
            clock=clock,
            log_requests=config.log_requests,
            history=config.history,
        )
        httpd = build_server(config.host, config.port, app, config.limits)
        if config.admin and not _is_loopback(config.host):
            log.warning(
                "--admin on %s, which is not a loopback address: anyone who can reach it and holds the"
                " admin key can inject faults and read every project's request log",
                config.host,
            )
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        thread = serve_in_thread(httpd)
        shown_db = db if "://" not in db else db.split("@")[-1]
        print(f"Volcano locks server on {httpd.url} (db: {shown_db}, project: local)", file=out)
        if config.faults:
            print(f"fault injection ON: {config.faults}", file=out)
        if config.clock_offset or config.clock_rate != 1.0:
            print(f"clock skewed: {config.clock_offset:+g} s, running at {config.clock_rate:g}x", file=out)
        if admin_key is not None:
            print(
                "admin endpoints ON: /__admin/faults, /__admin/requests, /__admin/clock"
                " (Authorization: Bearer $VOLCANO_ADMIN_KEY; no project's key opens them)",
                file=out,
            )
        # Lines a user pastes into the shell that runs their code (harness.printed_variables reads them).
        print(f"export VOLCANO_API_URL={httpd.url}", file=out)
        print(f"export VOLCANO_ANON_KEY={mint_key(secret, 'local', 'anon')}", file=out)
        print(f"export VOLCANO_SERVICE_KEY={mint_key(secret, 'local', 'service')}", file=out)
        if admin_key is not None:
            print(f"export VOLCANO_ADMIN_KEY={admin_key}", file=out)
        print("ready", file=out, flush=True)
        parent = os.environ.get(PARENT_ENV)
        while not stop.wait(0.2):
            if not thread.is_alive():
                log.error("the HTTP server thread died")
                return 1
            if parent and str(os.getppid()) != parent:
                # The test run that started us is gone: do not linger on a shared machine.
                log.warning("parent process %s went away; stopping", parent)
                break
        httpd.shutdown()
        thread.join(timeout=10)
        print("stopped", file=out, flush=True)
        return 0
    finally:
        if httpd is not None:
            httpd.server_close()
        if app is not None:
            app.requests.close()
        store.close()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
