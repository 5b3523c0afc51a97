"""A busy machine for the tests that promise to hold on one: CPU-bound neighbours, topped up to a number.

A test run alone on a quiet laptop gets its neighbours from here; a test run inside ``make test`` (four
lanes of full stacks and worker fleets on two cores) already has them, and burning more cores there would
only slow every other lane. So the block runs beside ``want`` CPU-bound competitors in all, and only the
ones the machine lacks are started here. What the machine already has is the largest of three counts:

* the processes runnable right now (``/proc/stat``'s ``procs_running``, the median of a second's samples,
  this one left out): the 1-minute load average lags, and at the start of ``make test``, when every lane
  starts its servers at once, it still said the machine was quiet;
* the 1-minute load average, rounded down (whole runnable processes);
* ``VOLCANO_TEST_NEIGHBOURS``: what the caller declares (``make test`` sets it to its other lanes).
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["burners", "burners_needed", "busy", "neighbours"]

CPU_BOUND = "while True: pass"
SAMPLES, EVERY = 10, 0.1


def burners_needed(want: int, load: float) -> int:
    """How many CPU-bound processes to start for ``want`` neighbours when ``load`` are already there."""
    return max(0, want - math.floor(load))


def _running_now() -> float:
    """Processes runnable now besides this one (median of ``SAMPLES``); 0 where ``/proc/stat`` is not."""
    counts = []
    for n in range(SAMPLES):
        try:
            stat = Path("/proc/stat").read_text()
        except OSError:
            return 0.0
        rows = (line.split() for line in stat.splitlines() if line.startswith("procs_running"))
        running = next(rows, ["procs_running", "1"])[1]
        counts.append(max(0, int(running) - 1))
        if n < SAMPLES - 1:
            time.sleep(EVERY)
    return float(statistics.median(counts))


def neighbours() -> float:
    """How many CPU-bound neighbours the machine already has (the module's three counts, the largest)."""
    declared = os.environ.get("VOLCANO_TEST_NEIGHBOURS", "0")
    try:
        said = float(declared)
    except ValueError:
        raise ValueError(f"VOLCANO_TEST_NEIGHBOURS must be a number, got {declared!r}") from None
    return max(_running_now(), os.getloadavg()[0], said)


@contextmanager
def burners(count: int) -> Iterator[int]:
    """Run the block beside ``count`` CPU-bound processes started here; yields ``count``."""
    started = [subprocess.Popen([sys.executable, "-c", CPU_BOUND]) for _ in range(count)]
    try:
        yield count
    finally:
        for proc in started:
            proc.kill()
            proc.wait(10)


@contextmanager
def busy(want: int) -> Iterator[int]:
    """Run the block beside at least ``want`` CPU-bound neighbours; yields how many were started here."""
    with burners(burners_needed(want, neighbours())) as started:
        yield started
