"""Who sees what on the lock board and who may force-release, decided before any Volcano request.

These tests build :class:`~airflow_provider_volcano.plugins.access.Access` values as Airflow's auth
manager would answer and check the board's decisions on real rows and real sealed records, and the
force release's one read against the session's local server (the full stack's answers are in
``test_board_stack.py``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from airflow_provider_volcano.plugins.access import Access
from airflow_provider_volcano.plugins.board import (
    GovernedReader,
    Holder,
    LockRow,
    Provenance,
    Waiter,
    board_holder,
)
from airflow_provider_volcano.records import HolderRecord, Keyring, sealed
from volcano_locks import VolcanoLocks

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _holder(dag_id: str) -> Holder:
    return Holder(dag_id, "run", "hold", -1, 1, "worker-1", "2026-01-01T00:00:00+00:00", None)


def _waiter(dag_id: str) -> Waiter:
    return Waiter(dag_id, "run", "wait", -1, 1, NOW, "deferred")


def _access(read: set[str], edit: set[str], *, read_all: bool = False, edit_all: bool = False) -> Access:
    return Access("someone", read_all, edit_all, frozenset(read), frozenset(edit))


def test_a_lock_is_seen_through_its_dags_and_only_they_narrow_it() -> None:
    row = LockRow("k", named_by={"a"}, waiters=[_waiter("b")])
    reader_a = _access({"a"}, set())
    assert reader_a.sees(row) and reader_a.sees(row, "a")
    assert not reader_a.sees(row, "b")  # a filter naming a DAG the user may not read shows nothing
    assert not reader_a.sees(row, "c")
    assert not _access({"c"}, set()).sees(row)
    assert not _access({"c"}, set()).sees(row, "a")
    outside = LockRow("held-from-outside")
    assert not reader_a.sees(outside) and _access(set(), set(), read_all=True).sees(outside)


def _record(key: str, token: int, dag_id: str) -> HolderRecord:
    return HolderRecord(key, token, 30, "2026-01-01T00:00:00+00:00", "worker-1", dag_id, "run", "hold", -1, 1)


def test_only_a_record_sealed_for_this_lock_is_provenance(caplog: pytest.LogCaptureFixture) -> None:
    ring = Keyring.of("service-key-for-this-test")
    good = json.dumps(sealed(ring, _record("k", 7, "a")))
    (found,) = board_holder(ring, "k", good, None)
    assert (found.holder.dag_id, found.fencing_token) == ("a", 7)
    unsealed = json.dumps(_record("k", 7, "a").facts())
    other_lock = json.dumps(sealed(ring, _record("other", 7, "a")))
    other_key = json.dumps(sealed(Keyring.of("another-service-key"), _record("k", 7, "a")))
    for forged in (unsealed, other_lock, other_key, "not json"):
        assert board_holder(ring, "k", forged, None) == ()
    assert board_holder(None, "k", good, None) == ()  # no keys: nothing is believed
    assert "service-key-for-this-test" not in caplog.text


def test_without_sealed_provenance_a_release_needs_edit_on_every_dag() -> None:
    row = LockRow("k", named_by={"b"}, claims=())  # a forged record opens to nothing
    assert not _access({"a"}, {"a"}).sees(row)
    assert row.sealed_dag(7) is None
    assert not _access({"a", "b"}, {"a", "b"}).may_edit(row.sealed_dag(7))
    assert _access(set(), set(), edit_all=True).may_edit(row.sealed_dag(7))
    held = LockRow("k", claims=(Provenance(_holder("a"), 7, 30),))
    assert held.sealed_dag(7) == "a" and held.sealed_dag(8) is None  # bound to its lease
    assert _access({"a"}, set()).sees(held)
    assert _access({"a"}, {"a"}).may_edit(held.sealed_dag(7))
    assert not _access({"a"}, {"a"}).may_edit(held.sealed_dag(8))


def test_other_dags_holder_and_waiters_are_left_out_and_counted() -> None:
    row = LockRow(
        "k",
        holder=_holder("b"),
        waiters=[_waiter("a"), _waiter("b"), _waiter("b")],
        named_by={"a", "b"},
    )
    seen = _access({"a"}, set()).redact(row)
    assert seen.holder is None and seen.holder_hidden
    assert [w.dag_id for w in seen.waiters] == ["a"] and seen.hidden_waiters == 2
    assert seen.named_by == {"a"}
    assert _access(set(), set(), read_all=True).redact(row) is row


def test_a_release_read_is_governed_and_never_sent_in_a_long_blackout(
    volcano_server: Any, unique_key: str
) -> None:
    """The one read an authorised force release makes comes from the budget: after a 429 whose
    ``Retry-After`` outlasts the wait it is not sent at all; one the wait outlasts is waited out
    (an injected sleeper)."""
    # A service key of its own, so the blackout below is this test's governor's alone.
    with VolcanoLocks(volcano_server.url, service_key=volcano_server.service_key, timeout=10.0) as client:
        lease = client.acquire(unique_key, 30)
        try:
            slept: list[float] = []
            reader = GovernedReader(client, sleep=slept.append)

            def reads() -> int:
                return sum(
                    1
                    for e in volcano_server.requests()
                    if e["method"] == "GET" and e["path"] == f"/locks/{unique_key}"
                )

            before = reads()
            client.governor.note_rate_limited("get", 30.0)
            look = reader.look_for_release(unique_key, wait=2.0)
            assert look.state is None and look.error is not None and "try again" in look.error
            assert reads() == before and reader.sent == 0 and not slept
            look = reader.look_for_release(unique_key, wait=60.0)  # the user may wait this long: waited out
            assert look.state is not None and look.state.fencing_token == lease.fencing_token
            assert reads() == before + 1 and reader.sent == 1 and len(slept) == 1 and 29 < slept[0] <= 31
        finally:
            client.release(unique_key, lease)
