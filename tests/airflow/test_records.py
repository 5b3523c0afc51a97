"""Sealed records: seal and verify, one key per record type, binding, and service key rotation.

The first tests need no Airflow at all (the seal is pure); the rotation tests run a lock group's
acquire task, its member and its release task, a trigger and a resumed task in this process against
the real local server, with the connection's service key changed between them (a second key minted
for the same project, as a rotation does).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from airflow_provider_volcano._tokens import TaskIdentity, new_nonce
from airflow_provider_volcano.hooks.volcano import VolcanoConnectionError, parse_connection
from airflow_provider_volcano.operators.group import (
    GROUP_XCOM_KEY,
    VolcanoLockGroupAcquireOperator,
    VolcanoLockGroupReleaseOperator,
)
from airflow_provider_volcano.operators.lock import VolcanoLockOperator
from airflow_provider_volcano.records import (
    ROTATED,
    HandoffRecord,
    HolderRecord,
    Keyring,
    SealKey,
    open_record,
    sealed,
)
from airflow_provider_volcano.triggers.lock import VolcanoLockTrigger
from tests.airflow.helpers import volcano_conn_json
from tests.airflow.test_group_forgery import ACQUIRE, _context
from tests.airflow.versions import AirflowFailException

OWNER = TaskIdentity("etl", "load", "manual__1", -1, 1, new_nonce())
HANDOFF = HandoffRecord("k", 7, None, OWNER)


def _open(keys: Keyring, value: object, kind: type = HandoffRecord, lock_key: str = "k") -> Any:
    return open_record(keys, kind, value, lock_key=lock_key, name="Variable 'v'")


def test_a_seal_verifies_under_its_key_and_only_over_its_facts() -> None:
    ring = Keyring.of("key-a")
    value = sealed(ring, HANDOFF)
    opened = _open(ring, value)
    assert opened.record == HANDOFF and opened.key == ring.current
    for field, changed in (
        ("fencing_token", 8),
        ("lock_key", "k2"),
        ("kind", "group"),
        ("owner", {**OWNER.as_dict(), "task_id": "settle"}),
    ):
        refusal = _open(ring, {**value, field: changed}, lock_key=None).refusal  # type: ignore[arg-type]
        assert refusal is not None and "does not match its facts" in refusal, field


def test_each_record_type_has_a_key_of_its_own() -> None:
    """A genuine seal over the same facts, made as another record type, never opens."""
    ring = Keyring.of("key-a")
    facts = HANDOFF.facts()
    as_holder = {**facts, "seal": ring.seal(HolderRecord.RECORD, facts)}
    assert "does not match its facts" in _open(ring, as_holder).refusal
    assert ring.current.mac("handoff", facts) != ring.current.mac("holder", facts)


def test_a_rotated_key_is_named_as_such_never_as_a_forgery() -> None:
    old, new = Keyring.of("key-a"), Keyring.of("key-b", ["key-a"])
    value = sealed(old, HANDOFF)
    assert _open(Keyring.of("key-b"), value).refusal == ROTATED
    assert "forg" not in ROTATED
    opened = _open(new, value)  # the old key listed: honoured, and it says which key sealed it
    assert opened.record == HANDOFF and opened.key == old.current and opened.key != new.current
    assert (
        new.find(old.current.key_id) == old.current and Keyring.of("key-b").find(old.current.key_id) is None
    )
    assert new.seal("handoff", HANDOFF.facts()).split(".")[1] == new.current.key_id  # new seals: new key


def test_no_key_shows_in_a_repr_a_seal_or_a_refusal(caplog: pytest.LogCaptureFixture) -> None:
    secret = "sk-very-secret-service-key"
    ring = Keyring.of(secret, ["sk-older-secret"])
    caplog.set_level(logging.WARNING)
    value = sealed(ring, HANDOFF)
    _open(ring, {**value, "fencing_token": 9})
    _open(Keyring.of("other"), value)
    shown = " ".join((repr(ring), repr(_open(ring, value)), json.dumps(value), caplog.text))
    assert secret not in shown and "sk-older-secret" not in shown
    assert "Ignoring Variable 'v'" in caplog.text
    with pytest.raises(ValueError, match="non-empty"):
        SealKey.of("")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"previous_service_keys": ["sk-a", "sk-b", "sk-a"]}, ("sk-a", "sk-b")),
        ({"previous_service_keys": "sk-a, sk-b"}, ("sk-a", "sk-b")),
        ({"previous_service_keys": '["sk-a"]'}, ("sk-a",)),
        ({"previous_service_keys": ""}, ()),
        ({}, ()),
    ],
)
def test_previous_service_keys_are_read_from_the_connection(extra: dict[str, Any], expected: tuple) -> None:
    conn = Conn(extra)
    config = parse_connection(conn)
    assert config.previous_service_keys == expected
    assert "sk-a" not in repr(config)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (7, "previous_service_keys must be a list of service keys, got int"),
        (["sk-a", 3], r"previous_service_keys\[1\] must be a non-empty string \(a service key\), got int"),
        ("[not json", "previous_service_keys is not a valid JSON list"),
    ],
)
def test_bad_previous_service_keys_are_named_without_the_keys(raw: object, message: str) -> None:
    with pytest.raises(VolcanoConnectionError, match=message) as info:
        parse_connection(Conn({"previous_service_keys": raw}))
    assert "sk-a" not in str(info.value)


class Conn:
    """A connection's attributes, as ``parse_connection`` reads them."""

    def __init__(self, extra: dict[str, Any]) -> None:
        self.conn_id, self.host, self.port, self.schema = "volcano_test", "http://127.0.0.1:1", None, None
        self.password, self.extra = "sk-current", json.dumps(extra)


