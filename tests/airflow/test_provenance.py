"""Provenance records: what they hold (public facts only), sealed, and what a reader accepts."""

from __future__ import annotations

import json
import logging

import pytest

from airflow_provider_volcano.records import (
    ForcedRecord,
    HolderRecord,
    Keyring,
    forced_line,
    open_record,
    sealed,
)

RING = Keyring.of("service-key-a")
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


def _open(value: object, lock_key: str = "warehouse", kind: type = HolderRecord) -> object:
    return open_record(RING, kind, value, lock_key=lock_key, name="Variable 'volcano_lock_holder:warehouse'")


def test_a_holder_record_round_trips_and_names_the_try() -> None:
    text = json.dumps(sealed(RING, RECORD))
    assert _open(text).record == RECORD  # type: ignore[attr-defined]
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
        "kind",
        "seal",
    }  # fmt: skip  (no token, no nonce, no key: nothing that proves ownership; the seal is a MAC)


def test_a_reader_refuses_what_is_not_a_sealed_record_of_that_lock(caplog: pytest.LogCaptureFixture) -> None:
    text = json.dumps(sealed(RING, RECORD))
    caplog.set_level(logging.WARNING)
    assert _open(text, "other").refusal == "it names lock 'warehouse', not 'other'"  # type: ignore[attr-defined]
    assert _open("not json").refusal == "it is not JSON"  # type: ignore[attr-defined]
    assert _open(None).refusal is None and _open(None).record is None  # type: ignore[attr-defined]
    forged = json.loads(text) | {"fencing_token": True}
    assert _open(json.dumps(forged)).record is None  # type: ignore[attr-defined]
    changed = json.loads(text) | {"dag_id": "payments"}  # another DAG named, the seal kept
    assert "does not match its facts" in _open(json.dumps(changed)).refusal  # type: ignore[attr-defined]
    unsealed = json.dumps(RECORD.facts())
    assert "carries no seal" in _open(unsealed).refusal  # type: ignore[attr-defined]
    assert "Ignoring Variable 'volcano_lock_holder:warehouse'" in caplog.text
    assert "service-key-a" not in caplog.text and json.loads(text)["seal"] not in caplog.text


def test_a_force_release_record_names_who_and_which_lease() -> None:
    record = ForcedRecord("warehouse", 7, "alice", "2026-12-01T03:20:00+00:00")
    assert _open(json.dumps(sealed(RING, record)), kind=ForcedRecord).record == record  # type: ignore[attr-defined]
    line = forced_line(record)
    assert "force-released by alice at 2026-12-01T03:20:00+00:00" in line and "fencing token 7" in line
