"""The chaos run inside ``make test``: a short run per backend, checked; longer with CHAOS_SECONDS."""

from __future__ import annotations

from pathlib import Path

import pytest

from .adapter_stores import ADAPTERS
from .checker import Report
from .run import ChaosConfig, ChaosRun, default_seconds

# A long run (CHAOS_SECONDS=600) must not trip the suite's 300 s per-test timeout: each backend gets half the
# seconds, plus whole fault cycles, start-up and the drain.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(default_seconds() * 1.5) + 240)]

LINES: list[str] = []
"""The checker's lines, printed in the terminal summary (see conftest.py)."""


def _run(backend: str, tmp_path: Path, pg_dsn: str | None = None) -> Report:
    cfg = ChaosConfig(
        backend=backend,
        seconds=default_seconds() / 2,
        workdir=tmp_path / backend,
        seed=7,
        first_cycle=int(backend == "postgres"),  # between them, two ways of cutting each off
    )
    if pg_dsn is not None:
        cfg.pg_dsn = pg_dsn
    report = ChaosRun(cfg).run()
    LINES.extend([f"{backend}: {report.line()}", f"{backend}: {report.detail_line()}"])
    LINES.append(f"{backend}: {report.adapter_line()}")
    LINES.append(f"{backend}: {report.model_line()}")
    return report


def _assert_promises(report: Report, workdir: Path) -> None:
    assert report.model is not None
    where = (
        f"logs in {workdir}\n{report.line()}\n{report.detail_line()}\n{report.adapter_line()}\n"
        f"{report.model_line()}\noverlaps: {report.overlap_pairs}\n"
        + "\n".join(report.mismatches[:10] + [v.describe() for v in report.model.violations])
    )
    # Every lock call of the run is explained by the model, in an order real time allows, and every answer
    # a client saw is one the server logged.
    assert report.model.ok and not report.mismatches, where
    # It checked a real history: dozens of decisions, some of whose answers the clients never saw.
    assert report.model.ops >= 30 and report.model.counts["unknown_outcomes"] >= 1, where
    assert report.overlaps == 0, where
    assert report.stale_accepted == 0, where
    assert report.late_losses == 0, where
    assert report.hangs == 0, where
    assert report.crashes == 0, where
    # The run really attacked: a server kill -9, a holder SIGKILLed, a holder frozen past its TTL.
    assert report.server_kills >= 1, where
    assert report.takeovers, where
    assert any(s.hit_section for s in report.stops), where
    assert report.handovers >= 3 and report.writes > 0 and report.faults > 0, where
    # The servers' clocks stepped and ran fast and slow; a holder was cut off from its server.
    assert report.clock_changes >= 6 and report.holder_cuts >= 1, where
    assert report.cut_waiter_held == 0, where
    for stop in report.stops:
        if stop.hit_section:
            assert stop.loss_reported, where  # the frozen holder's guard must say it lost the lock
            assert stop.late_rejected >= stop.late_fenceable, where
    # The same attempts through each fenced adapter: none stale accepted, the frozen holder's late writes
    # refused wherever a newer token had landed, and the adapter accepted what the shared table did.
    assert sorted(report.adapters) == sorted(ADAPTERS), where  # sql, sql-async (AsyncFencedSQL), s3
    for adapter in report.adapters.values():
        assert adapter.stale_accepted == 0, where
        # Every attempt goes to each store in turn; a loss raised into a body (interrupt=True) can cut
        # at most one attempt short between the stores.
        assert adapter.writes > 0 and abs(adapter.writes - report.writes) <= report.losses, where
        for stop in adapter.stops:
            if stop.hit_section:
                assert stop.late_rejected >= stop.late_fenceable, where
    for takeover in report.takeovers:
        # Measured and reported, not asserted tightly (shared 2-core machine): this bound only catches hangs.
        assert takeover.seconds is not None and takeover.seconds < 3 * takeover.bound, where


def test_chaos_sqlite(tmp_path: Path) -> None:
    """One server on a SQLite file, killed -9 and restarted mid-run."""
    report = _run("sqlite", tmp_path)
    _assert_promises(report, tmp_path / "sqlite")


@pytest.mark.postgres
def test_chaos_postgres(tmp_path: Path, chaos_pg_dsn: str) -> None:
    """Two servers behind one PostgreSQL database, workers spread across them, each killed in turn."""
    report = _run("postgres", tmp_path, chaos_pg_dsn)
    _assert_promises(report, tmp_path / "postgres")
