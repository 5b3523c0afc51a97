"""`make demo`: the main job in one command, against a local Volcano-compatible locks server.

It starts the local locks server (SQLite in a temporary directory, a free port) and one Prefect server
(``prefect server start`` on a free port, waited for until it answers), then runs two contenders for the
same lock in each orchestrator:

* Airflow: two runs of the example ``volcano_migration`` DAG (``airflow dags test``, Airflow environment),
  started together. The one that loses the race waits its turn deferred in the triggerer (no worker
  slot), then migrates with a higher fencing token.
* Prefect: two runs of the example ``leader-rollup`` flow (Prefect environment), started together, both
  talking to the one Prefect server. The one that loses finds the lock held and finishes Completed, its
  message saying Skipped.

Every protected write goes through the fencing check of one table. At the end the demo sends the table
a write with the first holder's (now stale) fencing token, and prints the whole story: who held, who
waited or skipped, the fencing tokens the table saw, and that the stale write was refused. What it learnt
is printed as it goes, so a step that fails still leaves the earlier ones told. It leaves nothing running.

How long it takes (``make demo`` with the environments built, measured on a 2-core machine): see
``ESTIMATES``, which the progress lines quote.

Settings:

* ``--timeout SECONDS`` (``make demo DEMO_TIMEOUT=...``, default 600): the longest the demo waits for any
  one step (a server to answer, the metadata database, a run to hold the lock or to finish) before it
  gives up, says which step and shows that process's output.
* Your environment reaches every process the demo starts (``PREFECT_*``, ``AIRFLOW__*`` and the rest):
  the demo sets only what points them at its own servers and temporary directories (``MANAGED``). With
  ``PREFECT_API_URL`` set, the flows use that Prefect server and the demo starts none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from volcano_locks import VolcanoLocks
from volcano_locks.fencing import FencedTable
from volcano_locks.server.harness import LocalServer

REPO = Path(__file__).resolve().parents[1]
AIRFLOW = REPO / ".venv-airflow" / "bin" / "airflow"
PREFECT_BIN = REPO / ".venv-prefect" / "bin"
MIGRATION_KEY = "schema-migration"
MIGRATION_RESOURCE = "schema"
ROLLUP_DAY = "2026-11-29"
ROLLUP_KEY = f"rollup:{ROLLUP_DAY}"
DEFAULT_TIMEOUT_S = 600.0
# What each step took on this project's 2-core machine, shared with other test suites (load average 4-15),
# in six runs, five from fresh clones, one of them with two CPU-bound processes beside it
# (`tests/e2e/test_demo.py`); docs/getting-started.md has each step's range.
# The Prefect server starts while the Airflow half runs, so its start adds nothing to the total.
ESTIMATES = {
    "airflow-db": "30 s-1 min",
    "airflow-runs": "1.5-3 min",
    "prefect-server": "1-2 min",
    "prefect-runs": "35 s-1 min",
    "total": "3-5 min",
}
STEPS = {
    "airflow-db": "Airflow's metadata database",
    "airflow-runs": "two Airflow runs through the lock",
    "prefect-server": "the Prefect server's start",
    "prefect-runs": "two Prefect flows",
    "total": "the whole demo",
}
# The variables the demo sets for the processes it starts; everything else in your environment reaches them.
MANAGED = (
    "AIRFLOW_HOME",
    "AIRFLOW__CORE__DAGS_FOLDER",
    "AIRFLOW__CORE__LOAD_EXAMPLES",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
    "AIRFLOW_CONN_VOLCANO_DEFAULT",
    "PREFECT_HOME",
    "VOLCANO_API_URL",
    "VOLCANO_ANON_KEY",
    "VOLCANO_SERVICE_KEY",
    "VOLCANO_EXAMPLES_DB",
)
START = time.monotonic()


def say(message: str) -> None:
    """Print one progress line with the seconds since the demo started."""
    print(f"[{time.monotonic() - START:5.1f}s] {message}", flush=True)


TOOK: dict[str, float] = {}
"""How long each step took, in seconds, by its ESTIMATES name: printed at the end beside the estimate."""


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        TOOK[name] = time.monotonic() - started


class DemoFailed(Exception):
    """A step did not happen in time, or a process failed: the message says which, with its output."""


@dataclass
class Row:
    """One line of the story."""

    orchestrator: str
    lock: str
    contender: str
    outcome: str
    fencing_token: str


class Process:
    """A process the demo started, its output kept in a log file, in a session of its own."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        self._out = log.open("w")
        # A session of its own, so that stop() also ends whatever it started.
        self.proc = subprocess.Popen(
            argv,
            env=dict(env),
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            start_new_session=True,
        )

    def stop(self) -> None:
        """End it and everything it started, if it is still going."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._out.close()

    def output(self, tail: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-tail:]


def wait_until(what: str, predicate: Callable[[], bool], process: Process, timeout: float) -> None:
    """Poll until ``predicate`` holds; fail early with the process's output if it exits first."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.proc.poll() is not None:
            raise DemoFailed(f"{process.name} ended before {what}:\n{process.output()}")
        if time.monotonic() > deadline:
            raise DemoFailed(
                f"gave up after {timeout:.0f} s waiting until {what} (make demo DEMO_TIMEOUT=... waits "
                f"longer); {process.name} said:\n{process.output()}"
            )
        time.sleep(0.25)


