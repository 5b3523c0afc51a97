"""The lock board's permissions on a real api-server: Airflow's terms, checked before any Volcano request.

One stack (api-server with the UI and the REST API, dag processor, scheduler, triggerer) parses two DAGs,
``board_a`` naming lock A and ``board_b`` naming lock B; both locks are held from outside Airflow on the
session's local Volcano server. Users log in through Airflow (:mod:`tests.airflow.dag_auth`: Airflow's
simple auth manager with per-DAG permissions): ``edit_a`` may read and edit ``board_a`` only,
``read_a`` may read ``board_a`` only, ``admin`` may do everything. A Variable that claims B's lease for
``board_a`` is written through the REST API, as any user allowed to edit Variables could.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_volcano.records import HOLDER_PREFIX, HolderRecord, Keyring, sealed
from tests.airflow.dag_auth import ENV as DAG_ACCESS
from tests.airflow.helpers import STACK_DAGS, Stack, VolcanoConn, dag_stack
from volcano_locks import LockLease, VolcanoLocks

REPO = Path(__file__).resolve().parents[2]
USERS = {
    "admin": ("admin", "access-admin"),
    "edit_a": ("user", "access-edit-a"),
    "read_a": ("viewer", "access-read-a"),
}
SCOPES = {"edit_a": {"GET": ["board_a"], "PUT": ["board_a"]}, "read_a": {"GET": ["board_a"]}}
REFUSALS = 50


@pytest.fixture(scope="module")
def keys() -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    return {"a": f"access-{tag}-a", "b": f"access-{tag}-b"}


@pytest.fixture(scope="module")
def stack(
    airflow_db: Path,
    session_conn: VolcanoConn,
    keys: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    extra = {
        "VOLCANO_BOARD_KEY_A": keys["a"],
        "VOLCANO_BOARD_KEY_B": keys["b"],
        "AIRFLOW__CORE__AUTH_MANAGER": "tests.airflow.dag_auth.DagScopedAuthManager",
        DAG_ACCESS: json.dumps(SCOPES),
        "PYTHONPATH": str(REPO),
    }
    with dag_stack(
        airflow_db,
        session_conn,
        tmp_path_factory.mktemp("board-access"),
        [STACK_DAGS / "volcano_board_access_dags.py"],
        ["board_a", "board_b"],
        users=USERS,
        extra_env=extra,
    ) as s:
        yield s


@pytest.fixture(scope="module")
def held(session_conn: VolcanoConn, keys: dict[str, str], stack: Stack) -> Iterator[dict[str, LockLease]]:
    """Both locks held from outside Airflow for the module (TTL long enough for every test)."""
    with VolcanoLocks(session_conn.url, service_key=session_conn.service_key, timeout=10.0) as client:
        leases = {name: client.acquire(key, 900) for name, key in keys.items()}
        try:
            yield leases
        finally:
            for lease in leases.values():
                client.release(lease.key, lease)


def _token(stack: Stack, user: str) -> str:
    return str(
        stack.rest("POST", "/auth/token", {"username": user, "password": USERS[user][1]})["access_token"]
    )


def _get(stack: Stack, path: str, user: str, bearer: str | None = None) -> tuple[int, str, Any]:
    request = urllib.request.Request(
        stack.url + path, headers={"Authorization": f"Bearer {bearer or _token(stack, user)}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode(), response.headers
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode(), exc.headers


def _force(
    stack: Stack, user: str, key: str, token: int, query: str = "", bearer: str = ""
) -> tuple[int, str]:
    body = urllib.parse.urlencode({"lock_key": key, "fencing_token": str(token), "confirm": "yes"}).encode()
    request = urllib.request.Request(
        f"{stack.url}/volcano-locks/release{query}",
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Authorization": f"Bearer {bearer or _token(stack, user)}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def _volcano_calls(conn: VolcanoConn, key: str) -> int:
    return sum(1 for e in conn.requests() if str(e["path"]).startswith(f"/locks/{key}"))


def _refusals(stack: Stack, user: str, key: str) -> list[dict[str, Any]]:
    rows = stack.query(
        "SELECT owner, extra FROM log WHERE event = 'volcano_lock_force_release_refused' AND owner = ?", user
    )
    return [json.loads(extra) for _, extra in rows if json.loads(extra)["lock_key"] == key]


def _record(key: str, token: int, dag_id: str) -> HolderRecord:
    return HolderRecord(
        lock_key=key,
        fencing_token=token,
        ttl=900,
        acquired_at="2026-01-01T00:00:00+00:00",
        hostname="forged",
        dag_id=dag_id,
        run_id="forged",
        task_id="hold",
        map_index=-1,
        try_number=1,
    )


def _forge(stack: Stack, key: str, token: int, dag_id: str, value: str | None = None) -> None:
    """Write a holder Variable through the REST API (default: an unsealed record naming ``dag_id``)."""
    admin = _token(stack, "admin")
    text = value if value is not None else json.dumps(_record(key, token, dag_id).facts())
    variable = {"key": HOLDER_PREFIX + key, "value": text}
    try:
        stack.rest("POST", "/api/v2/variables", variable, token=admin)
    except urllib.error.HTTPError as exc:
        assert exc.code == 409, exc.code  # written by an earlier test: write it again
        stack.rest("PATCH", f"/api/v2/variables/{urllib.parse.quote(variable['key'])}", variable, token=admin)


def test_edit_on_one_dag_cannot_force_release_another_dags_lock(
    stack: Stack, held: dict[str, LockLease], keys: dict[str, str], session_conn: VolcanoConn
) -> None:
    b = held["b"]
    before = _volcano_calls(session_conn, keys["b"])
    attempts = [("no record", "")]
    status, text = _force(stack, "edit_a", keys["b"], b.fencing_token)
    assert status == 403 and "may not edit every DAG" in text, text
    ring = Keyring.of(session_conn.service_key)
    forgeries = {
        "an unsealed record naming board_a": None,
        # a genuine seal, but of lock A's record: bound to another lock, so it opens for nothing else
        "lock A's sealed record copied": json.dumps(
            sealed(ring, _record(keys["a"], b.fencing_token, "board_a"))
        ),
    }
    for what, value in forgeries.items():
        _forge(stack, keys["b"], b.fencing_token, "board_a", value)
        for query in ("", "?dag_id=board_a"):
            attempts.append((what, query))
            status, text = _force(stack, "edit_a", keys["b"], b.fencing_token, query)
            assert status == 403, (what, query, text)
            assert "may not edit every DAG" in text and "stays held" in text, (what, text)
    # B's real holder record, sealed and bound to B's lease: now edit on board_b is what it takes
    real = json.dumps(sealed(ring, _record(keys["b"], b.fencing_token, "board_b")))
    _forge(stack, keys["b"], b.fencing_token, "board_b", real)
    attempts.append(("the sealed record naming board_b", ""))
    status, text = _force(stack, "edit_a", keys["b"], b.fencing_token)
    assert status == 403 and "may not edit DAG &#x27;board_b&#x27;" in text, text
    assert _volcano_calls(session_conn, keys["b"]) == before  # decided before any request to Volcano
    with VolcanoLocks(session_conn.url, service_key=session_conn.service_key) as client:
        assert client.get(keys["b"]).fencing_token == b.fencing_token
    refused = _refusals(stack, "edit_a", keys["b"])
    assert len(refused) == len(attempts), refused
    assert all(r["fencing_token"] == b.fencing_token for r in refused)
    assert [r["needed"] for r in refused].count("edit on DAG 'board_b'") == 1


def test_edit_on_the_sealed_holders_dag_is_enough(
    stack: Stack, keys: dict[str, str], session_conn: VolcanoConn
) -> None:
    """A lock no DAG names, held by a board_a task whose record is sealed: edit_a sees it and may end it."""
    key = f"{keys['a']}-sealed"
    ring = Keyring.of(session_conn.service_key)
    with VolcanoLocks(session_conn.url, service_key=session_conn.service_key) as client:
        lease = client.acquire(key, 120)
        try:
            record = json.dumps(sealed(ring, _record(key, lease.fencing_token, "board_a")))
            _forge(stack, key, lease.fencing_token, "board_a", record)
            status, page, _ = _get(stack, "/volcano-locks/board", "edit_a")
            assert status == 200 and key in page and "Force release…" in page
            status, page, _ = _get(stack, "/volcano-locks/board", "read_a")
            assert status == 200 and key in page and "Force release…" not in page
            status, text = _force(stack, "edit_a", key, lease.fencing_token)
            assert status == 200 and f"Force-released lock <code>{key}</code>" in text, text
            assert not client.get(key).held
        finally:
            client.release(key, lease)
    done = stack.query(
        "SELECT owner, dag_id, run_id FROM log WHERE event = 'volcano_lock_force_release' AND extra LIKE ?",
        f'%"{key}"%',
    )
    assert done == [("edit_a", "board_a", "forged")], done


def test_read_on_one_dag_shows_only_that_dags_locks_with_any_dag_id(
    stack: Stack, held: dict[str, LockLease], keys: dict[str, str]
) -> None:
    _forge(stack, keys["b"], held["b"].fencing_token, "board_a")  # does not make B board_a's either
    for query in ("", "?dag_id=board_a"):
        status, text, _ = _get(stack, f"/volcano-locks/api/locks{query}", "read_a")
        assert status == 200, text
        shown = {lock["lock_key"] for lock in json.loads(text)["locks"]}
        assert keys["a"] in shown and keys["b"] not in shown, (query, shown)
        assert all(lock["named_by"] in ([], ["board_a"]) for lock in json.loads(text)["locks"]), text
        status, page, _ = _get(stack, f"/volcano-locks/board{query}", "read_a")
        assert status == 200 and keys["a"] in page and keys["b"] not in page, query
        assert "Force release" not in page  # read only: no button
    for query in ("?dag_id=board_b", "?dag_id=no_such_dag"):
        for path in (
            "/volcano-locks/api/locks",
            "/volcano-locks/board",
            f"/volcano-locks/confirm?lock_key={keys['b']}&",
        ):
            status, text, _ = _get(stack, path + query.replace("?", "" if "?" in path else "?"), "read_a")
            assert status == 403 and query.split("=")[1] in text, (path, query, status, text)
    status, page, _ = _get(stack, f"/volcano-locks/confirm?lock_key={keys['b']}", "read_a")
    assert status == 200 and "it needs edit on a DAG" in page and "fencing token" not in page
    status, page, _ = _get(stack, "/volcano-locks/board?dag_id=board_b", "admin")
    assert status == 200 and keys["b"] in page and keys["a"] not in page  # the filter narrows for admins too


def test_refused_force_releases_cost_volcano_nothing(
    stack: Stack, held: dict[str, LockLease], keys: dict[str, str], session_conn: VolcanoConn
) -> None:
    bearer = _token(stack, "read_a")
    before_calls = _volcano_calls(session_conn, keys["a"])
    before_audit = len(_refusals(stack, "read_a", keys["a"]))
    for _ in range(REFUSALS):
        status, _text = _force(stack, "read_a", keys["a"], held["a"].fencing_token, bearer=bearer)
        assert status == 403
        status, page, _ = _get(stack, f"/volcano-locks/confirm?lock_key={keys['a']}", "read_a", bearer)
        assert status == 200 and "it needs edit on a DAG" in page  # nor does its confirmation page read
    assert _volcano_calls(session_conn, keys["a"]) - before_calls == 0
    assert len(_refusals(stack, "read_a", keys["a"])) - before_audit == REFUSALS


def test_every_board_response_may_be_framed_only_by_airflow(stack: Stack, keys: dict[str, str]) -> None:
    for path, user in (
        ("/volcano-locks/board", "admin"),
        ("/volcano-locks/api/locks", "admin"),
        (f"/volcano-locks/confirm?lock_key={keys['a']}", "admin"),
        ("/volcano-locks/ti/board_a/r/hold/-1", "admin"),
        ("/volcano-locks/board?dag_id=board_b", "read_a"),
    ):
        status, _text, headers = _get(stack, path, user)
        assert status in (200, 403), (path, status)
        assert headers["Content-Security-Policy"] == "frame-ancestors 'self'", path
        assert headers["X-Frame-Options"] == "SAMEORIGIN", path


def test_a_release_is_tied_to_the_confirmed_lease(
    stack: Stack, session_conn: VolcanoConn, keys: dict[str, str], held: dict[str, LockLease]
) -> None:
    """Admin (edit on every DAG) confirmed lease N; the lock changed hands to N+1: nothing is released."""
    key = f"{keys['a']}-handover"
    with VolcanoLocks(session_conn.url, service_key=session_conn.service_key) as client:
        first = client.acquire(key, 60)
        client.release(key, first)
        second = client.acquire(key, 60)
        try:
            status, text = _force(stack, "admin", key, first.fencing_token)
            assert (
                status == 200 and "Nothing released" in text and f"held with {second.fencing_token}" in text
            )
            assert client.get(key).fencing_token == second.fencing_token
            status, text = _force(stack, "admin", key, second.fencing_token)
            assert (
                status == 200
                and f"Force-released lock <code>{key}</code> (fencing token {second.fencing_token})" in text
            )
            assert not client.get(key).held
        finally:
            client.release(key, second)
    done = stack.query("SELECT owner, extra FROM log WHERE event = 'volcano_lock_force_release'")
    assert [
        json.loads(e)["fencing_token"] for o, e in done if o == "admin" and json.loads(e)["lock_key"] == key
    ] == [second.fencing_token]
