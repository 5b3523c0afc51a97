"""Chaos for the Airflow operator, full stack: no task reports success after its lock was lost.

Real Airflow processes (api-server, scheduler with LocalExecutor, dag processor, triggerer, on SQLite)
run two contending runs of the example migration DAG against a lock server of this test's own, with
fault injection on (503s, dropped connections). While one run holds the lock, the lock server is killed
with SIGKILL and kept down for longer than the lease's TTL + 1 s, then restarted on the same database:
the holder's lease certainly lapses. Whether a lease was lost is decided from the lock server's own
request log (``tests/chaos/oracle.py``), never from the client; each run's ownership tokens are derived
the way the operator derives them. Belongs to the chaos suite (tests/chaos); it lives here because
only the Airflow environment can run it.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.helpers import Stack, VolcanoConn, owner_tokens, running_stack, volcano_conn_json
from tests.chaos.oracle import lease_verdicts
from volcano_locks.fencing import FencedTable
from volcano_locks.server.harness import LocalServer

pytestmark = pytest.mark.slow

DAG_ID = "volcano_migration"
TTL = 10  # the migration DAG's lease TTL
FAULTS = "status=503:rate=0.05,drop:rate=0.03"
DOWNTIME = TTL + 3.0  # longer than TTL + the 1 s takeover grace: the holder's lease certainly lapses


@pytest.fixture
def chaos_conn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[VolcanoConn]:
    """A faulty lock server of the test's own, which its Airflow connection points at."""
    srv = LocalServer(db=str(tmp_path / "locks.sqlite3"), admin=True, quota=1_000_000, faults=FAULTS)
    srv.start()
    service_key, anon_key = srv.service_key, srv.anon_key
    monkeypatch.setenv(
        "AIRFLOW_CONN_VOLCANO_DEFAULT", volcano_conn_json(srv.url, service_key, anon_key=anon_key)
    )
    try:
        yield VolcanoConn(srv, srv.url, service_key, anon_key)
    finally:
        srv.close()


@pytest.fixture
def stack(airflow_db: Path, chaos_conn: VolcanoConn, tmp_path: Path) -> Iterator[Stack]:
    with running_stack(airflow_db, tmp_path) as s:
        yield s


def _history(db: str, resource: str) -> list[tuple[int, str, bool]]:
    return [(w.fencing_token, w.value, w.accepted) for w in FencedTable(db).history(resource)]


def _task_log(stack: Stack, run_id: str) -> str:
    """The last lines of a run's task log that say why it ended (for the report and failure messages)."""
    lines: list[str] = []
    for path in sorted((stack.home / "logs").rglob("*")):
        if path.is_file() and f"run_id={run_id}" in str(path):
            for line in path.read_text(errors="replace").splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and record.get("level") in ("error", "warning", "critical"):
                    lines.append(str(record.get("event", ""))[:200])
    return " | ".join(lines[-4:])


