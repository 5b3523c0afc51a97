"""Test/demo harnesses: LocalServer (a `volcano-locks serve` subprocess) and InProcessServer (a thread)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from .auth import check_admin_key, check_secret, mint_key, new_admin_key
from .clock import Clock, system_clock

if TYPE_CHECKING:
    from .http11 import Limits

__all__ = ["InProcessServer", "LocalServer", "printed_variables"]

_DEFAULT_PROJECT = "local"


def printed_variables(text: str) -> dict[str, str]:
    """The ``export VOLCANO_...=value`` lines `volcano-locks serve` printed (before ``ready``), by name."""
    found = {}
    for line in text.splitlines():
        name, sep, value = line.strip().removeprefix("export ").partition("=")
        if sep and name.startswith("VOLCANO_"):
            found[name] = value
    return found


class _ServerBase:
    """What both harnesses share: keys, env, the admin endpoints (with the admin key), the lifecycle."""

    project: str = _DEFAULT_PROJECT

    def __init__(
        self,
        db: str | None,
        secret: str | None,
        quota: int,
        faults: str | None,
        admin: bool,
        port: int,
        host: str,
        log_requests: bool,
        admin_key: str | None,
    ) -> None:
        """Keep the options; db None means a fresh SQLite file in a private temp dir removed with us.

        `admin_key` None makes a random one, kept across restarts (the admin endpoints take only it).
        """
        self._tmp = Path(tempfile.mkdtemp(prefix="volcano-locks-"))
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self._tmp), True)
        self.db = db or str(self._tmp / "locks.sqlite3")
        self.secret = check_secret(secret) if secret is not None else secrets.token_urlsafe(48)
        self.quota = quota
        self.faults_spec = faults
        self.admin = admin
        self.admin_key = check_admin_key(admin_key) if admin_key is not None else new_admin_key()
        self.port = port
        self.host = host
        self.log_requests = log_requests
        self.url = ""
        self._default_keys: dict[tuple[str, str, str], str] = {}

    def mint_key(
        self,
        project: str = _DEFAULT_PROJECT,
        role: str = "service",
        permissions: Sequence[str] | None = None,
        ttl_seconds: int | None = None,
    ) -> str:
        """Mint a key for this server's secret (any project, role, permissions, optional expiry)."""
        return mint_key(self.secret, project, role, permissions, ttl_seconds)

    @property
    def service_key(self) -> str:
        """A full-access service key for the default project (the same string on every read).

        Minted once per secret: tests scan logs and stores for this exact string, so it must not
        change from one read to the next as `iat` ticks.
        """
        return self._default_key("service")

    @property
    def anon_key(self) -> str:
        """An anon key for the default project (lock calls with it get 403); the same on every read."""
        return self._default_key("anon")

    def _default_key(self, role: str) -> str:
        ident = (self.secret, self.project, role)
        if ident not in self._default_keys:
            self._default_keys[ident] = self.mint_key(self.project, role)
        return self._default_keys[ident]

    def env(self) -> dict[str, str]:
        """The VOLCANO_* environment variables a client needs to reach this server."""
        return {
            "VOLCANO_API_URL": self.url,
            "VOLCANO_ANON_KEY": self.anon_key,
            "VOLCANO_SERVICE_KEY": self.service_key,
        }

    def _admin(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.admin_key}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            raise RuntimeError(f"admin {method} {path} failed: {exc.code} {detail}") from None
        return json.loads(raw) if raw else None

    def set_faults(self, spec: str | None) -> None:
        """Replace the server's fault rules at runtime (needs admin=True); None or "" clears them."""
        self._admin("PUT", "/__admin/faults", {"faults": spec or ""})

    def faults(self) -> str:
        """The fault spec currently in force (needs admin=True)."""
        return str(self._admin("GET", "/__admin/faults")["faults"])

    def requests(self) -> list[dict[str, Any]]:
        """Recent lock requests: method, path, op, status, request_id, token_sha256 (12 hex), ..."""
        return list(self._admin("GET", "/__admin/requests")["requests"])

    def clear_requests(self) -> None:
        """Forget the recorded requests (needs admin=True)."""
        self._admin("DELETE", "/__admin/requests")

    def clock_state(self) -> dict[str, float]:
        """The server clock's reading, offset from the system clock and rate (needs admin=True)."""
        return dict(self._admin("GET", "/__admin/clock"))

    def jump_clock(self, seconds: float) -> dict[str, float]:
        """Step the server's clock by `seconds` (negative: back); return its new state (needs admin=True)."""
        return dict(self._admin("PUT", "/__admin/clock", {"jump": seconds}))

    def set_clock_rate(self, rate: float) -> dict[str, float]:
        """Run the server's clock `rate` times as fast as real time; return its state (needs admin=True)."""
        return dict(self._admin("PUT", "/__admin/clock", {"rate": rate}))

    def start(self) -> Self:
        """Start serving; return self."""
        raise NotImplementedError

    def stop(self) -> int | None:
        """Stop serving (a subprocess's exit code, else None)."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop serving and delete the private temp dir."""
        self.stop()
        self._finalizer()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class LocalServer(_ServerBase):
    """Run `python -m volcano_locks serve` as a subprocess on a free port, for tests, demos and benches.

    Example:
        with LocalServer(admin=True) as srv:
            client = VolcanoLocks(srv.url, service_key=srv.service_key)
    """

    def __init__(
        self,
        db: str | None = None,
        secret: str | None = None,
        quota: int = 600,
        faults: str | None = None,
        admin: bool = False,
        port: int = 0,
        host: str = "127.0.0.1",
        python: str = sys.executable,
        *,
        log_requests: bool = True,
        startup_timeout: float = 60.0,
        env: dict[str, str] | None = None,
        serve_args: Sequence[str] = (),
        admin_key: str | None = None,
        clock_offset: float = 0.0,
        clock_rate: float = 1.0,
        history: str | None = None,
    ) -> None:
        """Configure (not start) a server; db None means a fresh SQLite file in a private temp dir.

        `serve_args` are appended to the `volcano-locks serve` command line (e.g. `--max-connections`).
        `startup_timeout` only bounds a start that hangs: `start` returns at the server's `ready` line
        (a start took over 15 s on a busy 2-core machine).
        `clock_offset` and `clock_rate` skew the server's clock from the start (a restart starts it
        afresh from them: set them first to carry a skew across); `history` is `serve --history`.
        """
        super().__init__(db, secret, quota, faults, admin, port, host, log_requests, admin_key)
        self.serve_args = list(serve_args)
        self.clock_offset = clock_offset
        self.clock_rate = clock_rate
        self.history = history
        self.python = python
        self.startup_timeout = startup_timeout
        self.extra_env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.stdout_path = self._tmp / "stdout.log"
        self.stderr_path = self._tmp / "stderr.log"

    def __repr__(self) -> str:
        return f"LocalServer(url={self.url!r}, db={self.db!r}, running={self.running})"

    @property
    def running(self) -> bool:
        """Whether the subprocess is alive."""
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Self:
        """Start the subprocess and wait (<= startup_timeout) for its `ready` line; return self."""
        if self.running:
            return self
        cmd = [
            self.python, "-m", "volcano_locks", "serve",
            "--host", self.host, "--port", str(self.port), "--db", self.db, "--quota", str(self.quota),
        ]  # fmt: skip
        if self.faults_spec:
            cmd += ["--faults", self.faults_spec]
        if self.admin:
            cmd.append("--admin")
        if not self.log_requests:
            cmd.append("--no-request-log")
        if self.clock_offset or self.clock_rate != 1.0:
            cmd += ["--clock-offset", repr(self.clock_offset), "--clock-rate", repr(self.clock_rate)]
        if self.history is not None:
            cmd += ["--history", self.history]
        cmd += self.serve_args
        env = {
            **os.environ,
            **self.extra_env,
            "VOLCANO_LOCAL_SECRET": self.secret,
            "VOLCANO_LOCAL_ADMIN_KEY": self.admin_key,
            "VOLCANO_LOCAL_PARENT_PID": str(os.getpid()),
            "PYTHONUNBUFFERED": "1",
        }
        # Output goes to files, not pipes: a pipe nobody drains would eventually block the server.
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + self.startup_timeout
        while True:
            text = self.stdout_path.read_text(encoding="utf-8", errors="replace")
            if "\nready\n" in "\n" + text:
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"volcano-locks serve did not become ready (exit code {self.proc.returncode}):\n"
                    f"{self.stderr()[-3000:]}"
                )
            time.sleep(0.02)
        self.url = printed_variables(text)["VOLCANO_API_URL"]
        self.port = int(self.url.rsplit(":", 1)[1])
        return self

    def stderr(self) -> str:
        """Everything the server wrote to stderr so far (its log: one line per request, no secrets)."""
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 10.0) -> int | None:
        """Send SIGTERM and wait for a clean exit (SIGKILL after `timeout`); return the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the server (a crash: no cleanup at all)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> Self:
        """Stop and start again on the same port, database and secret."""
        self.stop()
        return self.start()


class InProcessServer(_ServerBase):
    """The real HTTP server on a thread in this process, with an injectable clock (for timing tests).

    Example:
        clock = ManualClock()
        with InProcessServer(clock=clock) as srv:
            ...; clock.advance(31); ...
    """

    def __init__(
        self,
        db: str | None = None,
        secret: str | None = None,
        quota: int = 600,
        faults: str | None = None,
        admin: bool = False,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        clock: Clock = system_clock,
        log_requests: bool = False,
        limits: Limits | None = None,
        admin_key: str | None = None,
        history: str | None = None,
    ) -> None:
        """Configure (not start) a server; db None means a fresh SQLite file in a private temp dir.

        `history` names a file every request's log entry is appended to (`serve --history`).
        """
        from .store import LockStore

        super().__init__(db, secret, quota, faults, admin, port, host, log_requests, admin_key)
        self.clock = clock
        self.history = history
        self.limits = limits
        self._store: LockStore | None = None
        self._httpd: Any = None

    def start(self) -> Self:
        """Bind and serve on a daemon thread; return self."""
        from .backends import open_store
        from .http11 import build_server, serve_in_thread
        from .runner import build_app

        self._store = open_store(self.db)
        app = build_app(
            self._store,
            self.secret,
            quota=self.quota,
            faults=self.faults_spec,
            admin_key=self.admin_key if self.admin else None,
            clock=self.clock,
            log_requests=self.log_requests,
            history=self.history,
        )
        self._httpd = build_server(self.host, self.port, app, self.limits)
        self.url = self._httpd.url
        self.port = self._httpd.server_address[1]
        serve_in_thread(self._httpd)
        return self

    @property
    def app(self) -> Any:
        """The LockApp being served (its fault injector can be set directly)."""
        return self._httpd.app if self._httpd is not None else None

    def stop(self) -> None:
        """Stop serving and close the store."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd.app.requests.close()
            self._httpd = None
        if self._store is not None:
            self._store.close()
            self._store = None
