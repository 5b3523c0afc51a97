"""Real Airflow processes (api-server, scheduler with LocalExecutor, dag processor, triggerer) on SQLite.

Two runs of the migration DAG contend for one key: one waits deferred in the triggerer while the
other runs, both succeed one after the other, the fenced table has no stale write, and neither
the service key nor any ownership token is in trigger rows, XCom rows, next_kwargs or task logs.

The stack runs with the lock's metrics and spans turned on the way an operator turns them on:
``[metrics] statsd_on`` aimed at a StatsD listener on the loopback and ``[traces] otel_on`` exporting
OTLP/HTTP to a collector on the loopback (both run by this test). The deferred wait and both holds must
reach StatsD under Airflow's prefix, named the Airflow way; the ``volcano.lock.wait`` span must be a child
of the triggerer's span for that task instance and each ``volcano.lock.hold`` span a child of the worker's
span for its task instance, in the DAG run's trace, with ``renewed`` and ``released`` events carrying the
fencing token that went to XCom. Nothing secret is in a metric name, a span or an event.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.helpers import STACK_HANG_BOUND, Stack, owner_tokens, running_stack, until
from tests.support.otlp import Received, otlp_collector
from volcano_locks.fencing import FencedTable

pytestmark = [pytest.mark.slow, STACK_HANG_BOUND]

DAG_ID = "volcano_migration"
TASK_ID = "migrate"
STEPS = 12  # of 2 s each, per run


@dataclass
class Collected:
    """What the StatsD listener and the OTLP collector received."""

    otlp: Received
    lines: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def named(self, name: str) -> list[dict[str, Any]]:
        return self.otlp.named(name)


def _listen_statsd(sock: socket.socket, into: Collected, stop: threading.Event) -> None:
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        with into.lock:
            into.lines += data.decode().splitlines()


@pytest.fixture
def collected() -> Iterator[tuple[Collected, dict[str, str]]]:
    """A StatsD listener and an OTLP/HTTP trace collector on the loopback, and the settings aiming at them."""
    stop = threading.Event()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock, otlp_collector() as otlp:
        sock.bind(("127.0.0.1", 0))
        into = Collected(otlp)
        listener = threading.Thread(target=_listen_statsd, args=(sock, into, stop), daemon=True)
        listener.start()
        env = {
            "AIRFLOW__METRICS__STATSD_ON": "True",
            "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(sock.getsockname()[1]),
            "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
            "AIRFLOW__TRACES__OTEL_ON": "True",
            "OTEL_TRACES_EXPORTER": "otlp_proto_http",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{otlp.url}/v1/traces",
            "OTEL_BSP_SCHEDULE_DELAY": "500",
        }
        try:
            yield into, env
        finally:
            stop.set()
            listener.join(5)


@pytest.fixture
def stack(
    airflow_db: Path, volcano_conn: Any, tmp_path: Path, collected: tuple[Collected, dict[str, str]]
) -> Iterator[Stack]:
    with running_stack(airflow_db, tmp_path, extra_env=collected[1]) as s:
        yield s


def test_two_runs_contend_one_defers_both_succeed_nothing_secret_stored(
    stack: Stack, collected: tuple[Collected, dict[str, str]], volcano_conn: Any, unique_key: str
) -> None:
    resource = f"schema-{unique_key}"
    stack.unpause_when_parsed(DAG_ID, timeout=300)  # a hang catcher: parsing waits for a busy machine
    # Each run holds the lock ~24 s: the second run's start (two CLI triggers, a worker start) takes
    # well over ten seconds on a busy machine, and it must defer long before the first releases. A
    # shorter hold lets the trigger fire before the scheduler has
    # processed the executor's event for the deferring exit; Airflow 3.3.2's LocalExecutor then
    # forgets the resumed workload and the scheduler fails the running task (an Airflow race).
    conf = json.dumps({"lock_key": unique_key, "steps": STEPS, "step_seconds": 2.0, "resource": resource})
    for run_id in ("contend_a", "contend_b"):
        stack.cli("dags", "trigger", DAG_ID, "--run-id", run_id, "--conf", conf)

    trigger_rows: list[str] = []
    seen_deferred: set[str] = set()
    deadline = time.monotonic() + 240
    while True:
        stack.alive()
        for (run_id,) in stack.query(
            "SELECT run_id FROM task_instance WHERE dag_id = ? AND state = 'deferred'", DAG_ID
        ):
            seen_deferred.add(run_id)
        trigger_rows += [json.dumps(row, default=str) for row in stack.query("SELECT * FROM trigger")]
        states = dict(stack.query("SELECT run_id, state FROM dag_run WHERE dag_id = ?", DAG_ID))
        if len(states) == 2 and all(s in ("success", "failed") for s in states.values()):
            break
        assert time.monotonic() < deadline, f"runs did not finish: {states}"
        time.sleep(0.3)

    assert states == {"contend_a": "success", "contend_b": "success"}, stack.report("contend_a", "contend_b")
    assert len(seen_deferred) == 1, seen_deferred  # one waited in the triggerer while the other ran
    assert trigger_rows, "the waiting run's trigger row was never seen"

    # The fenced table: the runs' steps did not interleave, and no stale write landed.
    history = FencedTable(stack.env["VOLCANO_EXAMPLES_DB"]).history(resource)
    writes = [(w.fencing_token, w.value, w.accepted) for w in history]
    assert len(writes) == 2 * STEPS and all(accepted for _, _, accepted in writes)
    tokens = [t for t, _, _ in writes]
    assert tokens == sorted(tokens) and len(set(tokens)) == 2
    runs = [v.split(" step ")[0] for _, v, _ in writes]
    first, second = runs[:STEPS], runs[STEPS:]
    assert first == [first[0]] * STEPS and second == [second[0]] * STEPS and first[0] != second[0]
    assert second[0] in seen_deferred  # the deferred run went second, with the higher fencing token

    # Nothing secret in the metadata database or the task logs. The tokens are derived from the
    # owner nonces the runs logged (public), exactly as the operator and trigger derive them.
    rows = stack.query(
        "SELECT dag_id, task_id, run_id, map_index, try_number FROM task_instance WHERE dag_id = ?", DAG_ID
    )
    tokens = owner_tokens(volcano_conn.service_key, unique_key, rows, stack.logs())
    digests = {hashlib.sha256(t.encode()).hexdigest()[:12] for t in tokens}
    seen = {r["token_sha256"] for r in volcano_conn.requests() if unique_key in r.get("path", "")}
    assert len(seen - {None}) == 2 and seen - {None} <= digests  # two owners, both found
    secrets = {volcano_conn.service_key, volcano_conn.anon_key, *tokens}
    stored = {
        "trigger rows": "\n".join(
            trigger_rows + [json.dumps(r, default=str) for r in stack.query("SELECT * FROM trigger")]
        ),
        "xcom rows": json.dumps(stack.query("SELECT * FROM xcom"), default=str),
        "next_kwargs": json.dumps(
            stack.query("SELECT next_method, next_kwargs FROM task_instance")
            + stack.query("SELECT next_method, next_kwargs FROM task_instance_history"),
            default=str,
        ),
        "rendered fields": json.dumps(
            stack.query("SELECT * FROM rendered_task_instance_fields"), default=str
        ),
        "task logs": stack.logs(),
    }
    assert "volcano_lease" in stored["xcom rows"] and "fencing_token" in stored["xcom rows"]
    assert "deferring until it is free" in stored["task logs"]
    assert "Holding lock" in stored["task logs"]
    for where, text in stored.items():
        for secret in secrets:
            assert secret not in text, f"a secret leaked into {where}"

    (waited,) = seen_deferred
    _metrics_and_spans(collected[0], stack, volcano_conn, unique_key, waited)


def _metrics_and_spans(
    into: Collected, stack: Stack, volcano_conn: Any, unique_key: str, waited: str
) -> None:
    """The deferred wait's and both holds' StatsD metrics and spans, under their task instances' spans."""
    tokens = {
        run_id: json.loads(value)["fencing_token"]
        for run_id, value in stack.query(
            "SELECT run_id, value FROM xcom WHERE dag_id = ? AND key = 'volcano_lease'", DAG_ID
        )
    }
    assert len(tokens) == 2, tokens

    # The spans: both holds' worker spans and the waiter's trigger span have been exported.
    holds = until("both hold spans exported", lambda: len(into.named("volcano.lock.hold")) == 2 or None, 60)
    assert holds
    waits = until("the wait span exported", lambda: into.named("volcano.lock.wait") or None, 60)
    workers = {s["attributes"]["airflow.dag_run.run_id"]: s for s in into.named(f"worker.{TASK_ID}")}
    triggers = {s["attributes"]["airflow.dag_run.run_id"]: s for s in into.named(f"trigger.{TASK_ID}")}
    assert set(workers) >= {"contend_a", "contend_b"} and waited in triggers, (set(workers), set(triggers))
    (wait,) = waits
    assert wait["parent"] == triggers[waited]["span_id"], "the wait span is not under the trigger's span"
    assert wait["trace_id"] == triggers[waited]["trace_id"]
    assert wait["attributes"]["volcano.lock.outcome"] == "acquired"
    assert wait["attributes"]["volcano.lock.wait.mode"] == "deferred"
    by_token = {s["attributes"]["volcano.lock.fencing_token"]: s for s in into.named("volcano.lock.hold")}
    for run_id, token in tokens.items():
        hold = by_token[token]
        worker = max(
            (
                s
                for s in into.named(f"worker.{TASK_ID}")
                if s["attributes"]["airflow.dag_run.run_id"] == run_id
            ),
            key=lambda s: s["start"],
        )  # the resumed execution, for the run that deferred (its first execution ended deferring)
        assert hold["parent"] == worker["span_id"], f"{run_id}'s hold span is not under its worker span"
        assert hold["trace_id"] == worker["trace_id"]
        names = [name for name, _ in hold["events"]]
        assert "renewed" in names and names[-1] == "released", names
        assert all(attrs["volcano.lock.fencing_token"] == token for _, attrs in hold["events"])

    # The metrics: the deferred wait (in the triggerer) and the holds (in the workers), Airflow's way.
    with into.lock:
        lines = list(into.lines)
    kinds = {line.split(":")[0]: line.split("|")[1] for line in lines}
    assert kinds.get("airflow.volcano.lock.wait.duration.acquired") == "ms", sorted(kinds)
    assert kinds.get("airflow.volcano.lock.waiters.deferred") == "g", sorted(kinds)
    assert kinds.get("airflow.volcano.lock.hold.duration.released") == "ms", sorted(kinds)
    assert kinds.get("airflow.volcano.lock.requests.acquire.201") == "c", sorted(kinds)
    assert kinds.get("airflow.volcano.lock.renewal.margin") == "ms", sorted(kinds)
    holds_timed = [line for line in lines if line.startswith("airflow.volcano.lock.hold.duration.released:")]
    assert len(holds_timed) == 2, holds_timed

    # Nothing secret in what left the processes; no lock key either (keys are off by default).
    with into.otlp.lock:
        shipped = "\n".join(lines) + json.dumps(into.otlp.spans, default=str)
    for secret in (volcano_conn.service_key, volcano_conn.anon_key):
        assert secret not in shipped
    assert unique_key not in shipped
