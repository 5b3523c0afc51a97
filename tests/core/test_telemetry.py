"""The lock metrics through OpenTelemetry's in-memory reader: a contended lock taken, held, renewed, lost
and released through the core clients (sync and async) against the real local server."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.metrics import by, points, value
from volcano_locks import AsyncVolcanoLocks, LockContention, OwnershipLost, VolcanoLocks
from volcano_locks.fencing import FencedTable, StaleFencingToken
from volcano_locks.server.harness import LocalServer
from volcano_locks.telemetry import ENV_LOCK_KEY, INSTRUMENTS, add_sink, orchestrator, remove_sink
from volcano_locks.telemetry.instruments import Instrument

TTL = 5  # the shortest TTL: renewed about every 1.7 s, so one hold sees a renewal soon
WAIT = 30.0  # a bound that only catches hangs


def _until(check: Any, what: str) -> None:
    done = threading.Event()
    for _ in range(int(WAIT / 0.05)):
        if check():
            return
        done.wait(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def keyed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Lock keys on the metrics, so this test's points can be told from the session's others."""
    monkeypatch.setenv(ENV_LOCK_KEY, "1")
    yield


def _check_the_story(reader: Any, key: str, held_a: float) -> None:
    """What a contended lock taken, held, renewed, handed over, lost and released must have recorded."""
    for name in INSTRUMENTS:
        for point in points(reader, name, key):
            # core alone; prefect when the Prefect tests run in the same process
            assert (
                point.attributes["volcano.orchestrator"] == orchestrator()
            )  # core, or prefect beside its tests
    waits = by(points(reader, "volcano.lock.wait.duration", key), "volcano.lock.outcome")
    assert set(waits) == {"acquired"} and waits["acquired"].count == 1
    assert 0 < waits["acquired"].sum < WAIT
    holds = by(points(reader, "volcano.lock.hold.duration", key), "volcano.lock.ending")
    assert set(holds) == {"released", "lost"}
    assert holds["released"].count == 1 and holds["lost"].count == 1
    assert held_a * 0.5 <= holds["released"].sum <= held_a + 5  # A's tenure, timed on the lease clock
    assert value(reader, "volcano.lock.leases", key) == 0  # both tenures ended
    assert value(reader, "volcano.lock.waiters", key) == 0
    assert value(reader, "volcano.lock.contentions", key) == 1  # B's first attempt; then it looked
    losses = by(points(reader, "volcano.lock.losses", key), "volcano.lock.loss.reason")
    assert set(losses) == {"lock_ownership_lost"} and losses["lock_ownership_lost"].value == 1
    margins = points(reader, "volcano.lock.renewal.margin", key)
    assert margins and margins[0].count >= 1
    assert margins[0].min > 0 and margins[0].max <= TTL  # the lease left at each renewal
    handoffs = points(reader, "volcano.lock.handoff.duration", key)
    assert len(handoffs) == 1 and handoffs[0].count == 1 and 0 <= handoffs[0].sum < WAIT
    requests = {
        (p.attributes["volcano.request.operation"], p.attributes["volcano.request.status"]): p.value
        for p in points(reader, "volcano.lock.requests", key)
    }
    assert requests[("acquire", "201")] == 2 and requests[("acquire", "409")] == 1
    assert requests[("renew", "200")] >= 1 and requests[("renew", "409")] == 1  # B's renewal found it gone
    assert requests[("force_release", "204")] == 1 or requests.get(("force_release", "200")) == 1
    assert max(p.value for p in points(reader, "volcano.lock.budget.used")) > 0


def _check_the_spans(exporter: Any, key: str) -> None:
    """A's hold: renewed, released; B's wait: acquired; B's hold: lost; every event has the fencing token."""
    spans = [s for s in exporter.get_finished_spans() if s.attributes.get("volcano.lock.key") == key]
    holds = sorted((s for s in spans if s.name == "volcano.lock.hold"), key=lambda s: s.start_time)
    waits = [s for s in spans if s.name == "volcano.lock.wait"]
    assert len(holds) == 2 and len(waits) == 1
    assert waits[0].attributes["volcano.lock.outcome"] == "acquired"
    a, b = holds
    names_a = [e.name for e in a.events]
    assert names_a[-1] == "released" and "renewed" in names_a
    assert [e.name for e in b.events][-1] == "lost"
    assert b.events[-1].attributes["volcano.lock.loss.reason"] == "lock_ownership_lost"
    for span, token in (
        (a, a.attributes["volcano.lock.fencing_token"]),
        (b, b.attributes["volcano.lock.fencing_token"]),
    ):
        assert all(e.attributes["volcano.lock.fencing_token"] == token for e in span.events)
    assert b.attributes["volcano.lock.fencing_token"] == a.attributes["volcano.lock.fencing_token"] + 1


