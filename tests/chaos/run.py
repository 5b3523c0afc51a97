"""Run the chaos suite: servers with fault injection, contending workers, the fault plan, the checker.

Usage (from the repository root, in the Prefect environment)::

    .venv-prefect/bin/python -m tests.chaos.run                   # default: CHAOS_SECONDS or 40 s in all
    CHAOS_SECONDS=600 .venv-prefect/bin/python -m tests.chaos.run # the ten-minute run
    .venv-prefect/bin/python -m tests.chaos.run --seconds 60 --backend sqlite --keep .tmp/chaos

The seconds are split evenly between the backends: SQLite (one server process, killed with SIGKILL and
restarted on the same file) and PostgreSQL (two server processes behind one database, workers spread
across them, each killed and restarted in turn). The last line printed is the checker's summary over both;
the exit status is 1 when any promised zero is not zero.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fencing.s3_server import MotoServer
from tests.server.tcpproxy import TcpProxy
from volcano_locks.server.harness import LocalServer

from .adapter_stores import ADAPTERS, open_stores
from .checker import Report, check
from .events import EventLog, clock_is_shared, read_events, read_events_dir
from .history import load_ops, read_calls, read_server_history
from .linearizability import Verdict, check_ops
from .scheduler import Action, plan
from .worker import HOLD_MAX

__all__ = ["DEFAULT_SECONDS", "ChaosConfig", "ChaosRun", "default_seconds", "main"]

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SECONDS = 40.0
DEFAULT_PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def default_seconds() -> float:
    """Total chaos seconds: ``CHAOS_SECONDS`` from the environment, else 40."""
    raw = os.environ.get("CHAOS_SECONDS", "").strip()
    if not raw:
        return DEFAULT_SECONDS
    value = float(raw)
    if not value > 0:
        raise ValueError(f"CHAOS_SECONDS must be a positive number of seconds, got {raw!r}")
    return value


@dataclass
class ChaosConfig:
    """One backend's run."""

    backend: str  # "sqlite" or "postgres"
    seconds: float
    workdir: Path
    workers: int = 4
    ttl: int = 5
    poll: float = 1.0
    seed: int = 0
    pg_dsn: str = DEFAULT_PG_DSN
    python: str = sys.executable
    key: str = field(default_factory=lambda: f"chaos-{uuid.uuid4().hex[:12]}")
    first_cycle: int = 0
    """Where the plan's rotations start (``scheduler.plan``): each backend of a run gets its own."""


@dataclass
class _Worker:
    name: str
    server: int
    proc: subprocess.Popen[bytes]
    log: Path
    interrupt: bool = False
    expected_dead: bool = False
    stopped: bool = False