# -- a rotation against the real local server --------------------------------------------------------


def _use(monkeypatch: pytest.MonkeyPatch, conn: Any, key: str, previous: list[str] | None = None) -> None:
    extra = {} if previous is None else {"previous_service_keys": previous}
    monkeypatch.setenv("AIRFLOW_CONN_VOLCANO_DEFAULT", volcano_conn_json(conn.url, key, **extra))


def _new_key(conn: Any) -> str:
    key = conn.server.mint_key(ttl_seconds=86_400)
    assert key != conn.service_key
    return str(key)


def test_a_group_keeps_working_across_a_rotation(volcano_conn, outside, unique_key, monkeypatch) -> None:
    xcoms: dict[Any, Any] = {}
    facts = VolcanoLockGroupAcquireOperator(task_id=ACQUIRE, lock_key=unique_key, ttl=60).execute(
        _context(ACQUIRE, xcoms)
    )
    new_key = _new_key(volcano_conn)

    def member() -> VolcanoLockOperator:  # a new task each time: its hook reads the connection anew
        return VolcanoLockOperator(
            task_id="g.load",
            python_callable=lambda volcano_lease: volcano_lease["fencing_token"],
            lock_group=ACQUIRE,
        )

    # Rotated without the old key listed: refused, and the message says why (never "forged").
    _use(monkeypatch, volcano_conn, new_key)
    with pytest.raises(AirflowFailException, match="sealed under another key") as info:
        member().execute(_context("g.load", xcoms))
    assert "forg" not in str(info.value).lower()
    # With the old key listed, the member runs under the group's lease (same fencing token).
    _use(monkeypatch, volcano_conn, new_key, [volcano_conn.service_key])
    assert member().execute(_context("g.load", xcoms)) == facts["fencing_token"]
    assert outside.get(unique_key).fencing_token == facts["fencing_token"]
    VolcanoLockGroupReleaseOperator(task_id="g.volcano_lock_release", acquire_task_id=ACQUIRE).execute(
        _context("g.volcano_lock_release", xcoms)
    )
    assert not outside.get(unique_key).held
    assert xcoms[(ACQUIRE, GROUP_XCOM_KEY)]["seal"].count(".") == 2


def test_a_handoff_acquired_before_a_rotation_is_taken_over_by_its_resumed_task(
    volcano_conn, outside, unique_key, monkeypatch
) -> None:
    owner = TaskIdentity("etl", "load", "manual__1", -1, 1, new_nonce())
    trigger = VolcanoLockTrigger(
        volcano_conn_id="volcano_default", lock_key=unique_key, ttl=30, identity=owner.as_dict()
    )

    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    event = asyncio.run(asyncio.wait_for(first(), 30))
    assert event["status"] == "acquired" and isinstance(event["key_id"], str)
    _use(monkeypatch, volcano_conn, _new_key(volcano_conn), [volcano_conn.service_key])
    ti = _context("load", {})["ti"]
    ti.dag_id, ti.run_id = "etl", "manual__1"
    op = VolcanoLockOperator(
        task_id="load", lock_key=unique_key, python_callable=lambda volcano_lease: volcano_lease
    )
    result = op.execute_complete({"ti": ti}, event, nonce=owner.nonce)  # type: ignore[arg-type]
    assert result["fencing_token"] == event["fencing_token"]  # the trigger's very lease, taken over
    assert not outside.get(unique_key).held
