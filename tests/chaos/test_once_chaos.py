"""The run-once chaos run, short: the ledger holds under kills, stops and duplicates; the others do not.

The full run (10,000 attempts over 300 keys) is ``python -m tests.chaos.once_run``; the README quotes it.
"""

from __future__ import annotations

import pytest

from .once_run import MODES, held, make_plan, run_all, table

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(2400)]


def test_each_key_once_under_faults_and_the_others_duplicate(pg_dsn: str) -> None:
    keys = 30
    plan = make_plan(180, keys, seed=7, kill_rate=0.3, stale_rate=0.07)
    assert any(a.fault == "killed" for a in plan) and any(a.fault == "stale" for a in plan)
    results = {c.mode: c for c in run_all(plan, keys, MODES, workers=4, timeout=900, dsn=pg_dsn)}
    print(table(list(results.values())))
    for mode in ("ledger/sql", "ledger/s3"):
        c = results[mode]
        assert held(c), c
        assert c.effects == keys
        assert c.kills > 0 and c.stops > 0, c  # the faults were met, not planned only
    assert results["ledger/sql"].errors.get("StaleFencingToken", 0) > 0  # the stopped holders were refused
    assert results["lock/sql"].duplicate_effects > 0 and results["lock/sql"].stale_writes > 0
    assert results["prefect-limit/sql"].duplicate_effects > 0
