"""The checker on synthetic logs: it must count what it promises to count, and be able to fail."""

from __future__ import annotations

from typing import Any

import pytest

from .checker import STOP_GRACE, Report, check

TTL = 5


class Log:
    """Builds synthetic worker events, driver events and writes-table rows."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []

    def section(
        self,
        worker: str,
        cs: int,
        token: int,
        begin: float,
        end: float | None,
        *,
        deadline: float | None = None,
        lost_at: float | None = None,
        lost_deadline: float | None = None,
        end_lost: bool = False,
    ) -> None:
        dl = begin + TTL if deadline is None else deadline
        base = {"worker": worker, "pid": 1, "wall": 0.0, "cs": cs, "token": token}
        self.events.append({**base, "ev": "start", "mono": begin, "deadline": dl, "ttl": TTL, "server": 0})
        if lost_at is not None:
            ldl = dl if lost_deadline is None else lost_deadline
            self.events.append({**base, "ev": "lost", "mono": lost_at, "deadline": ldl, "code": "x"})
        if end is not None:
            self.events.append({**base, "ev": "end", "mono": end, "deadline": dl, "lost": end_lost})

    def write(self, worker: str, cs: int, token: int, accepted: bool, *, late: bool = False) -> None:
        seq = len(self.rows) + 1
        self.rows.append(
            {
                "seq": seq,
                "token": token,
                "accepted": accepted,
                "worker": worker,
                "cs": cs,
                "late": late,
                "mono": float(seq),
                "value": "",
            }
        )

    def fault(self, ev: str, mono: float, **fields: Any) -> None:
        self.faults.append({"ev": ev, "mono": mono, "worker": "driver", "pid": 0, "wall": 0.0, **fields})

    def check(self) -> Report:
        return check(self.events, self.rows, self.faults, poll=1.0)


def clean_run() -> Log:
    log = Log()
    log.section("w0", 0, 10, 100.0, 102.0)
    log.write("w0", 0, 10, True)
    log.section("w1", 0, 11, 102.5, 104.0)
    log.write("w1", 0, 11, True)
    log.section("w0", 1, 12, 104.2, 106.0)
    log.write("w0", 1, 12, True)
    return log


def test_clean_run_reports_zeros() -> None:
    report = clean_run().check()
    assert report.line() == (
        "chaos: handovers=2 faults=0 writes=3 overlaps=0 stale_accepted=0 late_losses=0 hangs=0"
    )
    assert report.ok


def test_overlap_between_two_believing_holders_is_counted() -> None:
    log = clean_run()
    log.section("w2", 0, 13, 105.0, 107.0)  # starts while w0#1 still runs and believes
    report = log.check()
    assert report.overlaps == 1
    assert report.overlap_pairs == [("w0#1", "w2#0")]
    assert not report.ok


def test_no_overlap_once_the_first_holder_reported_loss() -> None:
    log = Log()
    log.section("w0", 0, 10, 100.0, 108.0, lost_at=103.0, end_lost=True)
    log.section("w1", 0, 11, 104.0, 106.0)
    assert log.check().overlaps == 0


def test_no_overlap_after_the_first_holders_local_deadline() -> None:
    log = Log()
    log.section("w0", 0, 10, 100.0, None, deadline=104.0)  # killed, never ended
    log.fault("worker_kill", 102.0, target="w0")
    log.section("w1", 0, 11, 105.0, 106.0)
    assert log.check().overlaps == 0


def test_overlap_with_a_killed_holder_before_it_died_is_counted() -> None:
    log = Log()
    log.section("w0", 0, 10, 100.0, None)
    log.section("w1", 0, 11, 101.0, 102.0)
    log.fault("worker_kill", 103.0, target="w0")
    assert log.check().overlaps == 1


def test_stale_write_accepted_is_counted_in_table_order() -> None:
    log = clean_run()
    log.write("w1", 0, 11, True)  # token 11 accepted after 12: the fencing check did not hold
    report = log.check()
    assert report.stale_accepted == 1
    assert not report.ok


def test_rejected_stale_write_is_fine() -> None:
    log = clean_run()
    log.write("w1", 0, 11, False)
    report = log.check()
    assert (report.stale_accepted, report.writes, report.rejected) == (0, 3, 1)


def test_repeated_writes_with_the_same_token_are_not_stale() -> None:
    log = clean_run()
    log.write("w0", 1, 12, True)
    assert log.check().stale_accepted == 0


def test_loss_reported_after_the_local_deadline_is_late() -> None:
    log = Log()
    log.section("w0", 0, 10, 100.0, 106.0, deadline=105.0, lost_at=105.5, lost_deadline=105.0, end_lost=True)
    assert log.check().late_losses == 1


def test_loss_reported_before_the_local_deadline_is_on_time() -> None:
    log = Log()
    log.section("w0", 0, 10, 100.0, 106.0, deadline=105.0, lost_at=104.0, lost_deadline=105.0, end_lost=True)
    assert log.check().late_losses == 0


def test_body_running_past_its_deadline_without_loss_is_a_late_loss() -> None:
    log = Log()
    log.section("w0", 0, 10, 100.0, 107.0, deadline=105.0)
    assert log.check().late_losses == 1


def test_stopped_holder_is_excused_only_when_it_reports_soon_after_sigcont() -> None:
    on_time = Log()
    on_time.section("w0", 0, 10, 100.0, 109.5, deadline=105.0, lost_at=109.2, end_lost=True)
    on_time.fault("worker_stop", 101.0, target="w0")
    on_time.fault("worker_cont", 109.0, target="w0")
    assert on_time.check().late_losses == 0

    slow = Log()
    slow.section("w0", 0, 10, 100.0, 120.0, deadline=105.0, lost_at=109.0 + STOP_GRACE + 1, end_lost=True)
    slow.fault("worker_stop", 101.0, target="w0")
    slow.fault("worker_cont", 109.0, target="w0")
    assert slow.check().late_losses == 1


def test_hangs_and_crashes_come_from_the_driver() -> None:
    log = clean_run()
    log.fault("hang", 200.0, target="w3")
    log.fault("crash", 201.0, target="w4", rc=1)
    report = log.check()
    assert (report.hangs, report.crashes) == (1, 1)
    assert not report.ok


def test_faults_count_driver_actions_and_server_injections() -> None:
    log = clean_run()
    log.fault("server_kill", 101.0, server=0)
    log.fault("server_restart", 101.5, server=0)
    log.fault("worker_stop", 102.0, target="w9")
    log.fault("worker_cont", 110.0, target="w9")
    log.fault("worker_kill", 111.0, target="w9")
    log.fault("server_injected", 120.0, count=17)
    report = log.check()
    assert report.faults == 20
    assert report.server_kills == 1


def test_takeover_after_killing_a_holder_is_measured_against_ttl_plus_grace_plus_poll() -> None:
    log = Log()
    log.section("w0", 0, 10, 100.0, None)
    log.fault("worker_kill", 101.0, target="w0")
    log.section("w1", 0, 11, 107.5, 108.0)
    report = log.check()
    [takeover] = report.takeovers
    assert takeover.seconds == pytest.approx(6.5)
    assert takeover.bound == TTL + 1 + 1.0
    assert not takeover.slow

    slow = Log()
    slow.section("w0", 0, 10, 100.0, None)
    slow.fault("worker_kill", 101.0, target="w0")
    slow.section("w1", 0, 11, 109.5, 110.0)
    assert slow.check().takeovers[0].slow
    assert "slow_takeovers=1" in slow.check().detail_line()


def test_stop_outcome_records_loss_and_fenced_late_write() -> None:
    log = Log()
    log.section("w0", 0, 10, 100.0, 109.5, deadline=105.0, lost_at=109.1, end_lost=True)
    log.write("w0", 0, 10, True)
    log.fault("worker_stop", 101.0, target="w0")
    log.section("w1", 0, 11, 106.5, 108.0)
    log.write("w1", 0, 11, True)
    log.fault("worker_cont", 109.0, target="w0")
    log.write("w0", 0, 10, False, late=True)
    report = log.check()
    [stop] = report.stops
    assert stop.hit_section and stop.loss_reported
    assert (stop.late_writes, stop.late_fenceable, stop.late_rejected) == (1, 1, 1)
    assert report.ok


def test_stop_of_a_holder_whose_guard_stays_silent_is_visible() -> None:
    log = Log()
    log.section("w0", 0, 10, 100.0, 109.5, deadline=105.0)
    log.fault("worker_stop", 101.0, target="w0")
    log.fault("worker_cont", 109.0, target="w0")
    [stop] = log.check().stops
    assert not stop.loss_reported


def test_losses_and_failed_calls_are_counted_for_the_details() -> None:
    log = clean_run()
    log.section("w2", 0, 13, 107.0, 109.0, lost_at=108.0, end_lost=True)
    log.events.append(
        {
            "ev": "outcome",
            "worker": "w3",
            "pid": 1,
            "mono": 110.0,
            "wall": 0.0,
            "cs": None,
            "result": "error",
            "error": "Unavailable",
        }
    )
    report = log.check()
    assert (report.losses, report.errors) == (1, 1)
    assert "losses=1 op_errors=1" in report.detail_line()


def test_reports_add_up() -> None:
    total = clean_run().check() + clean_run().check()
    assert (total.handovers, total.writes) == (4, 6)