@pytest.mark.timeout(900)  # a hang catcher: a stack start and two runs on a busy two-core machine
def test_operator_never_succeeds_after_its_lock_was_lost_under_faults_and_a_server_kill(
    stack: Stack, chaos_conn: VolcanoConn, unique_key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = chaos_conn.server
    resource = f"chaos-{unique_key}"
    examples_db = stack.env["VOLCANO_EXAMPLES_DB"]
    stack.unpause_when_parsed(DAG_ID, timeout=180)
    # 45 s of writes: the holder is still writing when the server is killed, however long the two CLI
    # triggers and its start took (with 12 s, the first run had finished before the kill on a busy machine).
    # The second trigger runs beside the watch for the first write: a CLI call took 40 s under make test's
    # load, and the first run had written most of its steps before the watch began, then the kill.
    conf = json.dumps({"lock_key": unique_key, "steps": 30, "step_seconds": 1.5, "resource": resource})
    stack.cli("dags", "trigger", DAG_ID, "--run-id", "chaos_a", "--conf", conf)
    failed: list[BaseException] = []

    def trigger_second() -> None:
        try:
            stack.cli("dags", "trigger", DAG_ID, "--run-id", "chaos_b", "--conf", conf)
        except BaseException as exc:  # reported by the main thread after the kill
            failed.append(exc)

    second = threading.Thread(target=trigger_second)
    second.start()

    # Once a run holds the lock and has written, kill the lock server past the lease's TTL.
    requests: list[dict[str, Any]] = []
    deadline = time.monotonic() + 240
    while not _history(examples_db, resource):
        stack.alive()
        assert time.monotonic() < deadline, "no run ever wrote under the lock"
        time.sleep(0.2)
    holder_run = _history(examples_db, resource)[0][1].split(" step ")[0]
    requests += [{**e, "seq": e["seq"]} for e in srv.requests()]
    srv.kill()
    killed_at = time.monotonic()
    time.sleep(DOWNTIME)
    srv.start()  # same port, database and secret
    restarted_at = time.monotonic()
    second.join(120)
    assert not second.is_alive() and not failed, failed or "the second run's trigger did not return"

    deadline = time.monotonic() + 300
    while True:
        stack.alive()
        states = dict(stack.query("SELECT run_id, state FROM dag_run WHERE dag_id = ?", DAG_ID))
        if len(states) == 2 and all(s in ("success", "failed") for s in states.values()):
            break
        assert time.monotonic() < deadline, f"runs did not finish (a hang): {states}"
        time.sleep(0.5)
    offset = 1 + max((e["seq"] for e in requests), default=0)  # the restarted server numbers afresh
    requests += [{**e, "seq": e["seq"] + offset} for e in srv.requests()]

    # Each run's ownership tokens, derived exactly as the operator derives them (one per try).
    verdicts_by_run: dict[str, list[Any]] = {}
    ended: dict[str, float] = {}
    all_verdicts = lease_verdicts(requests, unique_key, TTL)
    for dag_id, task_id, run_id, map_index, try_number, end_date in stack.query(
        "SELECT dag_id, task_id, run_id, map_index, try_number, end_date FROM task_instance WHERE dag_id = ?",
        DAG_ID,
    ):
        if end_date:
            when = datetime.fromisoformat(str(end_date))
            ended[run_id] = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
        tokens = owner_tokens(
            chaos_conn.service_key,
            unique_key,
            [(dag_id, task_id, run_id, map_index, try_number)],
            stack.logs(run_id),
        )
        hashes = {hashlib.sha256(t.encode()).hexdigest()[:12] for t in tokens}
        verdicts_by_run[run_id] = [v for h, v in all_verdicts.items() if h in hashes]

    # Lost: the server's log proves it, or no release ever came and the task ended after the lease lapsed.
    lost_runs = {
        run
        for run, vs in verdicts_by_run.items()
        if any(
            v.lost or (v.released_at is None and run in ended and v.lapsed_by(ended[run], TTL)) for v in vs
        )
    }
    logs = {run: _task_log(stack, run) for run in states}
    where = f"states={states} holder={holder_run} verdicts={verdicts_by_run} ended={ended} logs={logs}"
    for run_id, state in states.items():
        if state == "success":
            assert run_id not in lost_runs, "a run reported success after its lease was lost: " + where
    # The attack landed: the run that held the lock could not renew for longer than its TTL, so its lease was
    # lost (its keeper gives up before the server-side lapse, or the server shows the lapse): it must fail.
    assert states[holder_run] == "failed", where

    history = _history(examples_db, resource)
    accepted = [t for t, _, ok in history if ok]
    assert accepted == sorted(accepted), f"a stale write was accepted: {history}"
    other = next(r for r in states if r != holder_run)
    with capsys.disabled():
        print(
            f"\nairflow-chaos: runs=2 success={sum(s == 'success' for s in states.values())} "
            f"failed={sum(s == 'failed' for s in states.values())} lost_on_server={len(lost_runs)} "
            f"success_after_loss=0 holder={holder_run}:{states[holder_run]} other={other}:{states[other]} "
            f"writes={len(accepted)} rejected={len(history) - len(accepted)} "
            f"server_down_s={restarted_at - killed_at:.1f} (ttl {TTL}; faults {FAULTS})"
        )
        print(f"airflow-chaos: {other} ended: {logs[other][-600:]}")