def test_a_contended_lock_records_every_instrument_sync(
    metric_reader: Any, span_exporter: Any, keyed: None, volcano_server: LocalServer, unique_key: str
) -> None:
    url, service_key = volcano_server.url, volcano_server.service_key
    acquired_b, lost_b = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def waiter(client: VolcanoLocks) -> None:
        try:
            with (
                pytest.raises(OwnershipLost),
                client.with_lock(unique_key, TTL, on_contention="wait", wait_timeout=WAIT) as guard,
            ):
                acquired_b.set()
                assert guard.wait_lost(WAIT)
                lost_b.set()
        except BaseException as exc:
            failures.append(exc)

    with (
        VolcanoLocks(url, service_key=service_key) as a,
        VolcanoLocks(url, service_key=service_key) as b,
    ):
        with a.with_lock(unique_key, TTL) as guard:
            first = guard.lease
            thread = threading.Thread(target=waiter, args=(b,), name="metrics-waiter")
            thread.start()
            _until(lambda: value(metric_reader, "volcano.lock.waiters", unique_key) == 1, "B waiting")
            assert (
                by(points(metric_reader, "volcano.lock.waiters", unique_key), "volcano.lock.wait.mode")[
                    "in_slot"
                ].value
                == 1
            )
            assert value(metric_reader, "volcano.lock.leases", unique_key) == 1
            _until(lambda: guard.lease != first, "A's renewal")
            held_a = guard.lease.local_deadline - first.local_deadline
        assert acquired_b.wait(WAIT)
        a.force_release(unique_key)
        assert lost_b.wait(WAIT)
        thread.join(WAIT)
    assert not failures
    _check_the_story(metric_reader, unique_key, held_a)
    _check_the_spans(span_exporter, unique_key)


async def test_a_contended_lock_records_every_instrument_async(
    metric_reader: Any, span_exporter: Any, keyed: None, volcano_server: LocalServer, unique_key: str
) -> None:
    url, service_key = volcano_server.url, volcano_server.service_key
    acquired_b = asyncio.Event()

    async def waiter(client: AsyncVolcanoLocks) -> None:
        with pytest.raises(OwnershipLost):
            async with client.with_lock(unique_key, TTL, on_contention="wait", wait_timeout=WAIT) as guard:
                acquired_b.set()
                await asyncio.sleep(WAIT)  # cancelled by the loss
        del guard

    async def until(check: Any) -> None:
        async with asyncio.timeout(WAIT):
            while not check():
                await asyncio.sleep(0.05)

    async with (
        AsyncVolcanoLocks(url, service_key=service_key) as a,
        AsyncVolcanoLocks(url, service_key=service_key) as b,
    ):
        async with a.with_lock(unique_key, TTL) as guard:
            first = guard.lease
            task = asyncio.create_task(waiter(b))
            await until(lambda: value(metric_reader, "volcano.lock.waiters", unique_key) == 1)
            await until(lambda: guard.lease != first)
            held_a = guard.lease.local_deadline - first.local_deadline
        async with asyncio.timeout(WAIT):
            await acquired_b.wait()
        await a.force_release(unique_key)
        async with asyncio.timeout(WAIT):
            await task
    _check_the_story(metric_reader, unique_key, held_a)
    _check_the_spans(span_exporter, unique_key)


def test_no_attribute_carries_a_key_or_a_token_unless_keys_are_allowed(
    metric_reader: Any, volcano_server: LocalServer, unique_key: str, tmp_path: Any
) -> None:
    with VolcanoLocks(volcano_server.url, service_key=volcano_server.service_key) as locks:
        lease = locks.acquire(unique_key, 30)
        with pytest.raises(LockContention):
            locks.acquire(unique_key, 30)
        locks.release(unique_key, lease)
    secrets = {unique_key, lease.token, volcano_server.service_key}
    data = metric_reader.get_metrics_data()
    seen = 0
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    seen += 1
                    for shown in point.attributes.values():
                        assert not any(secret in str(shown) for secret in secrets), metric.name
    assert seen


def test_a_refused_stale_write_is_counted_by_store(
    metric_reader: Any, keyed: None, unique_key: str, tmp_path: Any
) -> None:
    table = FencedTable(str(tmp_path / "fenced.sqlite"))
    table.write_or_raise("report", unique_key, 5, "new")
    with pytest.raises(StaleFencingToken):
        table.write_or_raise("report", unique_key, 4, "old")
    refused = by(points(metric_reader, "volcano.fence.refused", unique_key), "volcano.fence.store")
    assert set(refused) == {"table"} and refused["table"].value == 1


class _Broken:
    def record(self, instrument: Instrument, value: float, attributes: Any) -> None:
        raise RuntimeError("the metrics backend is down")


