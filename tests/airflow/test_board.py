"""The lock board's data: provenance, waiters in order, and what opening the page costs Volcano.

Real parts: a local Volcano server with the contract's 600-a-minute quota (its request log counts the
page's looks), the session's Airflow metadata database (Variables, XComs, task instances, triggers).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from airflow_provider_volcano.plugins.board import GovernedReader, collect
from airflow_provider_volcano.records import HOLDER_PREFIX, HolderRecord, Keyring, sealed
from volcano_locks import VolcanoLocks
from volcano_locks.governor import MIN_BURST
from volcano_locks.server.harness import LocalServer

LOCKS = 200


@pytest.fixture(scope="module")
def quota_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """A Volcano server with the contract's quota (600 requests a minute), so a page that overspent
    would show up as refused renewals."""
    db = tmp_path_factory.mktemp("volcano-quota") / "locks.sqlite3"
    with LocalServer(db=str(db), admin=True) as srv:
        yield srv


def _holder(key: str, token: int, ttl: int, n: int) -> HolderRecord:
    return HolderRecord(
        lock_key=key,
        fencing_token=token,
        ttl=ttl,
        acquired_at=datetime.now(UTC).isoformat(timespec="seconds"),
        hostname=f"worker-{n % 3}",
        dag_id="board_dag",
        run_id=f"run_{n}",
        task_id="hold",
        map_index=-1,
        try_number=1,
    )


def test_opening_the_page_on_200_locks_costs_at_most_its_budget(
    airflow_db: Path, quota_server: LocalServer
) -> None:
    from airflow.models import Variable
    from airflow.utils.session import create_session

    prefix = f"board-{uuid.uuid4().hex[:8]}"
    keys = [f"{prefix}-{i:03d}" for i in range(LOCKS)]
    ring = Keyring.of(quota_server.service_key)
    with VolcanoLocks(quota_server.url, service_key=quota_server.service_key, timeout=10.0) as client:
        leases = [client.acquire(key, 600) for key in keys]  # 200 held locks the deployment uses
        with create_session() as session:
            for n, lease in enumerate(leases):
                Variable.set(
                    HOLDER_PREFIX + lease.key,
                    json.dumps(sealed(ring, _holder(lease.key, lease.fencing_token, 600, n))),
                    session=session,
                )
        keeper_key = f"{prefix}-renewing"
        try:
            with client.with_lock(keeper_key, 5) as guard:  # a holder renewing every ~1.7 s meanwhile
                quota_server.clear_requests()
                reader = GovernedReader(client, refresh=2.0, keys=ring)
                started = time.monotonic()
                boards = []
                while time.monotonic() - started < 8.0:  # the page refreshed every second for 8 s
                    with create_session() as session:
                        boards.append(collect(session, reader))
                    time.sleep(1.0)
                elapsed = time.monotonic() - started
                assert not guard.lost
                log = quota_server.requests()
        finally:
            for lease in leases:
                client.release(lease.key, lease)
            with create_session() as session:
                for key in keys:
                    Variable.delete(HOLDER_PREFIX + key, session=session)

    looks = [e for e in log if e["method"] == "GET" and e["path"].startswith(f"/locks/{prefix}-")]
    governor = client.governor
    # The governor admits a burst and then its waiting rate (never above the waiting budget).
    bound = MIN_BURST + governor.wait_budget * elapsed / 60 + 1
    print(
        f"looks={len(looks)} bound={bound:.1f} refreshes={len(boards)} "
        f"renewals={len(renewals_all(log, keeper_key))}"
    )
    assert reader.sent == len(looks)
    assert 0 < len(looks) <= bound, (len(looks), bound)
    assert len(looks) < LOCKS  # an unbudgeted page would have read every lock at every refresh
    renewals = [e for e in log if e["path"] == f"/locks/{keeper_key}/lease" and e["method"] == "PATCH"]
    assert renewals and all(e["status"] == 200 for e in renewals), renewals
    assert not [e for e in log if e["status"] == 429]
    # What was read shows its holder's provenance; what was not is "not read yet", never made up.
    last = boards[-1]
    read = [row for key, row in last.rows.items() if key.startswith(prefix) and row.look.state is not None]
    assert read and all(row.holder is not None and row.holder.dag_id == "board_dag" for row in read)
    unread = [row for key, row in last.rows.items() if key.startswith(prefix) and row.look.state is None]
    assert len(read) + len(unread) == LOCKS and all(row.holder is None for row in unread)
    for row in read:
        assert row.holder is not None and row.holder.last_renewal is not None
        assert row.holder.last_renewal <= datetime.now(UTC) + timedelta(seconds=5)


def test_a_stale_holder_record_is_not_shown_as_the_holder(
    airflow_db: Path, volcano_server: LocalServer, unique_key: str
) -> None:
    from airflow.models import Variable
    from airflow.utils.session import create_session

    with VolcanoLocks(volcano_server.url, service_key=volcano_server.service_key, timeout=10.0) as client:
        first = client.acquire(unique_key, 30)
        client.release(unique_key, first)
        second = client.acquire(unique_key, 30)  # another owner, not in this deployment
        try:
            with create_session() as session:
                Variable.set(
                    HOLDER_PREFIX + unique_key,
                    json.dumps(
                        sealed(
                            Keyring.of(volcano_server.service_key),
                            _holder(unique_key, first.fencing_token, 30, 1),
                        )
                    ),
                    session=session,
                )
            with create_session() as session:
                reader = GovernedReader(client, keys=Keyring.of(volcano_server.service_key))
                row = collect(session, reader).rows[unique_key]
            assert row.held and row.look.state is not None
            assert row.look.state.fencing_token == second.fencing_token
            assert row.holder is None  # the record names fencing token 1: an earlier lease
        finally:
            client.release(unique_key, second)
            with create_session() as session:
                Variable.delete(HOLDER_PREFIX + unique_key, session=session)


def renewals_all(log: list[dict[str, object]], key: str) -> list[dict[str, object]]:
    """The renewals of ``key`` in a request log."""
    return [e for e in log if e["path"] == f"/locks/{key}/lease" and e["method"] == "PATCH"]
