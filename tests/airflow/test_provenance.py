"""Provenance records: what they hold (public facts only) and what a reader accepts."""

from __future__ import annotations

import json

from airflow_provider_volcano._provenance import ForcedRecord, HolderRecord, forced_line

RECORD = HolderRecord(
    lock_key="warehouse",
    fencing_token=7,
    ttl=30,
    acquired_at="2026-12-01T03:12:00+00:00",
    hostname="worker-1",
    dag_id="daily_rollup",
    run_id="scheduled__2026-12-01",
    task_id="load",
    map_index=-1,
    try_number=2,
)


def test_a_holder_record_round_trips_and_names_the_try() -> None:
    text = RECORD.to_json()
    assert HolderRecord.parse("warehouse", text) == RECORD
    assert RECORD.describe() == (
        "held by daily_rollup / scheduled__2026-12-01 / load try 2 on worker-1, fencing token 7, "
        "since 2026-12-01T03:12:00+00:00"
    )
    assert set(json.loads(text)) == {
        "lock_key",
        "fencing_token",
        "ttl",
        "acquired_at",
        "hostname",
        "dag_id",
        "run_id",
        "task_id",
        "map_index",
        "try_number",
    }  # fmt: skip  (no token, no nonce, no key: nothing that proves ownership)


def test_a_reader_refuses_what_is_not_a_record_of_that_lock() -> None:
    text = RECORD.to_json()
    assert HolderRecord.parse("other", text) is None  # a record copied to another lock's Variable
    assert HolderRecord.parse("warehouse", "not json") is None
    assert HolderRecord.parse("warehouse", None) is None
    forged = json.loads(text) | {"fencing_token": True}
    assert HolderRecord.parse("warehouse", json.dumps(forged)) is None
    missing = {k: v for k, v in json.loads(text).items() if k != "hostname"}
    assert HolderRecord.parse("warehouse", json.dumps(missing)) is None


def test_a_force_release_record_names_who_and_which_lease() -> None:
    record = ForcedRecord("warehouse", 7, "alice", "2026-12-01T03:20:00+00:00")
    assert ForcedRecord.parse("warehouse", record.to_json()) == record
    assert ForcedRecord.parse("other", record.to_json()) is None
    line = forced_line(record)
    assert "force-released by alice at 2026-12-01T03:20:00+00:00" in line and "fencing token 7" in line


def test_a_waiting_line_names_the_holder_try_only_for_its_live_fencing_token() -> None:
    from datetime import UTC, datetime

    from airflow_provider_volcano.triggers.lock import waiting_facts
    from volcano_locks import LockState

    until = datetime(2026, 12, 1, 3, 13, tzinfo=UTC)
    line = waiting_facts(LockState(held=True, expires_at=until, fencing_token=7), None, None, RECORD)
    assert line.startswith(
        "held by daily_rollup / scheduled__2026-12-01 / load try 2 on worker-1, fencing token 7"
    )
    assert until.isoformat() in line
    newer = waiting_facts(LockState(held=True, expires_at=until, fencing_token=8), None, None, RECORD)
    assert "daily_rollup" not in newer and "fencing token 8" in newer  # a stale record names no one