def test_a_failing_sink_never_fails_the_lock_call(
    metric_reader: Any, keyed: None, volcano_client: VolcanoLocks, unique_key: str
) -> None:
    broken = _Broken()
    add_sink(broken)
    try:
        with volcano_client.with_lock(unique_key, 30) as guard:
            assert guard.fencing_token is not None
    finally:
        remove_sink(broken)
    holds = by(points(metric_reader, "volcano.lock.hold.duration", unique_key), "volcano.lock.ending")
    assert holds["released"].count == 1  # the OpenTelemetry sink still recorded


def test_the_docs_and_the_dashboard_name_every_instrument_and_no_other() -> None:
    """docs/metrics.md lists each instrument; the Grafana dashboard's queries use each one, and no other."""
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "metrics.md").read_text()
    assert all(f"| `{name}` |" in page for name in INSTRUMENTS)
    dashboard = json.loads((root / "docs" / "grafana" / "volcano-locks.json").read_text())
    queried = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for series in re.findall(r"\b(volcano_[a-z_]+)\{", target["expr"]):
                # Prometheus names of OpenTelemetry metrics: dots as underscores, the unit and kind suffixed.
                base = re.sub(r"(_seconds)?(_bucket|_total|_ratio)?$", "", series)
                queried.add(base)
    assert queried == {name.replace(".", "_") for name in INSTRUMENTS}


def test_the_spans_nest_under_the_current_span(
    span_exporter: Any, keyed: None, volcano_client: VolcanoLocks, unique_key: str
) -> None:
    from opentelemetry import trace

    with trace.get_tracer("a test").start_as_current_span("task instance") as parent:
        lease = volcano_client.wait_acquire(unique_key, 30, timeout=10)
        volcano_client.release(unique_key, lease)
    spans = {
        s.name: s
        for s in span_exporter.get_finished_spans()
        if s.attributes.get("volcano.lock.key") == unique_key
    }
    assert set(spans) == {"volcano.lock.wait", "volcano.lock.hold"}
    for span in spans.values():
        assert span.parent is not None and span.parent.span_id == parent.get_span_context().span_id
    released = spans["volcano.lock.hold"].events[-1]
    assert (
        released.name == "released"
        and released.attributes["volcano.lock.fencing_token"] == lease.fencing_token
    )
    assert lease.token not in str([dict(s.attributes) for s in spans.values()])


def test_the_airflow_package_read_without_airflow_leaves_the_metrics_on_opentelemetry() -> None:
    # A process without Airflow that imports the provider's package (for its metadata, its docs, or a
    # Prefect process that has both installed) keeps its metrics on OpenTelemetry and its orchestrator.
    # A fresh interpreter, as a user's process is; it is skipped where Airflow is installed.
    if importlib.util.find_spec("airflow") is not None:
        pytest.skip("Airflow is installed here: the provider routes the metrics through its Stats")
    script = (
        "import sys, airflow_provider_volcano, prefect_volcano\n"
        "from volcano_locks.telemetry import orchestrator, sinks\n"
        "print([type(s).__name__ for s in sinks._SINKS.all], orchestrator())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["['OpenTelemetrySink']", "prefect"], done.stdout


def test_a_sink_reports_what_it_kept_at_each_collection_and_bounds_what_waits() -> None:
    """Counters sum, gauges keep the last value, histogram values wait for the reader's collection (cumulative
    across collections), and values nobody collects are recorded on the spot past the bound."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from volcano_locks.telemetry import sinks

    reader = InMemoryMetricReader()
    sink = sinks.OpenTelemetrySink(MeterProvider(metric_readers=[reader]))
    hold, requests = INSTRUMENTS["volcano.lock.hold.duration"], INSTRUMENTS["volcano.lock.requests"]
    budget = INSTRUMENTS["volcano.lock.budget.used"]
    released = {"volcano.orchestrator": "core", "volcano.lock.ending": "released"}
    acquired = {"volcano.orchestrator": "core", "volcano.request.operation": "acquire"}
    for held in (1.0, 2.0, 3.0):
        sink.record(hold, held, released)
        sink.record(requests, 1, acquired)
    sink.record(budget, 0.25, {"volcano.orchestrator": "core"})
    sink.record(budget, 0.5, {"volcano.orchestrator": "core"})
    first = points(reader, "volcano.lock.hold.duration")
    assert [(p.count, p.sum) for p in first] == [(3, 6.0)]
    assert [p.value for p in points(reader, "volcano.lock.requests")] == [3]
    assert [p.value for p in points(reader, "volcano.lock.budget.used")] == [0.5]
    sink.record(hold, 4.0, released)
    assert [(p.count, p.sum) for p in points(reader, "volcano.lock.hold.duration")] == [(4, 10.0)]

    unread = sinks.OpenTelemetrySink(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    for _ in range(sinks._PENDING_AT_MOST * 2 + 5):
        unread.record(hold, 1.0, released)
    assert len(unread._pending) <= sinks._PENDING_AT_MOST  # memory stays bounded without a collection