class ChaosRun:
    """Execute one backend's chaos run and check it."""

    def __init__(self, cfg: ChaosConfig) -> None:
        """Prepare (not start) the run described by ``cfg``."""
        self.cfg = cfg
        cfg.workdir.mkdir(parents=True, exist_ok=True)
        self.table = f"chaos_{uuid.uuid4().hex[:12]}"
        self.servers: list[LocalServer] = []
        self.workers: list[_Worker] = []
        self.driver = EventLog(cfg.workdir / "faults.jsonl", "driver")
        self.spec = ""
        self.timers: list[tuple[float, Callable[[], None]]] = []
        self._injected_seen: dict[int, int] = {}
        self._injected = 0
        self._spawned = 0
        self._crashes = 0
        self._schema = f"chaos_{uuid.uuid4().hex[:10]}"
        self.s3 = MotoServer(python=cfg.python, log=cfg.workdir / "moto.log")
        self.s3_bucket = ""
        self.proxies: dict[str, TcpProxy] = {}  # each worker reaches its server through its own proxy
        self._clock = (time.monotonic(), 0.0, 1.0)  # (since, offset then, rate): the servers' clock

    # -- set-up -------------------------------------------------------------------------------------------

    def _store_url(self) -> str:
        if self.cfg.backend == "postgres":
            return self.cfg.pg_dsn
        return str(self.cfg.workdir / "protected.sqlite3")

    def _start_servers(self) -> None:
        secret = secrets.token_urlsafe(48)
        if self.cfg.backend == "postgres":
            sep = "&" if "?" in self.cfg.pg_dsn else "?"
            dbs = [f"{self.cfg.pg_dsn}{sep}schema={self._schema}"] * 2
        else:
            dbs = [str(self.cfg.workdir / "locks.sqlite3")]
        for i, db in enumerate(dbs):
            # High quota: the chaos run measures exclusion under faults, not the 600/min budget. Each
            # server process appends what it decided to its history (a restart: the same file).
            srv = LocalServer(
                db=db,
                secret=secret,
                quota=1_000_000,
                admin=True,
                python=self.cfg.python,
                log_requests=False,
                history=str(self.cfg.workdir / f"history-{i}.jsonl"),
                startup_timeout=60.0,  # a restart on a loaded machine may take a while: the run waits it out
            )
            self.servers.append(srv.start())

    def _spawn(self) -> _Worker:
        n = self._spawned
        self._spawned += 1
        name = f"w{n}"
        server = n % len(self.servers)
        log = self.cfg.workdir / f"worker-{name}.jsonl"
        proxy = self.proxies[name] = TcpProxy(("127.0.0.1", self.servers[server].port)).start()
        env = {**os.environ, **self.servers[server].env(), **self.s3.env(), "PYTHONUNBUFFERED": "1"}
        env["VOLCANO_API_URL"] = proxy.url
        cmd = [
            self.cfg.python, "-m", "tests.chaos.worker",
            "--name", name, "--key", self.cfg.key, "--ttl", str(self.cfg.ttl),
            "--store", self._store_url(), "--table", self.table, "--log", str(log),
            "--calls", str(self.cfg.workdir / f"calls-{name}.jsonl"),
            "--s3-bucket", self.s3_bucket,
            "--server", str(server), "--seed", str(self.cfg.seed * 1000 + n),
        ]  # fmt: skip
        interrupt = n % 3 == 1
        if interrupt:
            cmd.append("--interrupt")  # a third of the workers have loss raised into their body
        out = open(self.cfg.workdir / f"{name}.out", "wb")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        out.close()
        w = _Worker(name, server, proc, log, interrupt)
        self.workers.append(w)
        return w

    # -- observing the workers ----------------------------------------------------------------------------

    def _holders(self) -> list[_Worker]:
        """Live workers whose log shows an open critical section whose guard has not reported loss."""
        holders = []
        for w in self.workers:
            if w.expected_dead or w.stopped or w.proc.poll() is not None or not w.log.exists():
                continue
            if self._open_section(w):
                holders.append(w)
        return holders

    @staticmethod
    def _open_section(w: _Worker) -> bool:
        state = False
        for e in read_events(w.log):
            if e["ev"] == "start":
                state = True
            elif e["ev"] in ("end", "lost", "outcome"):
                state = False
        return state

    def _starts_after(self, t: float, exclude: str) -> bool:
        for w in self.workers:
            if w.name == exclude or not w.log.exists():
                continue
            if any(e["ev"] == "start" and e["mono"] > t for e in read_events(w.log)):
                return True
        return False

    def _wait_for_holder(self, timeout: float, *, prefer_plain: bool = False) -> _Worker | None:
        """A current holder; ``prefer_plain``: one without interrupt=True if one holds soon enough."""
        start = time.monotonic()
        end = start + timeout
        while time.monotonic() < end:
            holders = self._holders()
            plain = [w for w in holders if not w.interrupt]
            if plain or (holders and not (prefer_plain and time.monotonic() < start + 0.8 * timeout)):
                return (plain or holders)[0]
            self._tick()
            time.sleep(0.05)
        return None

    def _collect_injected(self, index: int) -> None:
        """Count requests the server says it faulted, once each (its log restarts with the process)."""
        try:
            entries = self.servers[index].requests()
        except Exception as exc:  # a dead server has nothing to say; the count is then a lower bound
            self.driver.emit("note", text=f"server {index} requests unavailable: {type(exc).__name__}")
            return
        seen = self._injected_seen.get(index, 0)
        for e in entries:
            if e["seq"] > seen and e.get("fault"):
                self._injected += 1
        self._injected_seen[index] = max([seen, *(e["seq"] for e in entries)])

    # -- actions --------------------------------------------------------------------------------------------

    def _set_faults(self, spec: str, name: str) -> None:
        self.spec = spec
        for i, srv in enumerate(self.servers):
            if srv.running:
                srv.set_faults(spec)
            self.driver.emit("faults", spec=spec, name=name, server=i)

    def _worker_kill(self) -> None:
        w = self._wait_for_holder(10.0)
        if w is None:
            self.driver.emit("note", text="worker_kill: no holder found")
            self._kill_mono = time.monotonic()
            self._kill_target = ""
            return
        w.expected_dead = True
        w.proc.send_signal(signal.SIGKILL)
        self._kill_mono = self.driver.emit("worker_kill", target=w.name, holding=True)["mono"]
        self._kill_target = w.name
        w.proc.wait()

    def _await_takeover(self, timeout: float) -> None:
        end = self._kill_mono + timeout
        while time.monotonic() < end:
            if self._starts_after(self._kill_mono, self._kill_target):
                return
            self._tick()
            time.sleep(0.05)
        self.driver.emit("note", text="await_takeover: no new holder within the timeout")

    def _worker_stop(self, duration: float) -> None:
        end = time.monotonic() + 30.0
        while time.monotonic() < end:
            # A body without interrupt=True keeps running after SIGCONT, so its late write shows fencing:
            # prefer one for the first 8 s, then take any holder.
            w = self._wait_for_holder(min(10.0, max(0.1, end - time.monotonic())), prefer_plain=True)
            if w is None:
                continue
            w.proc.send_signal(signal.SIGSTOP)
            w.stopped = True
            if self._open_section(w):  # the log is flushed per record: this is its state when frozen
                stop = self.driver.emit("worker_stop", target=w.name, duration=duration)["mono"]
                self.timers.append((stop + duration, lambda w=w: self._worker_cont(w)))
                return
            w.proc.send_signal(signal.SIGCONT)  # it had just left its section: try another moment
            w.stopped = False
            time.sleep(0.1)
        self.driver.emit("note", text="worker_stop: no holder could be frozen inside its section")

    def _worker_cont(self, w: _Worker) -> None:
        w.proc.send_signal(signal.SIGCONT)
        w.stopped = False
        self.driver.emit("worker_cont", target=w.name)

    def _server_kill(self, index: int, downtime: float) -> None:
        index %= len(self.servers)
        self._collect_injected(index)
        self.servers[index].kill()
        self._injected_seen[index] = 0
        self.driver.emit("server_kill", server=index)
        self.timers.append((time.monotonic() + downtime, lambda: self._server_restart(index)))

    def _clock_offset(self) -> float:
        since, offset, rate = self._clock
        return offset + (rate - 1.0) * (time.monotonic() - since)

    def _move_clocks(self, params: dict[str, Any]) -> None:
        """Step or re-rate every server's clock; a server that is down gets it when it restarts."""
        jump, rate = params.get("jump"), params.get("rate")
        offset = self._clock_offset() + (jump or 0.0)
        self._clock = (time.monotonic(), offset, self._clock[2] if rate is None else rate)
        for srv in self.servers:
            if srv.running:
                if rate is not None:
                    srv.set_clock_rate(rate)
                if jump is not None:
                    srv.jump_clock(jump)
        self.driver.emit("clock", jump=jump, rate=rate, offset=offset)

    def _cut(self, params: dict[str, Any]) -> None:
        """Cut a holder or a waiter off from its server (see ``scheduler.py``), healed after ``duration``."""
        if params["target"] == "holder":
            w = self._wait_for_holder(5.0)
        else:
            holding = {h.name for h in self._holders()}
            waiting = [
                w
                for w in self.workers
                if w.name not in holding and not (w.expected_dead or w.stopped or w.proc.poll() is not None)
            ]
            w = waiting[0] if waiting else None
        if w is None:
            self.driver.emit("note", text=f"cut: no {params['target']} found")
            return
        proxy = self.proxies[w.name]
        proxy.partition(params["up"], params["down"], delay=params["delay"])
        self.driver.emit(
            "cut",
            target=w.name,
            role=params["target"],
            up=params["up"],
            down=params["down"],
            delay=params["delay"],
        )
        self.timers.append((time.monotonic() + params["duration"], lambda: self._heal(w.name, proxy)))

    def _heal(self, name: str, proxy: TcpProxy) -> None:
        proxy.heal()
        self.driver.emit("heal", target=name)

    def _server_restart(self, index: int) -> None:
        srv = self.servers[index]
        srv.clock_offset, srv.clock_rate = self._clock_offset(), self._clock[2]  # as if it had kept running
        srv.start()
        if self.spec:
            srv.set_faults(self.spec)
        self.driver.emit("server_restart", server=index)

    def _run_action(self, a: Action) -> None:
        if a.kind == "faults":
            self._set_faults(a.params["spec"], a.params["name"])
        elif a.kind == "worker_kill":
            self._worker_kill()
        elif a.kind == "await_takeover":
            self._await_takeover(a.params["timeout"])
        elif a.kind == "spawn_worker":
            self._spawn()
        elif a.kind == "worker_stop":
            self._worker_stop(a.params["duration"])
        elif a.kind == "server_kill":
            self._server_kill(a.params["server"], a.params["downtime"])
        elif a.kind == "clock":
            self._move_clocks(a.params)
        elif a.kind == "cut":
            self._cut(a.params)
        else:
            raise ValueError(f"unknown action {a.kind!r}")

    def _tick(self) -> None:
        """Run due timers; notice workers that died on their own (a crash), and replace them."""
        now = time.monotonic()
        due = [t for t in self.timers if t[0] <= now]
        self.timers = [t for t in self.timers if t[0] > now]
        for _, fn in sorted(due, key=lambda t: t[0]):
            fn()
        for w in list(self.workers):
            rc = w.proc.poll()
            if rc is not None and not w.expected_dead:
                w.expected_dead = True
                self.driver.emit("crash", target=w.name, rc=rc)
                self._crashes += 1
                if self._crashes > 2 * self.cfg.workers:
                    raise RuntimeError(
                        f"chaos: workers keep crashing; last output in {self.cfg.workdir / (w.name + '.out')}"
                    )
                self._spawn()

    # -- the run ---------------------------------------------------------------------------------------

    def run(self) -> Report:
        """Start everything, execute the plan, drain, check; return the report."""
        if not clock_is_shared():
            raise RuntimeError("time.monotonic() is not the machine-wide CLOCK_MONOTONIC here")
        cfg = self.cfg
        self.s3.start()  # the S3-compatible store of the S3 adapter, its own process
        try:
            self.s3_bucket = self.s3.bucket(versioned=True)
            stores = open_stores(
                self._store_url(), self.table, cfg.key, self.s3_bucket, s3_endpoint=self.s3.url
            )
            for s in stores.values():
                s.current()  # creates the tables before the workers race to
        except BaseException:
            self.s3.stop()
            raise
        try:
            self._start_servers()
            for _ in range(cfg.workers):
                self._spawn()
            self._await_boot(120.0)
            actions = plan(
                cfg.seconds,
                ttl=cfg.ttl,
                poll=cfg.poll,
                servers=len(self.servers),
                seed=cfg.seed,
                first_cycle=cfg.first_cycle,
            )
            t0 = time.monotonic()
            shift = 0.0
            for a in actions:
                while time.monotonic() < t0 + a.at + shift:
                    self._tick()
                    time.sleep(0.05)
                began = time.monotonic()
                self._run_action(a)
                if a.kind in ("worker_kill", "await_takeover", "worker_stop"):
                    shift += max(0.0, time.monotonic() - began - 0.05)
            while self.timers or time.monotonic() < t0 + cfg.seconds + shift:
                self._tick()
                time.sleep(0.05)
            self._drain()
            for i in range(len(self.servers)):
                self._collect_injected(i)
            self.driver.emit("server_injected", count=self._injected)
            writes, unreadable = _read_writes(stores)
        finally:
            self._cleanup(stores)
        events = read_events_dir(cfg.workdir)
        faults = list(read_events(cfg.workdir / "faults.jsonl"))
        report = check(events, writes["table"], faults, poll=cfg.poll)
        # The same sections, checked on each adapter's own record of the same attempts.
        report.adapters = {
            name: check(events, writes[name], faults, poll=cfg.poll) for name in ADAPTERS if name in writes
        }
        report.unreadable = unreadable
        report.model, report.mismatches = model_check(cfg.workdir, faults)
        lines = [report.line(), report.detail_line(), report.adapter_line(), report.model_line()]
        lines += report.mismatches[:20] + [v.describe() for v in report.model.violations]
        (cfg.workdir / "report.txt").write_text("\n".join(lines) + "\n")
        return report

    def _await_boot(self, timeout: float) -> None:
        """Start the plan's clock once every worker is up: on a loaded machine importing the client and the
        stores takes seconds, and a fault that lands before any worker contends tests nothing."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if all(
                w.log.exists() and any(e["ev"] == "boot" for e in read_events(w.log)) for w in self.workers
            ):
                return
            self._tick()
            time.sleep(0.1)
        self.driver.emit("note", text=f"not every worker had booted after {timeout:.0f} s; starting anyway")

    def _drain(self) -> None:
        """Ask every worker to finish; a worker still alive after the bound is a hang."""
        bound = HOLD_MAX + self.cfg.ttl + 10.0  # longest hold + one TTL for a stalled exit + slack
        for w in self.workers:
            if w.proc.poll() is None and not w.expected_dead:
                w.proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + bound
        for w in self.workers:
            if w.expected_dead:
                continue
            try:
                rc = w.proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.driver.emit("hang", target=w.name)
                w.proc.kill()
                w.proc.wait()
                continue
            if rc != 0:
                self.driver.emit("crash", target=w.name, rc=rc)

    def _cleanup(self, stores: dict[str, Any]) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
        for proxy in self.proxies.values():
            proxy.close()
        for srv in self.servers:
            srv.close()
        self.s3.stop()
        self.driver.close()
        if self.cfg.backend == "postgres":
            for store in stores.values():
                store.drop()
            try:
                import psycopg

                with psycopg.connect(self.cfg.pg_dsn, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA IF EXISTS {self._schema} CASCADE")
            except Exception as exc:  # leftovers are named chaos_*; say so rather than fail the run
                print(f"chaos: could not drop schema {self._schema}: {exc}", file=sys.stderr)
        for store in stores.values():
            store.close()


def _read_writes(stores: dict[str, Any]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    """Every store's record of the attempts; an adapter whose record cannot be read back (its data gone)
    is reported, not fatal: the run's other checks still stand, and the run is not ok."""
    writes: dict[str, list[dict[str, Any]]] = {}
    unreadable: dict[str, str] = {}
    for name, store in stores.items():
        try:
            writes[name] = [r.as_dict() for r in store.writes()]
        except Exception as exc:
            if name == "table":
                raise
            unreadable[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return writes, unreadable


def model_check(workdir: Path, faults: list[dict[str, Any]]) -> tuple[Verdict, list[str]]:
    """Check every lock call of the run in ``workdir`` against the model: the clients' call logs joined with
    the servers' histories (``history.py``); return the verdict and the answers the servers never logged."""
    loaded = load_ops(
        read_calls(workdir), read_server_history(sorted(workdir.glob("history-*.jsonl"))), faults
    )
    verdict = check_ops(loaded.ops)
    verdict.counts = loaded.counts
    return verdict, loaded.mismatches


def postgres_problem(dsn: str) -> str | None:
    """Return why PostgreSQL at ``dsn`` is unusable, or None."""
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # any failure means unusable; the reason is printed
        return f"{type(exc).__name__}: {exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the chaos suite from the command line; print per-backend lines, then the summary last."""
    p = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__.splitlines()[0])
    p.add_argument(
        "--seconds", type=float, default=None, help="total chaos seconds (default CHAOS_SECONDS or 40)"
    )
    p.add_argument("--backend", choices=["both", "sqlite", "postgres"], default="both")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--pg-dsn", default=os.environ.get("VOLCANO_TEST_PG_DSN", DEFAULT_PG_DSN))
    p.add_argument("--keep", type=Path, default=None, help="keep logs in this directory")
    args = p.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else default_seconds()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(2), "big")
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    if "postgres" in backends and (problem := postgres_problem(args.pg_dsn)) is not None:
        if os.environ.get("VOLCANO_TEST_REQUIRE_POSTGRES") == "1" or args.backend == "postgres":
            print(f"chaos: PostgreSQL unusable: {problem}", file=sys.stderr)
            return 2
        print(f"chaos: skipping PostgreSQL ({problem})")
        backends.remove("postgres")
    base = args.keep or Path(tempfile.mkdtemp(prefix="volcano-chaos-"))
    total = Report()
    where = ", ".join(backends)
    print(f"chaos: {seconds:.0f} s over {where}, {args.workers} workers, seed {seed}, logs in {base}")
    for n, backend in enumerate(backends):
        cfg = ChaosConfig(
            backend=backend,
            first_cycle=n,
            seconds=seconds / len(backends),
            workdir=base / backend,
            workers=args.workers,
            seed=seed,
            pg_dsn=args.pg_dsn,
        )
        report = ChaosRun(cfg).run()
        print(f"{backend}: {report.line()}")
        print(f"{backend}: {report.detail_line()}")
        print(f"{backend}: {report.adapter_line()}")
        print(f"{backend}: {report.model_line()}")
        violations = report.model.violations if report.model is not None else []
        for text in report.mismatches[:20] + [v.describe() for v in violations]:
            print(f"{backend}: {text}")
        total = total + report
    print(total.detail_line())
    print(total.adapter_line())
    print(total.model_line())
    print(total.line(), flush=True)
    return 0 if total.ok else 1


if __name__ == "__main__":
    sys.exit(main())
