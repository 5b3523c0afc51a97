"""What a locked run tells its user, with the clock injected: the wait's reminders."""

from __future__ import annotations

import logging

import pytest

from prefect_volcano._events import LockEvents
from prefect_volcano._report import RunReport, WaitReporter
from volcano_locks import LockState


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_wait_is_told_at_its_start_and_about_every_minute_after(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = logging.getLogger("prefect_volcano.test_report")
    report = RunReport(
        "nightly:2026-11-29", "task", LockEvents("nightly:2026-11-29", "http://x"), log, cancels=False
    )
    reporter = WaitReporter(report, clock=clock)
    with caplog.at_level("INFO", logger=log.name):
        reporter.started(LockState(held=True, fencing_token=7))
        assert reporter.next_in() == 60.0
        clock.now += 59.5
        assert reporter.remind() is False and reporter.next_in() == pytest.approx(0.5)
        clock.now += 0.5
        assert reporter.remind() is True
        assert reporter.remind() is False  # not twice for one minute
        clock.now += 61
        assert reporter.remind() is True
    assert [r.getMessage() for r in caplog.records] == [
        "Waiting for lock 'nightly:2026-11-29', held by another run (holder's fencing token 7)",
        "Still waiting for lock 'nightly:2026-11-29' after 60 s, held by another run"
        " (holder's fencing token 7)",
        "Still waiting for lock 'nightly:2026-11-29' after 121 s, held by another run"
        " (holder's fencing token 7)",
    ]


def test_an_unknown_holder_is_not_made_up(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("prefect_volcano.test_report")
    report = RunReport("k", "flow", LockEvents("k", "http://x"), log, cancels=True)
    with caplog.at_level("INFO", logger=log.name):
        WaitReporter(report, clock=Clock()).started(None)
    assert [r.getMessage() for r in caplog.records] == ["Waiting for lock 'k', held by another run"]
