"""The lock board's history and its waiters' expected starts, from sealed tenure records.

Real parts: the session's local Volcano server (the live fencing token the history is read against) and
the session's Airflow metadata database (the tenure records are Variables, written as a task writes them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from airflow_provider_volcano.plugins.access import Access
from airflow_provider_volcano.plugins.board import GovernedReader, LockRow, collect
from airflow_provider_volcano.plugins.history import expected_starts, handovers
from airflow_provider_volcano.records import Keyring, sealed
from airflow_provider_volcano.records.tenure import TENURES_KEPT, TenureRecord, tenure_variable
from volcano_locks import LockLease, VolcanoLocks
from volcano_locks.eta import estimate
from volcano_locks.server.harness import LocalServer

NOW = datetime.now(UTC)


def _tenure(key: str, token: int, started: float, held: float | None, ending: str, n: int) -> TenureRecord:
    """Lease ``token`` of ``key``, acquired ``started`` s ago and held ``held`` s (``None``: not ended)."""
    at = NOW - timedelta(seconds=started)
    return TenureRecord(
        lock_key=key,
        fencing_token=token,
        acquired_at=at.isoformat(timespec="milliseconds"),
        ended_at="" if held is None else (at + timedelta(seconds=held)).isoformat(timespec="milliseconds"),
        ending=ending,
        dag_id="history_dag" if n % 2 else "other_dag",
        run_id=f"run_{n}",
        task_id="hold",
        map_index=-1,
        try_number=1,
        hostname="worker-1",
    )


@pytest.fixture
def history(
    airflow_db: Path, volcano_server: LocalServer, unique_key: str
) -> Iterator[tuple[list[LockLease], Keyring]]:
    """Five leases of one lock, one after the other, the last still held; their tenure records stored."""
    from airflow.models import Variable
    from airflow.utils.session import create_session

    ring = Keyring.of(volcano_server.service_key)
    with VolcanoLocks(volcano_server.url, service_key=volcano_server.service_key, timeout=10.0) as client:
        leases = []
        for n in range(5):
            leases.append(client.acquire(unique_key, 60))
            if n < 4:
                client.release(unique_key, leases[-1])
        t = [lease.fencing_token for lease in leases]
        records = [
            _tenure(unique_key, t[0], 120, 10, "released", 1),
            _tenure(unique_key, t[1], 100, 20, "lost", 2),
            _tenure(unique_key, t[2], 75, 30, "force-released", 3),
            _tenure(unique_key, t[3], 40, None, "holding", 4),  # its task never wrote its end
            _tenure(unique_key, t[4], 12, None, "holding", 5),  # the live holder
        ]
        names = [tenure_variable(unique_key, r.fencing_token) for r in records]
        forged = _tenure(unique_key, t[4] + 1, 5, 1, "released", 7)
        with create_session() as session:
            for name, record in zip(names, records, strict=True):
                Variable.set(name, json.dumps(sealed(ring, record)), session=session)
            # Not believed: an unsealed record, and a sealed one copied into another lease's slot.
            forged_name = tenure_variable(unique_key, forged.fencing_token)
            Variable.set(forged_name, json.dumps({**forged.facts(), "seal": "v1.x.y"}), session=session)
            moved = tenure_variable(unique_key, t[4] + 2)
            Variable.set(moved, json.dumps(sealed(ring, records[0])), session=session)
        try:
            yield leases, ring
        finally:
            client.release(unique_key, leases[-1])
            with create_session() as session:
                for name in (*names, forged_name, moved):
                    Variable.delete(name, session=session)


def _row(server: LocalServer, ring: Keyring, key: str) -> LockRow:
    """The lock's board row, as the page builds it (its live state read from the server)."""
    from airflow.utils.session import create_session

    with VolcanoLocks(server.url, service_key=server.service_key) as client, create_session() as session:
        return collect(session, GovernedReader(client, keys=ring), NOW, lock_keys=[key]).rows[key]


def test_the_history_shows_each_tenure_and_how_it_ended_expired_when_its_end_was_never_written(
    history: tuple[list[LockLease], Keyring], volcano_server: LocalServer, unique_key: str
) -> None:

    leases, ring = history
    row = _row(volcano_server, ring, unique_key)
    shown = [(t.record.fencing_token, t.ending) for t in row.tenures]
    tokens = [lease.fencing_token for lease in leases]
    assert shown == [
        (tokens[4], "holding"),
        (tokens[3], "expired"),
        (tokens[2], "force-released"),
        (tokens[1], "lost"),
        (tokens[0], "released"),
    ]  # newest first; the forged and the moved records are not among them
    assert handovers(row.tenures) == "4 hand-overs among the last 5 tenures, over 2 min (133 an hour)"
    assert [t.record.held_for() for t in row.tenures] == [None, None, 30.0, 20.0, 10.0]

    # The waiters' expected starts: the estimate over the ended tenures' held times, the live holder's 12 s.
    starts = expected_starts(row.tenures, row.look.state, NOW, 3)
    for place in (1, 2, 3):
        got, want = starts[place], estimate([10.0, 20.0, 30.0], 12.0, place)
        assert got is not None and want is not None  # times are kept to the millisecond
        assert (got.expected, got.earliest, got.latest) == pytest.approx(
            (want.expected, want.earliest, want.latest), abs=0.01
        )
        assert (got.confidence, got.position, got.tenures) == (want.confidence, place, 3)
    first = starts[1]
    assert first is not None and first.expected == pytest.approx(13.0, abs=0.01)  # median of 8 and 18

    # A viewer who may read only history_dag sees the other DAG's holders unnamed.
    viewer = Access("viewer", False, False, frozenset({"history_dag"}), frozenset())
    redacted = viewer.redact(row).tenures
    assert [t.names() for t in redacted][:2] == [
        "history_dag / run_5 / hold try 1",
        "a task of a DAG you may not read",
    ]
    assert redacted[1].as_dict()["holder"] is None and redacted[1].as_dict()["ending"] == "expired"


def test_a_free_lock_or_one_without_ended_tenures_gives_no_estimate(
    history: tuple[list[LockLease], Keyring], volcano_server: LocalServer, unique_key: str
) -> None:

    row = _row(volcano_server, history[1], unique_key)
    holding_only = [t for t in row.tenures if t.ending in ("holding", "expired")]
    assert expected_starts(holding_only, row.look.state, NOW, 2) == {1: None, 2: None}
    assert expected_starts(row.tenures, None, NOW, 1) == {1: None}  # not read: nothing is made up
    assert TENURES_KEPT == 20 and tenure_variable(unique_key, 41).endswith(":01")
