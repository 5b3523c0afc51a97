"""The critical-section log: one JSON object per line, one file per process.

Every record carries ``ev`` (the event kind), ``worker`` (a name unique within the run), ``pid``, ``mono`` and
``wall``. ``mono`` is ``time.monotonic()``: on Linux CPython reads ``clock_gettime(CLOCK_MONOTONIC)``, one
clock for the whole machine (seconds since boot, never stepped, still running while a process is SIGSTOPped),
so readings from different processes on the same host can be ordered against each other, and the lease's
``local_deadline`` (also ``time.monotonic()``) is on the same axis. ``wall`` (``time.time()``) is only for
humans: NTP may step it, so the checker never orders by it. ``clock_is_shared()`` tells whether the premise
holds; the chaos run refuses to start where it does not.

Worker events (written by ``worker.py``):

- ``start``: the body of ``with_lock`` began. ``cs`` (per-worker section number), ``token`` (fencing token),
  ``deadline`` (the lease's local deadline), ``ttl``, ``server`` (index of the server the worker talks to).
- ``write``: one write to the protected table. ``cs``, ``token``, ``accepted``, ``deadline`` (latest lease's),
  ``lost`` (guard state before the write), ``late`` (the deliberate write right after a SIGCONT).
- ``lost``: the guard reported loss (``on_loss``). ``cs``, ``token``, ``deadline`` (latest lease's), ``code``.
- ``end``: the body finished. ``cs``, ``token``, ``deadline`` (latest lease's), ``lost``.
- ``outcome``: how ``with_lock`` exited. ``cs`` (or null if never entered), ``result`` (``released``,
  ``lost``, ``contention``, ``error``), ``error`` (exception class name or null).
- ``exit``: the worker left its loop on request.

Driver events (``faults.jsonl``, written by ``run.py``): ``faults`` (``spec``, ``server``), ``server_kill``,
``server_restart`` (``server``), ``worker_kill``, ``worker_stop``, ``worker_cont`` (``target``: the worker),
``server_injected`` (``count``: faults the servers report having injected), ``hang`` (``target``),
``crash`` (``target``, ``rc``).

Nothing secret is ever logged: no service key, no ownership token (the fencing token is public).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["EventLog", "clock_is_shared", "read_events", "read_events_dir"]


def clock_is_shared() -> bool:
    """Return True when ``time.monotonic()`` is the machine-wide CLOCK_MONOTONIC (Linux)."""
    info = time.get_clock_info("monotonic")
    return "CLOCK_MONOTONIC" in info.implementation and "RAW" not in info.implementation


class EventLog:
    """Append-only JSONL writer, safe to share between the body thread and the keeper's callback."""

    def __init__(self, path: Path, worker: str) -> None:
        """Open ``path`` for appending; each record is flushed to the kernel so SIGKILL loses nothing."""
        self._path = path
        self._worker = worker
        self._lock = threading.Lock()
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def emit(self, ev: str, **fields: Any) -> dict[str, Any]:
        """Write one record stamped with worker, pid, mono and wall; return it."""
        record: dict[str, Any] = {
            "ev": ev,
            "worker": self._worker,
            "pid": os.getpid(),
            "mono": time.monotonic(),
            "wall": time.time(),
        }
        record.update(fields)
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
        return record

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._file.close()


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the records of one log; a torn last line (process killed mid-write) is skipped."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                return
            record = json.loads(line)
            if isinstance(record, Mapping):
                yield dict(record)


def read_events_dir(directory: Path, pattern: str = "worker-*.jsonl") -> list[dict[str, Any]]:
    """Read every log matching ``pattern`` in ``directory``, ordered by ``mono``."""
    events: list[dict[str, Any]] = []
    for path in sorted(directory.glob(pattern)):
        events.extend(read_events(path))
    events.sort(key=lambda e: e["mono"])
    return events
