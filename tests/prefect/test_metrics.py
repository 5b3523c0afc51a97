"""A locked flow run records the core's lock metrics through OpenTelemetry, as a Prefect run."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.prefect.helpers import collecting_flow, token_task
from tests.support.metrics import by, points, value
from volcano_locks import VolcanoLocks
from volcano_locks.telemetry import ENV_LOCK_KEY

# In the whole suite's process the docs and packaging tests import the Airflow provider's package before
# this test: that used to route every lock metric to Airflow's Stats (absent here) and name the orchestrator
# "airflow", so this run's metrics never reached the reader (tests/core/test_telemetry.py covers the fix).
pytestmark = [pytest.mark.usefixtures("volcano_env"), pytest.mark.timeout(600)]


def test_a_locked_flow_run_that_waits_records_the_lock_metrics(
    metric_reader: Any, unique_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_LOCK_KEY, "1")
    f, states = collecting_flow(token_task(unique_key, on_contention="wait"))

    seen_waiting = threading.Event()

    def release_once_the_run_waits() -> None:
        # The run starts its harness and flow first (over a minute on a busy machine): only a hang
        # reaches the bound, and then the test says so instead of measuring a run that never waited.
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if sum(p.value for p in points(metric_reader, "volcano.lock.waiters", unique_key)) == 1:
                seen_waiting.set()
                break
            time.sleep(0.05)
        holder.release(unique_key, lease)

    with VolcanoLocks() as holder:
        lease = holder.acquire(unique_key, 600)  # never lapses before the run waits, however slow its start
        releaser = threading.Thread(target=release_once_the_run_waits, name="metrics-releaser")
        releaser.start()
        f()
        releaser.join(60)
    assert seen_waiting.is_set(), "the run never waited for the lock within 240 s"
    token = states[0].result()
    assert token == lease.fencing_token + 1
    for name in ("volcano.lock.wait.duration", "volcano.lock.hold.duration", "volcano.lock.requests"):
        assert {p.attributes["volcano.orchestrator"] for p in points(metric_reader, name, unique_key)} == {
            "prefect"
        }
    waits = by(points(metric_reader, "volcano.lock.wait.duration", unique_key), "volcano.lock.outcome")
    assert set(waits) == {"acquired"} and waits["acquired"].count == 1 and waits["acquired"].sum > 0
    waiters = by(points(metric_reader, "volcano.lock.waiters", unique_key), "volcano.lock.wait.mode")
    assert set(waiters) <= {"event_woken", "in_slot"} and sum(p.value for p in waiters.values()) == 0
    holds = by(points(metric_reader, "volcano.lock.hold.duration", unique_key), "volcano.lock.ending")
    assert set(holds) == {"released"} and holds["released"].count == 2  # the outside holder's and the run's
    assert value(metric_reader, "volcano.lock.leases", unique_key) == 0
    requests = {
        (p.attributes["volcano.request.operation"], p.attributes["volcano.request.status"]): p.value
        for p in points(metric_reader, "volcano.lock.requests", unique_key)
    }
    assert requests[("acquire", "201")] == 2 and requests[("acquire", "409")] == 1  # the run waited once
    assert requests[("release", "204")] == 2
    assert value(metric_reader, "volcano.lock.contentions", unique_key) == 1
    handoffs = points(metric_reader, "volcano.lock.handoff.duration", unique_key)
    assert len(handoffs) == 1 and handoffs[0].count == 1  # released here, taken here by the run
