"""A lock group's XCom is sealed: no entry a user can write (REST API) yields another task's lease.

Airflow 3.3's REST API creates and patches XCom entries with any JSON value, so each forged entry
here is a JSON round trip of what a user could post as ``volcano_lock_group`` of the group's acquire
task. The victim is a real lease on the real local server, held with the token derived for another
task's (public) identity; after every attempt it is still held with its own fencing token, and the
server saw no acquisition, renewal or release with the victim's token but the victim's own.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_provider_volcano._tokens import TaskIdentity, derive_token, new_nonce
from airflow_provider_volcano.operators.group import (
    GROUP_XCOM_KEY,
    VolcanoLockGroupAcquireOperator,
    VolcanoLockGroupReleaseOperator,
)
from airflow_provider_volcano.operators.lock import VolcanoLockOperator
from airflow_provider_volcano.records import Keyring, open_group
from tests.airflow.helpers import task_context
from tests.airflow.versions import AirflowFailException
from volcano_locks.server.service import hash_token

ACQUIRE = "g.volcano_lock_acquire"
DAG, RUN = "swap_dag", "manual__2026-12-01"


def _context(task_id: str, xcoms: dict[Any, Any], run_id: str = RUN) -> dict[str, Any]:
    return task_context(task_id, xcoms, run_id, DAG)


def _victim(volcano_conn, outside, key: str) -> tuple[TaskIdentity, Any]:
    """Another task's lease on ``key``: its identity (nonce included) is public, as in its log."""
    victim = TaskIdentity("payments", "settle", "scheduled__2026-12-01", -1, 1, new_nonce())
    lease = outside.acquire(key, 60, token=derive_token(volcano_conn.service_key, victim, key))
    return victim, lease


def _victim_ops(volcano_conn, key: str, victim_token: str) -> list[tuple[str, int]]:
    digest = hash_token(victim_token)[:12]
    return [
        (r["op"], r["status"])
        for r in volcano_conn.requests()
        if r.get("path", "").endswith(f"/locks/{key}/lease") and r.get("token_sha256") == digest
    ]


