"""What a locked run tells its user while it waits (the core's wait engine decides when to report)."""

from __future__ import annotations

import logging
from datetime import datetime

import pytest

from prefect_volcano._events import LockEvents
from prefect_volcano._report import RunReport, WaitReporter
from volcano_locks import LockState
from volcano_locks.eta import estimate, reporting
from volcano_locks.waiting import WaitPolicy

NO_ETA = "; no start estimate yet (no change of hands seen)"  # outside the wait engine: no tenure seen

LOG = logging.getLogger("prefect_volcano.test_report")


def reporter(key: str) -> WaitReporter:
    return WaitReporter(
        RunReport(key, "task", LockEvents(key, "http://x", "p"), LOG, cancels=False, project="p")
    )


def test_a_wait_is_told_at_its_start_and_at_each_later_report(caplog: pytest.LogCaptureFixture) -> None:
    every = WaitPolicy().report_every
    assert every == 60.0  # "about every minute": the engine's policy, the one place it is set
    waiting = reporter("nightly:2026-11-29")
    with caplog.at_level("INFO", logger=LOG.name):
        waiting(LockState(held=True), 0.01)  # the engine's first refusal: the 409 did not name the holder
        waiting(LockState(held=True, fencing_token=7), every + 0.2)
        waiting(None, 2 * every + 0.9)  # nothing new seen: the last holder known is named
    assert [r.getMessage() for r in caplog.records] == [
        "Waiting for lock 'nightly:2026-11-29', held by another run" + NO_ETA,
        "Still waiting for lock 'nightly:2026-11-29' after 60 s, held by another run"
        " (holder's fencing token 7)" + NO_ETA,
        "Still waiting for lock 'nightly:2026-11-29' after 121 s, held by another run"
        " (holder's fencing token 7)" + NO_ETA,
    ]


def test_the_start_names_a_known_holder_and_starts_listening_once(caplog: pytest.LogCaptureFixture) -> None:
    started: list[object] = []
    waiting = WaitReporter(
        RunReport("k", "flow", LockEvents("k", "http://x", "p"), LOG, cancels=True, project="p"),
        on_start=started.append,
    )
    with caplog.at_level("INFO", logger=LOG.name):
        waiting(LockState(held=True, fencing_token=12), 0.0)
        waiting(LockState(held=True, fencing_token=12), 60.0)
    assert [r.getMessage() for r in caplog.records] == [
        "Waiting for lock 'k', held by another run (holder's fencing token 12)" + NO_ETA,
        "Still waiting for lock 'k' after 60 s, held by another run (holder's fencing token 12)" + NO_ETA,
    ]
    assert len(started) == 1 and isinstance(started[0], datetime)  # when its waiting event occurred


def test_the_waiting_line_says_when_the_run_expects_to_start(caplog: pytest.LogCaptureFixture) -> None:
    waiting = reporter("k")
    eta = estimate([10.0] * 8, holder_elapsed=4.0, position=2)
    with caplog.at_level("INFO", logger=LOG.name), reporting(eta):  # what the wait engine does around it
        waiting(LockState(held=True, fencing_token=3), 0.0)
    assert [r.getMessage() for r in caplog.records] == [
        "Waiting for lock 'k', held by another run (holder's fencing token 3); expected to start in about"
        " 16 s (16 s-16 s, high confidence, 2 in line here, from 8 tenures seen)"
    ]
