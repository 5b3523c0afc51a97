"""A locked flow run's metrics and spans leave a real Prefect worker the standard OpenTelemetry way.

A real ``prefect server start``, a ``process`` work pool and a real ``prefect worker start`` run under
``opentelemetry-instrument`` (its environment says: OTLP/HTTP to a collector this test runs), so every
flow run, a process of its own, has a global ``MeterProvider`` and ``TracerProvider``. One deployment's
run waits for a lock the test holds, then holds it: what the flow-run process exported must carry every
lock instrument the run touched, with Prefect as the orchestrator, and the lock's spans must be children
of the task run's span. No request body the collector got holds the service key or an ownership token.
"""

from __future__ import annotations

import hashlib
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.helpers import until
from tests.support.otlp import Received, otlp_collector
from tests.support.prefect_pool import process_pool
from volcano_locks import VolcanoLocks
from volcano_locks.server.harness import LocalServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

FLOW = """
from prefect import flow, task
from prefect_volcano import current_lease, locked_task


@task
@locked_task("{key}", ttl=15, on_contention="wait")
def hold() -> int:
    return current_lease().fencing_token


@flow
def locked_metrics() -> int:
    return hold()
"""


def test_a_locked_flow_run_on_a_worker_exports_the_lock_metrics_and_spans(
    quota_server: LocalServer, tmp_path: Path, unique_key: str
) -> None:
    server = quota_server
    (tmp_path / "flows.py").write_text(textwrap.dedent(FLOW.format(key=unique_key)))
    with otlp_collector() as otlp:

        def ours(name: str) -> list[dict[str, Any]]:
            return _last(otlp.metric(name, **{"volcano.lock.key": unique_key}))

        env = dict(
            server.env(),
            OTEL_SERVICE_NAME="prefect-worker",
            OTEL_METRICS_EXPORTER="otlp_proto_http",
            OTEL_TRACES_EXPORTER="otlp_proto_http",
            OTEL_LOGS_EXPORTER="none",
            OTEL_EXPORTER_OTLP_ENDPOINT=otlp.url,
            OTEL_METRIC_EXPORT_INTERVAL="1000",
            OTEL_BSP_SCHEDULE_DELAY="500",
            VOLCANO_METRICS_LOCK_KEY="1",  # this run's points told apart by their key
        )
        instrument = [str(Path(sys.executable).with_name("opentelemetry-instrument"))]
        with process_pool(tmp_path, env, wrap=instrument) as pool:
            deployment = pool.deploy("locked-metrics", "flows.py:locked_metrics", tmp_path)
            with VolcanoLocks(server.url, service_key=server.service_key) as holder:
                lease = holder.acquire(unique_key, 600)
                run = pool.run(deployment)
                until(
                    "the run to be refused the held lock",
                    lambda: any(
                        r.get("op") == "acquire" and r.get("served") == 409
                        for r in _requests(server, unique_key)
                    ),
                    600,
                )
                holder.release(unique_key, lease)
            final = pool.final(run.id)
            assert final.is_completed(), final
            until("the run's hold exported", lambda: ours("volcano.lock.hold.duration"), 120)
            hold_span = until(
                "the hold's span exported", lambda: _span(otlp, "volcano.lock.hold", unique_key), 120
            )
            until(
                "the span the hold's is a child of exported",
                lambda: [s for s in otlp.spans if s["span_id"] == hold_span["parent"]],
                120,
            )

    (wait,) = ours("volcano.lock.wait.duration")
    assert wait["attributes"]["volcano.lock.outcome"] == "acquired" and wait["count"] == 1, wait
    holds = ours("volcano.lock.hold.duration")
    assert {h["attributes"]["volcano.lock.ending"] for h in holds} == {"released"}, holds
    requests = {
        (p["attributes"]["volcano.request.operation"], p["attributes"]["volcano.request.status"]): p["value"]
        for p in ours("volcano.lock.requests")
    }
    assert requests[("acquire", "409")] >= 1 and requests[("acquire", "201")] == 1, requests
    assert requests[("release", "204")] == 1, requests
    assert sum(p["value"] for p in ours("volcano.lock.contentions")) >= 1
    assert sum(p["value"] for p in ours("volcano.lock.leases")) == 0
    assert ours("volcano.lock.waiters")
    with otlp.lock:
        orchestrators = {
            p["attributes"].get("volcano.orchestrator") for p in otlp.points if "volcano" in p["name"]
        }
    assert orchestrators == {"prefect"}, orchestrators

    # The spans: the lock's under the task run's span (Prefect makes it current around the task body).
    task_runs = {s["span_id"]: s for s in otlp.spans if s["attributes"].get("prefect.run.type") == "task"}
    wait_span = _span(otlp, "volcano.lock.wait", unique_key)
    assert wait_span is not None, "the wait's span was not exported"
    assert hold_span["parent"] in task_runs and wait_span["parent"] == hold_span["parent"], (
        hold_span,
        wait_span,
        list(task_runs.values()),
    )
    assert [name for name, _ in hold_span["events"]][-1] == "released"

    # Nothing secret in what the flow run exported.
    owners = {r.get("token_sha256") for r in _requests(server, unique_key)} - {None}
    with otlp.lock:
        shipped = b"".join(otlp.bodies)
    assert server.service_key.encode() not in shipped and server.anon_key.encode() not in shipped
    values = [
        v
        for item in [*otlp.spans, *otlp.points]
        for attributes in [item["attributes"], *(a for _, a in item.get("events", []))]
        for v in attributes.values()
        if isinstance(v, str)
    ]
    assert owners and not any(hashlib.sha256(v.encode()).hexdigest()[:12] in owners for v in values)


def _requests(server: LocalServer, key: str) -> list[dict[str, Any]]:
    return [r for r in server.requests() if key in r.get("path", "")]


def _span(otlp: Received, name: str, key: str) -> dict[str, Any] | None:
    """The one span ``name`` of lock ``key`` (``None``: not exported yet)."""
    found = [s for s in otlp.named(name) if s["attributes"].get("volcano.lock.key") == key]
    assert len(found) <= 1, found
    return found[0] if found else None


def _last(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last export's point for each attribute set (sums are cumulative: later exports repeat them)."""
    found: dict[tuple[tuple[str, Any], ...], dict[str, Any]] = {}
    for point in points:
        found[tuple(sorted(point["attributes"].items()))] = point
    return list(found.values())