def _facts(lease: Any, owner: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return json.loads(json.dumps({**lease.public_dict(), "owner": owner, "kind": "group", **extra}))


def seal_group(service_key: str, facts: dict[str, Any]) -> str:
    """A genuine seal of ``facts`` as a group lease (what an acquire task writes)."""
    return Keyring.of(service_key).seal("group", facts)


def _forgeries(volcano_conn, victim: TaskIdentity, lease: Any) -> dict[str, dict[str, Any]]:
    key = lease.key
    # A genuine seal, written by a real acquire task of another group (it is public in that XCom).
    other = TaskIdentity(DAG, ACQUIRE, "manual__other", -1, 1, new_nonce())
    other_group = _facts(lease, other.as_dict())
    other_seal = seal_group(volcano_conn.service_key, other_group)
    this_acquire = TaskIdentity(DAG, ACQUIRE, RUN, -1, 1, victim.nonce).as_dict()
    # The victim as a group acquire task of its own run: a genuinely sealed entry, replayed here.
    replayed_owner = TaskIdentity(DAG, ACQUIRE, "manual__victims-run", -1, 1, victim.nonce).as_dict()
    return {
        "the victim's identity, unsealed": _facts(lease, victim.as_dict()),
        "the victim's identity with another group's genuine seal": _facts(
            lease, victim.as_dict(), seal=other_seal
        ),
        "this run's acquire task with the victim's nonce, resealed by guess": _facts(
            lease, this_acquire, seal="0" * 64
        ),
        "a genuine sealed entry of another run, replayed": {
            **_facts(lease, replayed_owner),
            "seal": seal_group(volcano_conn.service_key, _facts(lease, replayed_owner)),
        },
        "the victim's identity with the seal of the entry it was copied from, lock key changed": {
            **other_group,
            "lock_key": key,
            "owner": victim.as_dict(),
            "seal": other_seal,
        },
    }


def test_a_forged_group_xcom_never_yields_a_grant_of_another_tasks_lease(
    volcano_conn, outside, unique_key
) -> None:
    victim, lease = _victim(volcano_conn, outside, unique_key)
    victim_token = derive_token(volcano_conn.service_key, victim, unique_key)
    ran: list[Any] = []
    forgeries = _forgeries(volcano_conn, victim, lease)
    for name, forged in forgeries.items():
        xcoms = {(ACQUIRE, GROUP_XCOM_KEY): forged}
        member = VolcanoLockOperator(
            task_id="g.load", python_callable=lambda: ran.append("granted"), lock_group=ACQUIRE
        )
        with pytest.raises(AirflowFailException, match="Refusing the lock group's XCom") as info:
            member.execute(_context("g.load", xcoms))
        assert volcano_conn.service_key not in str(info.value), name
        release = VolcanoLockGroupReleaseOperator(task_id="g.volcano_lock_release", acquire_task_id=ACQUIRE)
        with pytest.raises(AirflowFailException, match="Refusing"):
            release.execute(_context("g.volcano_lock_release", xcoms))
    assert ran == []
    state = outside.get(unique_key)
    assert state.held and state.fencing_token == lease.fencing_token  # still the victim's lease
    assert _victim_ops(volcano_conn, unique_key, victim_token) == [("acquire", 201)]  # the victim's own
    outside.release(unique_key, lease)


def test_the_seal_names_what_did_not_match_and_checks_the_run(volcano_conn, unique_key) -> None:
    owner = TaskIdentity(DAG, ACQUIRE, RUN, -1, 1, new_nonce())
    group: dict[str, Any] = {
        "lock_key": unique_key,
        "fencing_token": 7,
        "ttl": 60,
        "acquired_at": "2026-12-01T03:00:00+00:00",
        "expires_at": "2026-12-01T03:01:00+00:00",
        "owner": owner.as_dict(),
        "kind": "group",
    }
    group["seal"] = seal_group("key-a", group)
    where = {"dag_id": DAG, "run_id": RUN, "acquire_task_id": ACQUIRE, "map_index": -1}

    def refusal(value: dict[str, Any], key: str = "key-a", **at: Any) -> str | None:
        opened = open_group(Keyring.of(key), value, **{**where, **at})
        return opened.refusal

    assert open_group(Keyring.of("key-a"), group, **where).record.owner == owner  # type: ignore[union-attr]
    assert refusal(group, map_index=3) is None  # a mapped member
    assert refusal(group, "key-b") == (
        "sealed under another key (was the service key rotated? add the old key to previous_service_keys)"
    )
    for field, value in (("fencing_token", 8), ("ttl", 61), ("lock_key", "other"), ("kind", "task")):
        assert "seal does not match" in str(refusal({**group, field: value})), field
    assert "not this run's acquire task" in str(refusal(group, run_id="manual__y"))
    assert "of run 'manual__y'" in str(refusal(group, run_id="manual__y"))
    assert "not this run's acquire task" in str(refusal(group, acquire_task_id="h.volcano_lock_acquire"))


def test_the_acquire_tasks_own_sealed_xcom_runs_its_members(volcano_conn, outside, unique_key) -> None:
    """The positive case: the same path grants the group's lease to a member of the group's run."""
    xcoms: dict[Any, Any] = {}
    acquire = VolcanoLockGroupAcquireOperator(task_id=ACQUIRE, lock_key=unique_key, ttl=60)
    facts = acquire.execute(_context(ACQUIRE, xcoms))
    group = xcoms[(ACQUIRE, GROUP_XCOM_KEY)]
    assert set(group) == {
        "lock_key",
        "fencing_token",
        "acquired_at",
        "expires_at",
        "ttl",
        "owner",
        "kind",
        "seal",
    }
    member = VolcanoLockOperator(
        task_id="g.load",
        python_callable=lambda volcano_lease: volcano_lease["fencing_token"],
        lock_group=ACQUIRE,
    )
    assert member.execute(_context("g.load", xcoms)) == facts["fencing_token"]
    # The same genuine entry read from another run of the DAG is refused.
    with pytest.raises(AirflowFailException, match="not this run's acquire task"):
        member.execute(_context("g.load", xcoms, run_id="manual__other"))
    VolcanoLockGroupReleaseOperator(task_id="g.volcano_lock_release", acquire_task_id=ACQUIRE).execute(
        _context("g.volcano_lock_release", xcoms)
    )
    assert not outside.get(unique_key).held
