"""`make demo`: the main job in one command, against a local Volcano-compatible locks server.

It starts the local server (SQLite in a temporary directory, a free port), then runs two contenders for
the same lock in each orchestrator:

* Airflow: two runs of the example ``volcano_migration`` DAG (``airflow dags test``, Airflow environment),
  started together. The one that loses the race waits its turn deferred in the triggerer (no worker
  slot), then migrates with a higher fencing token.
* Prefect: two runs of the example ``leader-rollup`` flow (Prefect environment), started together. The
  one that loses finds the lock held and finishes Completed, its message saying Skipped.

Every protected write goes through the fencing check of one table. At the end the demo sends the table
a write with the first holder's (now stale) fencing token, and prints who held, who waited or skipped,
the fencing tokens the table saw, and that the stale write was rejected. It leaves nothing running.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from volcano_locks import VolcanoLocks
from volcano_locks.fencing import FencedTable
from volcano_locks.server.harness import LocalServer

REPO = Path(__file__).resolve().parents[1]
AIRFLOW = REPO / ".venv-airflow" / "bin" / "airflow"
PREFECT_PYTHON = REPO / ".venv-prefect" / "bin" / "python"
MIGRATION_KEY = "schema-migration"
MIGRATION_RESOURCE = "schema"
ROLLUP_DAY = "2026-11-29"
ROLLUP_KEY = f"rollup:{ROLLUP_DAY}"
START = time.monotonic()


def say(message: str) -> None:
    """Print one progress line with the seconds since the demo started."""
    print(f"[{time.monotonic() - START:5.1f}s] {message}", flush=True)


@dataclass
class Row:
    """One line of the final table."""

    orchestrator: str
    lock: str
    contender: str
    outcome: str
    fencing_token: str


class Contender:
    """One orchestrator run in its own process, its output kept in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        self._out = log.open("w")
        # A session of its own, so that stop() also ends what it started (Prefect's temporary server).
        self.proc = subprocess.Popen(
            argv, env=env, stdout=self._out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._out.close()

    def stop(self) -> None:
        """Kill the run and everything it started, if it is still going."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._out.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def wait_until(what: str, predicate: Callable[[], bool], contender: Contender, timeout: float) -> None:
    """Poll until ``predicate`` holds; fail early with the contender's log if it exits first."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if contender.proc.poll() is not None:
            raise SystemExit(f"{contender.name} ended before {what}:\n{contender.output()[-3000:]}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting until {what}")
        time.sleep(0.25)


def finish(contenders: list[Contender], timeout: float) -> None:
    """Wait for every contender to succeed."""
    for contender in contenders:
        code = contender.wait(timeout)
        if code != 0:
            raise SystemExit(f"{contender.name} failed (exit {code}):\n{contender.output()[-4000:]}")


def stop_all(contenders: list[Contender]) -> None:
    """Leave none of them running, whatever happened."""
    for contender in contenders:
        contender.stop()


def run_airflow(work: Path, env: dict[str, str], client: VolcanoLocks, table: FencedTable) -> list[Row]:
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
    say("Airflow: creating the metadata database (airflow db migrate, about 20 s)")
    subprocess.run([str(AIRFLOW), "db", "migrate"], env=envs[0], check=True, capture_output=True)
    # Each contender gets its own copy: two `airflow dags test` processes on one SQLite file would
    # fight over its write lock, which is not what this demo is about.
    shutil.copy(homes[0] / "airflow.db", homes[1] / "airflow.db")

    # Both start together; whichever acquires first holds the lock for ~12 s, long enough that the other
    # finds it taken however their start-up times differ.
    conf = json.dumps({"steps": 4, "step_seconds": 3})
    say("Airflow: starting two runs of volcano_migration at once (airflow dags test, ~15 s to start)")
    runs = [
        Contender(
            f"Airflow run {name}",
            [str(AIRFLOW), "dags", "test", "volcano_migration", "-c", conf],
            home_env,
            work / f"airflow-{name}.log",
        )
        for name, home_env in zip("AB", envs, strict=True)
    ]
    race(runs, client, MIGRATION_KEY, f"Airflow: one run holds {MIGRATION_KEY!r}; the other must wait for it")
    say("Airflow: both runs finished")

    # Each run writes with its run id as the writer, in the order the lock passed between them.
    writers: dict[str, list[int]] = {}
    for write in table.history(MIGRATION_RESOURCE):
        if write.accepted:
            writers.setdefault(write.writer, []).append(write.fencing_token)
    if len(writers) != 2:
        raise SystemExit(f"expected fenced writes from two runs, found {sorted(writers)}")
    rows = []
    for order, (run_id, tokens) in enumerate(writers.items()):
        run = next(r for r in runs if run_id in r.output())
        if order == 0:
            outcome = f"held the lock first, {len(tokens)} fenced writes"
        elif "deferring until it is free" in run.output():
            outcome = f"found it held, waited deferred in the triggerer, then held it, {len(tokens)} writes"
        else:
            outcome = f"started after the first run finished (no contention), {len(tokens)} writes"
        rows.append(
            Row("Airflow", MIGRATION_KEY, run.name.removeprefix("Airflow "), outcome, _tokens(tokens))
        )
    return rows


def race(runs: list[Contender], client: VolcanoLocks, key: str, held: str) -> None:
    """Let ``runs`` contend for ``key``: say ``held`` once one holds it, then wait for all to finish."""
    try:
        wait_until("a run holds the lock", lambda: client.get(key).held, runs[0], 180)
        say(held)
        finish(runs, timeout=300)
    finally:
        stop_all(runs)


def _tokens(tokens: list[int]) -> str:
    return ", ".join(str(t) for t in sorted(set(tokens)))


def run_prefect(work: Path, env: dict[str, str], client: VolcanoLocks) -> list[Row]:
    """Two runs of the leader-only rollup flow; the second finds the lock held and is Skipped."""
    code = (
        "import sys; sys.path.insert(0, 'flows');"
        "from leader_rollup import leader_rollup;"
        f"state = leader_rollup({ROLLUP_DAY!r}, work_seconds=float(sys.argv[1]));"
        "import json; result = state.result(raise_on_failure=False);"
        "print('DEMO-RESULT ' + json.dumps({'state': state.name, 'message': state.message or '',"
        " 'fencing_token': result.get('fencing_token') if isinstance(result, dict) else None}))"
    )
    say("Prefect: starting two runs of leader-rollup at once (each starts a temporary Prefect server, ~20 s)")
    runs = []
    for name in "AB":
        home = work / f"prefect-{name}"
        home.mkdir()
        flow_env = {**env, "PREFECT_HOME": str(home), "PREFECT_LOGGING_LEVEL": "WARNING"}
        argv = [str(PREFECT_PYTHON), "-c", code, "15"]  # the holder works for 15 s
        runs.append(Contender(f"Prefect flow {name}", argv, flow_env, work / f"prefect-{name}.log"))
    race(
        runs,
        client,
        ROLLUP_KEY,
        f"Prefect: one flow holds {ROLLUP_KEY!r}; the other will find it taken and skip",
    )
    say("Prefect: both flows finished")
    rows = []
    for run in runs:
        line = next((ln for ln in run.output().splitlines() if ln.startswith("DEMO-RESULT ")), None)
        if line is None:
            raise SystemExit(f"{run.name} printed no result:\n{run.output()[-3000:]}")
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
    line = lambda c: "| " + " | ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)) + " |"  # noqa: E731
    print()
    print(line(headers))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for c in cells[1:]:
        print(line(c))
    print()


def main() -> int:
    # SIGTERM (make interrupted, CI cancelled) unwinds like Ctrl-C: the server and every run are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="volcano-demo-"))
    try:
        say("starting the local Volcano-compatible locks server (SQLite, a free port)")
        with LocalServer(db=str(work / "locks.sqlite3")) as server:
            say(f"server ready at {server.url} (project 'local')")
            db = str(work / "protected.sqlite3")
            table = FencedTable(db)
            env = {
                **{
                    k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PREFECT", "VOLCANO"))
                },
                **server.env(),
                "VOLCANO_EXAMPLES_DB": db,
                "AIRFLOW_CONN_VOLCANO_DEFAULT": json.dumps(
                    {"conn_type": "volcano", "host": server.url, "password": server.service_key}
                ),
            }
            with VolcanoLocks(api_url=server.url, service_key=server.service_key) as client:
                airflow_rows = run_airflow(work, env, client, table)
                prefect_rows = run_prefect(work, env, client)
            stale = stale_write(table, airflow_rows)
            say("stopping the server")
        print_table([*airflow_rows, *prefect_rows, stale])
        ok = "rejected" in stale.outcome
        print("The protected table rejected the stale write." if ok else "FENCING FAILED")
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