def finish(processes: list[Process], timeout: float) -> None:
    """Wait for every process to exit with 0, ``timeout`` seconds in all."""
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            code = process.proc.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            raise DemoFailed(
                f"{process.name} had not finished after {timeout:.0f} s (make demo DEMO_TIMEOUT=... waits "
                f"longer); it said:\n{process.output()}"
            ) from None
        if code != 0:
            raise DemoFailed(f"{process.name} failed (exit {code}):\n{process.output(4000)}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def environment(managed: Mapping[str, str]) -> dict[str, str]:
    """Your environment, with the demo's own values for the variables it manages (MANAGED)."""
    return {**{k: v for k, v in os.environ.items() if k not in MANAGED}, **managed}


@contextlib.contextmanager
def locks_server(work: Path, timeout: float) -> Iterator[LocalServer]:
    """The local locks server (`volcano-locks serve`), given ``timeout`` to print that it is ready."""
    server = LocalServer(db=str(work / "locks.sqlite3"), startup_timeout=timeout)
    try:
        server.start()
    except RuntimeError as exc:  # it did not say `ready` in time, or exited: the harness says which
        raise DemoFailed(f"the local locks server did not start: {exc}") from None
    try:
        yield server
    finally:
        server.stop()


def start_prefect_server(work: Path, env: Mapping[str, str]) -> tuple[str, Process]:
    """``prefect server start`` on a free port (no UI, no background services: the flows need the API)."""
    port = free_port()
    home = work / "prefect-server"
    home.mkdir()
    server_env = {
        **env,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_SERVER_LEVEL": env.get("PREFECT_LOGGING_SERVER_LEVEL", "WARNING"),
    }
    argv = [str(PREFECT_BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    process = Process(
        "the Prefect server", [*argv, "--no-ui", "--no-services"], server_env, work / "prefect.log"
    )
    return f"http://127.0.0.1:{port}/api", process


def prefect_answers(api_url: str) -> bool:
    try:
        return httpx.get(f"{api_url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def note_when_ready(api_url: str, process: Process) -> threading.Thread:
    """Record in TOOK when the Prefect server first answers (it starts while the Airflow half runs)."""

    def watch() -> None:
        started = time.monotonic()
        while process.proc.poll() is None and not prefect_answers(api_url):
            time.sleep(0.5)
        TOOK["prefect-server"] = time.monotonic() - started

    thread = threading.Thread(target=watch, name="demo-prefect-ready", daemon=True)
    thread.start()
    return thread


def run_airflow(work: Path, env: Mapping[str, str], client: VolcanoLocks, timeout: float) -> list[Row]:
    """Two runs of the migration DAG contend for one lock; the second waits deferred, then runs."""
    homes = [work / "airflow-a", work / "airflow-b"]
    envs = []
    for home in homes:
        home.mkdir()
        envs.append(
            {
                **env,
                "AIRFLOW_HOME": str(home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
            }
        )
    say(f"Airflow: creating the metadata database (airflow db migrate, {ESTIMATES['airflow-db']})")
    migrate = Process("airflow db migrate", [str(AIRFLOW), "db", "migrate"], envs[0], work / "migrate.log")
    try:
        with step("airflow-db"):
            finish([migrate], timeout)
    finally:
        migrate.stop()
    # Each contender gets its own copy: two `airflow dags test` processes on one SQLite file would
    # fight over its write lock, which is not what this demo is about.
    shutil.copy(homes[0] / "airflow.db", homes[1] / "airflow.db")

    # Both start together; whichever acquires first holds the lock for ~20 s, long enough that the other
    # finds it taken however their start-up times differ on a loaded machine.
    conf = json.dumps({"steps": 5, "step_seconds": 4})
    say(
        "Airflow: starting two runs of volcano_migration at once (airflow dags test; "
        f"{ESTIMATES['airflow-runs']} until both are done)"
    )
    runs = [
        Process(
            f"Airflow run {name}",
            [str(AIRFLOW), "dags", "test", "volcano_migration", "-c", conf],
            home_env,
            work / f"airflow-{name}.log",
        )
        for name, home_env in zip("AB", envs, strict=True)
    ]
    with step("airflow-runs"):
        race(
            runs,
            client,
            MIGRATION_KEY,
            f"Airflow: one run holds {MIGRATION_KEY!r}; the other must wait",
            timeout,
        )
    say("Airflow: both runs finished")

    # Each run writes with its run id as the writer, in the order the lock passed between them.
    table = FencedTable(env["VOLCANO_EXAMPLES_DB"])
    writers: dict[str, list[int]] = {}
    for write in table.history(MIGRATION_RESOURCE):
        if write.accepted:
            writers.setdefault(write.writer, []).append(write.fencing_token)
    if len(writers) != 2:
        raise DemoFailed(f"expected fenced writes from two runs, found {sorted(writers)}")
    rows = []
    for order, (run_id, tokens) in enumerate(writers.items()):
        run = next(r for r in runs if run_id in r.output(tail=10**7))
        if order == 0:
            outcome = f"held the lock first, {len(tokens)} fenced writes"
        elif "deferring until it is free" in run.output(tail=10**7):
            outcome = f"found it held, waited deferred in the triggerer, then held it, {len(tokens)} writes"
        else:
            outcome = f"started after the first run finished (no contention), {len(tokens)} writes"
        rows.append(
            Row("Airflow", MIGRATION_KEY, run.name.removeprefix("Airflow "), outcome, _tokens(tokens))
        )
    return rows


def race(runs: list[Process], client: VolcanoLocks, key: str, held: str, timeout: float) -> None:
    """Let ``runs`` contend for ``key``: say ``held`` once one holds it, then wait for all to finish."""
    try:
        wait_until(f"a run holds {key!r}", lambda: client.get(key).held, runs[0], timeout)
        say(held)
        finish(runs, timeout)
    finally:
        for run in runs:
            run.stop()


def _tokens(tokens: list[int]) -> str:
    return ", ".join(str(t) for t in sorted(set(tokens)))


def run_prefect(work: Path, env: Mapping[str, str], client: VolcanoLocks, timeout: float) -> list[Row]:
    """Two runs of the leader-only rollup flow; the second finds the lock held and is Skipped."""
    code = (
        "import sys; sys.path.insert(0, 'flows');"
        "from leader_rollup import leader_rollup;"
        f"state = leader_rollup({ROLLUP_DAY!r}, work_seconds=float(sys.argv[1]));"
        "import json; result = state.result(raise_on_failure=False);"
        "print('DEMO-RESULT ' + json.dumps({'state': state.name, 'message': state.message or '',"
        " 'fencing_token': result.get('fencing_token') if isinstance(result, dict) else None}))"
    )
    say(
        "Prefect: starting two runs of leader-rollup at once, both on the one Prefect server "
        f"({ESTIMATES['prefect-runs']} until both are done)"
    )
    runs = []
    for name in "AB":
        home = work / f"prefect-{name}"
        home.mkdir()
        flow_env = {
            **env,
            "PREFECT_HOME": str(home),
            "PREFECT_LOGGING_LEVEL": env.get("PREFECT_LOGGING_LEVEL", "WARNING"),
        }
        argv = [str(PREFECT_BIN / "python"), "-c", code, "20"]  # the holder works for 20 s
        runs.append(Process(f"Prefect flow {name}", argv, flow_env, work / f"prefect-{name}.log"))
    with step("prefect-runs"):
        race(
            runs, client, ROLLUP_KEY, f"Prefect: one flow holds {ROLLUP_KEY!r}; the other will skip", timeout
        )
    say("Prefect: both flows finished")
    rows = []
    for run in runs:
        line = next((ln for ln in run.output(10**7).splitlines() if ln.startswith("DEMO-RESULT ")), None)
        if line is None:
            raise DemoFailed(f"{run.name} printed no result:\n{run.output()}")
        result = json.loads(line.removeprefix("DEMO-RESULT "))
        if result["state"] == "Skipped" or result["message"].startswith("Skipped: "):
            outcome = "skipped: another run held the lock (Completed, message 'Skipped: ...')"
        else:
            outcome = f"held the lock, did the rollup ({result['state']})"
        token = result["fencing_token"]
        contender = run.name.removeprefix("Prefect ")
        rows.append(Row("Prefect", ROLLUP_KEY, contender, outcome, "-" if token is None else str(token)))
    return rows


def stale_write(table: FencedTable, airflow_rows: list[Row]) -> Row:
    """Replay a write with the first holder's fencing token after the second holder wrote."""
    first_token = int(airflow_rows[0].fencing_token)
    first_run = airflow_rows[0].contender
    accepted = table.write(
        MIGRATION_RESOURCE,
        MIGRATION_KEY,
        first_token,
        f"late write from {first_run}",
        writer="demo: stale replay",
    )
    stored = table.read(MIGRATION_RESOURCE)
    assert stored is not None
    outcome = (
        f"ACCEPTED (this must never happen; the table holds {stored.fencing_token})"
        if accepted
        else f"rejected by the fencing check: the table holds token {stored.fencing_token}"
    )
    return Row("fence", MIGRATION_KEY, f"{first_run}, late", f"stale write: {outcome}", str(first_token))


def print_table(rows: list[Row]) -> None:
    headers = ("orchestrator", "lock", "contender", "outcome", "fencing token")
    cells = [headers] + [(r.orchestrator, r.lock, r.contender, r.outcome, r.fencing_token) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(headers))]

    def line(cell: tuple[str, ...]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(cell, widths, strict=True)) + " |"

    print()
    print(line(headers))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for cell in cells[1:]:
        print(line(cell))
    print(flush=True)


def tell(rows: list[Row]) -> None:
    """Say each line of the story as soon as it is known."""
    for row in rows:
        say(f"  {row.orchestrator} {row.contender}: {row.outcome} (fencing token {row.fencing_token})")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/demo.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"the longest to wait for any one step, in seconds (default {DEFAULT_TIMEOUT_S:.0f})",
    )
    args = parser.parse_args(argv)
    if not args.timeout > 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # SIGTERM (make interrupted, CI cancelled) unwinds like Ctrl-C: the servers and every run are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="volcano-demo-"))
    story: list[Row] = []
    prefect_server: Process | None = None
    ready_watch: threading.Thread | None = None
    say(
        f"the whole demo takes {ESTIMATES['total']} on a 2-core machine; "
        f"each step waits up to {args.timeout:.0f} s"
    )
    try:
        say("starting the local Volcano-compatible locks server (SQLite, a free port)")
        with locks_server(work, args.timeout) as server:
            say(f"locks server ready at {server.url} (project 'local')")
            db = str(work / "protected.sqlite3")
            table = FencedTable(db)
            managed = {
                **server.env(),
                "VOLCANO_EXAMPLES_DB": db,
                "AIRFLOW_CONN_VOLCANO_DEFAULT": json.dumps(
                    {"conn_type": "volcano", "host": server.url, "password": server.service_key}
                ),
            }
            prefect_env = environment(managed)
            if os.environ.get("PREFECT_API_URL"):
                say(
                    f"Prefect: using your Prefect server at {os.environ['PREFECT_API_URL']} (PREFECT_API_URL)"
                )
                api_url = os.environ["PREFECT_API_URL"]
            else:
                # Started now, so it gets ready while the Airflow half runs.
                api_url, prefect_server = start_prefect_server(work, prefect_env)
                ready_watch = note_when_ready(api_url, prefect_server)
                say(f"Prefect: starting one Prefect server at {api_url} ({ESTIMATES['prefect-server']})")
                prefect_env["PREFECT_API_URL"] = api_url
            with VolcanoLocks(api_url=server.url, service_key=server.service_key) as client:
                airflow_rows = run_airflow(work, environment(managed), client, args.timeout)
                story += airflow_rows
                tell(airflow_rows)
                if prefect_server is not None and ready_watch is not None:
                    wait_until(
                        f"the Prefect server answers at {api_url}",
                        lambda: prefect_answers(api_url),
                        prefect_server,
                        args.timeout,
                    )
                    ready_watch.join(timeout=30)
                    took = TOOK.get("prefect-server", 0.0)
                    say(f"Prefect: server ready (it answered {took:.0f} s after its start)")
                prefect_rows = run_prefect(work, prefect_env, client, args.timeout)
                story += prefect_rows
                tell(prefect_rows)
            stale = stale_write(table, airflow_rows)
            story.append(stale)
            tell([stale])
            say("stopping the servers")
        print_table(story)
        TOOK["total"] = time.monotonic() - START
        print("How long each step took here:", flush=True)
        for name, seconds in TOOK.items():
            print(f"  {STEPS[name]}: {seconds:.0f} s (estimate {ESTIMATES[name]})", flush=True)
        ok = "rejected" in stale.outcome
        print("The protected table rejected the stale write." if ok else "FENCING FAILED", flush=True)
        return 0 if ok else 1
    except DemoFailed as exc:
        if story:
            print("\nWhat happened before the failure:")
            print_table(story)
        print(f"make demo failed: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if prefect_server is not None:
            prefect_server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
