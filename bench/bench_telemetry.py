"""What the lock metrics cost: a hold with metrics on (an OpenTelemetry SDK pipeline) against off, in one run.

Off is what a process without a ``MeterProvider`` runs: the core records through the OpenTelemetry API's
no-op instruments. On adds a real SDK pipeline as a second sink: a ``MeterProvider`` with a periodic reader
(what every exporter sits behind) that collects every 2 s, so its collections, and the histogram values
the sink records then, happen during the timed calls and their cost falls on them (the reader's thread
shares the GIL and the two cores). Both are timed in the same run, interleaved (off, on, on, off,
...) so the machine's load falls on both alike:

* core ``with_lock`` enter+exit around an empty body, sync and async clients (acquire, keeper start and
  stop, release: two requests to a local server over loopback);
* Prefect ``locked_task`` enter+exit around an empty body, called outside a task run (credentials
  from the environment);
* the recording alone: the records one such hold makes (two requests, a tenure begun and ended), timed
  without any I/O, so the overhead can be read without the server's noise.

    .venv-prefect/bin/python bench/bench_telemetry.py [--n 400] [--prefect-n 100] [--warmup 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)

from volcano_locks import AsyncVolcanoLocks, VolcanoLocks
from volcano_locks.server.harness import LocalServer
from volcano_locks.telemetry import add_sink, record, remove_sink
from volcano_locks.telemetry.sinks import OpenTelemetrySink

os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="bench-telemetry-prefect-"))
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


class _LastExport(MetricExporter):
    """An exporter that keeps the last batch (an exporter's own I/O is not what is measured)."""

    def __init__(self) -> None:
        super().__init__()
        self.last: MetricsData | None = None

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object
    ) -> MetricExportResult:
        self.last = metrics_data
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        return None


EXPORTED = _LastExport()
PROVIDER = MeterProvider(
    metric_readers=[PeriodicExportingMetricReader(EXPORTED, export_interval_millis=2000)]
)
ON = OpenTelemetrySink(PROVIDER)


def _metrics(on: bool) -> None:
    (add_sink if on else remove_sink)(ON)


def _interleaved(n: int, warmup: int, one: Callable[[], None]) -> tuple[list[float], list[float]]:
    """``one`` timed ``n`` times with metrics off and ``n`` with them on, in ABBA order."""
    for i in range(warmup):
        _metrics(i % 2 == 1)
        one()
    off: list[float] = []
    on: list[float] = []
    for i in range(n):
        for state in (False, True) if i % 2 == 0 else (True, False):
            _metrics(state)
            start = time.perf_counter()
            one()
            (on if state else off).append(time.perf_counter() - start)
    _metrics(False)
    return off, on


def _sync_loop(run: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    loop = asyncio.new_event_loop()
    return lambda: loop.run_until_complete(run())


def _records_of_one_hold() -> Callable[[], None]:
    """The records a with_lock enter+exit makes, without the I/O around them."""
    from datetime import UTC, datetime, timedelta

    from volcano_locks.clock import lease_clock
    from volcano_locks.models import LockLease

    counter = iter(range(1, 10**9))

    def one() -> None:
        now = lease_clock()
        lease = LockLease(
            "bench-records",
            "t",
            datetime.now(UTC) + timedelta(seconds=30),
            next(counter),
            30,
            datetime.now(UTC),
            now + 30,
            now + 90 * 86400,
        )
        record.budget_used(0.01)
        record.request(lease.key, "acquire", 201)
        record.acquired(lease, now)
        record.budget_used(0.01)
        record.request(lease.key, "release", 204)
        record.ended(lease, "released", now=now)

    return one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400, help="timed pairs per row, each way")
    parser.add_argument("--prefect-n", type=int, default=100, help="timed pairs of the locked_task row")
    parser.add_argument("--warmup", type=int, default=30, help="untimed pairs before each row")
    args = parser.parse_args()
    rows: list[tuple[str, list[float], list[float]]] = []
    with LocalServer(quota=10**9) as server:
        os.environ.update(VOLCANO_API_URL=server.url, VOLCANO_SERVICE_KEY=server.service_key)
        key = f"bench-telemetry-{uuid.uuid4().hex[:8]}"
        with VolcanoLocks() as sync_client:

            def sync_hold() -> None:
                with sync_client.with_lock(key + "-sync", 30):
                    pass

            rows.append(("core `with_lock` enter+exit, sync", *_interleaved(args.n, args.warmup, sync_hold)))
        aclient = AsyncVolcanoLocks()

        async def async_hold() -> None:
            async with aclient.with_lock(key + "-async", 30):
                pass

        rows.append(
            ("core `with_lock` enter+exit, async", *_interleaved(args.n, args.warmup, _sync_loop(async_hold)))
        )
        from prefect.testing.utilities import prefect_test_harness

        from prefect_volcano import locked_task

        @locked_task(key + "-prefect", ttl=30, on_contention="fail")
        def body() -> None:
            return None

        with prefect_test_harness(server_startup_timeout=120):
            rows.append(
                ("Prefect `locked_task` enter+exit", *_interleaved(args.prefect_n, args.warmup, body))
            )
        rows.append(
            (
                "the records of one hold alone (no I/O)",
                *_interleaved(args.n * 10, 100, _records_of_one_hold()),
            )
        )
    print(
        f"\nLock metrics on (OpenTelemetry SDK, a reader collecting every 2 s) against off (no provider), "
        f"{args.n} each"
    )
    print(
        f"(interleaved in one run; Python {sys.version.split()[0]}; load average {os.getloadavg()[0]:.1f})\n"
    )
    print(
        "| operation | off: median | on: median | on - off (median) "
        "| off: mean | on: mean | on - off (mean) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, off, on in rows:
        mo, mn = statistics.median(off), statistics.median(on)
        ao, an = statistics.fmean(off), statistics.fmean(on)
        unit, scale = ("µs", 1e6) if mo < 1e-3 else ("ms", 1e3)
        print(
            f"| {name} | {mo * scale:.3f} {unit} | {mn * scale:.3f} {unit} | {(mn - mo) / mo:+.2%} "
            f"| {ao * scale:.3f} {unit} | {an * scale:.3f} {unit} | {(an - ao) / ao:+.2%} |"
        )
    records_on = statistics.median(rows[-1][2]) - statistics.median(rows[-1][1])
    hold = statistics.median(rows[0][1])
    print(
        f"\nThe records of one hold cost {records_on * 1e6:.1f} µs more with the SDK on: "
        f"{records_on / hold:.2%} of a sync `with_lock` enter+exit ({hold * 1e3:.2f} ms)."
    )
    print(f"The reader's exports held {_holds_exported()} hold durations (every hold timed with metrics on).")


def _holds_exported() -> int:
    """How many hold durations the pipeline's last export counted (proof the records got through)."""
    PROVIDER.force_flush()
    data = EXPORTED.last
    return sum(
        point.count
        for rm in (data.resource_metrics if data else ())
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == "volcano.lock.hold.duration"
        for point in metric.data.data_points
    )


if __name__ == "__main__":
    main()
