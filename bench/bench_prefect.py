"""What entering and leaving a locked_task's lock costs, next to Prefect's own global concurrency limit.

One process, one run: a local Volcano-compatible server and a Prefect test server (harness) are
started side by side, then each row times N enter+exit pairs around an empty body:

- `locked_task` lock: one call of a `locked_task`-wrapped no-op, outside a task run: render the key,
  build the client from the environment, acquire (POST), start the keeper, run nothing, stop the
  keeper, release (DELETE). This is everything the decorator adds to a task run.
- core `with_lock`, reused client: the same lease cycle on one long-lived client (what the
  decorator's per-run client costs on top shows as the difference).
- Prefect `concurrency(name, occupy=1)`: the sync global-concurrency-limit context manager against
  the harness server (limit 1, so it is a lock too): increment-with-lease, lease renewal, decrement.

Run:  .venv-prefect/bin/python bench/bench_prefect.py [--n 300] [--warmup 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable

# Prefect reads its settings at import: keep the benchmark's home, results and telemetry private.
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="bench-prefect-home-")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.testing.utilities import prefect_test_harness

from prefect_volcano import locked_task
from volcano_locks import VolcanoLocks
from volcano_locks.server.harness import LocalServer


def timed(n: int, warmup: int, one: Callable[[], None]) -> list[float]:
    """Milliseconds per call of `one`, after `warmup` untimed calls."""
    for _ in range(warmup):
        one()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        one()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def p99(samples: list[float]) -> float:
    """The 99th percentile (nearest rank)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * len(ordered)) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="timed enter+exit pairs per row")
    parser.add_argument("--warmup", type=int, default=20, help="untimed pairs before each row")
    args = parser.parse_args()

    run = uuid.uuid4().hex[:8]
    with LocalServer(quota=10_000_000) as server, prefect_test_harness(server_startup_timeout=120):
        os.environ.update(server.env())

        @locked_task(f"bench-prefect-{run}", ttl=30, on_contention="fail")
        def noop() -> None:
            return None

        limit = f"bench-prefect-{run}"
        with get_client(sync_client=True) as client:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=limit, limit=1))

        def prefect_gcl() -> None:
            with concurrency(limit, occupy=1, strict=True):
                pass

        with VolcanoLocks() as shared:

            def core_reused() -> None:
                with shared.with_lock(f"bench-core-{run}", 30, interrupt=True):
                    pass

            rows = [
                ("`locked_task` lock (local server)", timed(args.n, args.warmup, noop)),
                ("core `with_lock`, reused client (local server)", timed(args.n, args.warmup, core_reused)),
                (
                    "Prefect `concurrency(name, occupy=1)` (test server)",
                    timed(args.n, args.warmup, prefect_gcl),
                ),
            ]

    ours, prefect = rows[0][1], rows[2][1]
    print(f"enter+exit of a lock around an empty body, n={args.n} per row (milliseconds)\n")
    print("| what | median ms | p99 ms |")
    print("| --- | ---: | ---: |")
    for name, samples in rows:
        print(f"| {name} | {statistics.median(samples):.2f} | {p99(samples):.2f} |")
    ratio_median = statistics.median(prefect) / statistics.median(ours)
    ratio_p99 = p99(prefect) / p99(ours)
    print(f"| Prefect / `locked_task` | {ratio_median:.1f}x | {ratio_p99:.1f}x |")


if __name__ == "__main__":
    main()
