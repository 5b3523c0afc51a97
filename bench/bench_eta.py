"""How good is the waiter's ETA? A line of 20 holds of varied lengths: predicted against actual starts.

One run against the real local server.

A first holder takes the lock; 20 waiters (threads of one process, so one line: the wait engine's queue) join
behind it a moment apart, each to hold for its own length (seeded: the same lengths every run). While it
waits, each waiter's ``on_waiting`` report (every second) reads the engine's estimate
(:func:`volcano_locks.eta.reported`) and books the predicted start (now + expected). When it starts, every
prediction it made is compared with that moment. Printed: the median and 90th percentile of the absolute
error, overall, by confidence, and by how many waiters were still ahead; and how often the actual start fell
inside the predicted interval.

    .venv-prefect/bin/python bench/bench_eta.py [--waiters 20] [--seed 30]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import threading
import time
from dataclasses import dataclass

from volcano_locks import VolcanoLocks
from volcano_locks.eta import Eta, reported
from volcano_locks.server.harness import LocalServer
from volcano_locks.waiting import WaitPolicy

REPORT_EVERY = 1.0


@dataclass
class Prediction:
    made: float
    eta: Eta

    @property
    def start(self) -> float:
        return self.made + self.eta.expected


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiters", type=int, default=20)
    parser.add_argument("--seed", type=int, default=30)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    lengths = [round(rng.uniform(0.5, 3.0), 2) for _ in range(args.waiters)]
    predictions: dict[int, list[Prediction]] = {i: [] for i in range(args.waiters)}
    started: dict[int, float] = {}
    key = f"bench-eta-{rng.randrange(10**6)}"
    with LocalServer(quota=10**9) as server:
        url, service_key = server.url, server.service_key

        def waiter(i: int) -> None:
            def on_waiting(holder: object, waited: float) -> None:
                eta = reported()
                if eta is not None:
                    predictions[i].append(Prediction(time.monotonic(), eta))

            with (
                VolcanoLocks(url, service_key=service_key) as client,
                client.with_lock(
                    key,
                    30,
                    on_contention="wait",
                    wait_timeout=600,
                    on_waiting=on_waiting,
                    wait_policy=WaitPolicy(report_every=REPORT_EVERY),
                ),
            ):
                started[i] = time.monotonic()
                time.sleep(lengths[i])

        with VolcanoLocks(url, service_key=service_key) as first:
            lease = first.acquire(key, 30)
            threads = [
                threading.Thread(target=waiter, args=(i,), name=f"eta-waiter-{i}")
                for i in range(args.waiters)
            ]
            for t in threads:
                t.start()
                time.sleep(0.05)  # join the line in order
            time.sleep(2.0)
            first.release(key, lease)
            for t in threads:
                t.join(900)
    rows: list[tuple[str, list[float], list[bool]]] = []
    everything = [(i, p) for i, ps in predictions.items() for p in ps]

    def row(name: str, chosen: list[tuple[int, Prediction]]) -> None:
        errors = [abs(p.start - started[i]) for i, p in chosen]
        inside = [
            p.made + p.eta.earliest - 0.5 <= started[i] <= p.made + p.eta.latest + 0.5 for i, p in chosen
        ]
        rows.append((name, errors, inside))

    row("every prediction", everything)
    for confidence in ("high", "medium", "low"):
        row(f"confidence {confidence}", [(i, p) for i, p in everything if p.eta.confidence == confidence])
    for lo, hi in ((1, 1), (2, 5), (6, 20)):
        row(
            f"{lo}-{hi} in line" if lo != hi else "next in line",
            [(i, p) for i, p in everything if lo <= p.eta.position <= hi],
        )
    row("first prediction of each waiter", [(i, ps[0]) for i, ps in predictions.items() if ps])
    print(
        f"\nETA error: a line of {args.waiters} holds of {min(lengths):.1f}-{max(lengths):.1f} s "
        f"(seed {args.seed}, mean {statistics.fmean(lengths):.2f} s), reports every {REPORT_EVERY:g} s; "
        f"load average {os.getloadavg()[0]:.1f}\n"
    )
    print(
        "| predictions | n | median abs error | p90 abs error | actual start inside the interval (±0.5 s) |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, errors, inside in rows:
        if not errors:
            print(f"| {name} | 0 | - | - | - |")
            continue
        print(
            f"| {name} | {len(errors)} | {statistics.median(errors):.2f} s | {_q(errors, 0.9):.2f} s "
            f"| {sum(inside) / len(inside):.0%} |"
        )
    last = max(started, key=lambda i: started[i])
    took = started[last] + lengths[last] - min(started.values())
    print(f"\nThe line took {took:.1f} s; every waiter started: {len(started) == args.waiters}.")


if __name__ == "__main__":
    main()
