"""Bookkeeping beside the task's body: board and handoff records the body need not wait for.

The records a task writes when it starts to hold a lock (the lock board's holder record, the deletion
of a handoff record) are Airflow Variable calls through the task's supervisor. They are best effort
(each logs its own failure), so they run on one thread beside the body, in order, and the thread is
joined before the task ends: a resumed task's body starts as soon as it holds the lease.

Only where the task's channel to its supervisor serves several threads (a real task: the Task SDK's
``CommsDecoder`` sends under a lock). ``dag.test()``'s in-process channel does not, so there the calls
run before the block, as they always did.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from airflow_provider_volcano.runtime.airflow_calls import channel_serves_threads

__all__ = ["beside"]

log = logging.getLogger(__name__)


@contextmanager
def beside(*calls: Callable[[], object], logger: logging.Logger | Any = log) -> Iterator[None]:
    """Run ``calls`` in order on a named thread while the block runs; join it when the block ends."""

    def run() -> None:
        for call in calls:
            try:
                call()
            except Exception as exc:  # best effort: the lock works without its records
                logger.warning("Lock bookkeeping beside the task failed: %s", exc)

    if not channel_serves_threads():
        run()
        yield
        return
    thread = threading.Thread(target=run, name="volcano-lock-bookkeeping", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()
