"""The "Volcano locks" page and a task instance's Lock tab, in a real browser against a running stack.

One stack (api-server with the UI, dag processor, scheduler with LocalExecutor, triggerer) on a copy of
the session's metadata database, two simple-auth-manager users (``admin``, and ``viewer`` who may read
DAGs but not edit them), the session's local Volcano server. ``board_holder`` holds the lock;
``board_waiter_deferred`` then ``board_waiter_slot`` wait for it (in the triggerer, in a worker slot).
The page must show the holder's task try and the two waiters in that order, the waiter's Lock tab the
same; the viewer's force release is refused and the lock stays held; the admin's ends the lease, the
holder task fails naming the force release and its author, both waiters then run, and the audit log
has the entry.

Set ``VOLCANO_UPDATE_SCREENSHOTS=1`` to write the screenshots to providers/volcano/docs/images/.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.helpers import (
    CHROMIUM,
    STACK_DAGS,
    Stack,
    VolcanoConn,
    browser_or_skip,
    dag_stack,
    deferral_processed,
    until,
)
from volcano_locks import VolcanoLocks

IMAGES = Path(__file__).resolve().parents[2] / "providers" / "volcano" / "docs" / "images"
USERS = {"admin": "volcano-board-admin", "viewer": "volcano-board-viewer"}

sync_api = browser_or_skip()


@pytest.fixture(scope="module")
def board_key() -> str:
    return f"board-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def stack(airflow_db: Path, session_conn: VolcanoConn, board_key: str, tmp_path_factory) -> Iterator[Stack]:  # type: ignore[no-untyped-def]
    extra = {"VOLCANO_BOARD_KEY": board_key}  # Airflow's default configuration: providers discovered lazily
    with dag_stack(
        airflow_db,
        session_conn,
        tmp_path_factory.mktemp("board"),
        [STACK_DAGS / "volcano_board_dags.py"],
        ["board_holder", "board_waiter_deferred", "board_waiter_slot", "board_short"],
        users={user: (user, password) for user, password in USERS.items()},  # each user's role is its name
        extra_env=extra,
    ) as s:
        yield s


def _state(stack: Stack, dag_id: str) -> str | None:
    rows = stack.query("SELECT state FROM task_instance WHERE dag_id = ?", dag_id)
    return rows[0][0] if rows else None


def _login(browser: Any, url: str, user: str) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(30_000)
    page.goto(f"{url}/plugin/volcano-locks")
    page.get_by_role("button", name="Sign in").wait_for()
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(USERS[user])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/plugin/volcano-locks**")
    return page


def _board_row(page: Any, key: str) -> Any:
    frame = page.frame_locator("iframe[title='Volcano locks']")
    row = frame.locator(f"tr[data-lock='{key}']")
    row.wait_for()
    return frame, row


def _shot(target: Any, name: str) -> None:
    path = IMAGES / name if os.environ.get("VOLCANO_UPDATE_SCREENSHOTS") == "1" else None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    assert target.screenshot(path=str(path) if path else None)[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_board_routes_need_an_airflow_login(stack: Stack) -> None:
    """Airflow mounts plugin apps without authenticating them: every route asks Airflow's auth."""
    import urllib.error

    for method, path in (
        ("GET", "/volcano-locks/board"),
        ("GET", "/volcano-locks/api/locks"),
        ("GET", "/volcano-locks/ti/board_holder/r/hold/-1"),
        ("GET", "/volcano-locks/confirm?lock_key=x"),
        ("POST", "/volcano-locks/release"),
    ):
        with pytest.raises(urllib.error.HTTPError) as refused:
            stack.rest(method, path, {} if method == "POST" else None)
        assert refused.value.code in (401, 403), (method, path, refused.value.code)
        assert refused.value.headers["Content-Security-Policy"] == "frame-ancestors 'self'", path


# A hang catcher for the test and the module's stack teardown after it (pytest-timeout counts both):
# five runs and a browser on a busy two-core machine took 258 s of the default 300.
@pytest.mark.timeout(900)
def test_board_shows_holder_and_waiters_and_force_release_is_guarded(
    stack: Stack, volcano_server: Any, board_key: str
) -> None:
    # Three short holds first: the lock's history, and what its waiters' expected starts rest on.
    shorts = [f"board__short_{n}" for n in range(3)]
    for run_id in shorts:
        stack.cli("dags", "trigger", "board_short", "--run-id", run_id)
    until(
        "the short holds",
        lambda: (
            [s for (s,) in stack.query("SELECT state FROM dag_run WHERE dag_id = 'board_short'")]
            == ["success"] * 3
        ),
        240,
        stack=stack,
    )
    holder_run = "board__holder"
    stack.cli("dags", "trigger", "board_holder", "--run-id", holder_run)
    until(
        "the holder's record",
        lambda: stack.query("SELECT 1 FROM variable WHERE key = ?", f"volcano_lock_holder:{board_key}"),
        stack=stack,
    )
    stack.cli("dags", "trigger", "board_waiter_deferred", "--run-id", "board__first")
    until("the deferred waiter", lambda: _state(stack, "board_waiter_deferred") == "deferred", stack=stack)
    deferral_processed(stack, "board_waiter_deferred", "wait", "board__first")  # the README's Known limits
    stack.cli("dags", "trigger", "board_waiter_slot", "--run-id", "board__second")
    until(
        "the in-slot waiter's marker",
        lambda: stack.query(
            "SELECT 1 FROM xcom WHERE dag_id = 'board_waiter_slot' AND key = 'volcano_waiting'"
        ),
        stack=stack,
    )
    with VolcanoLocks(volcano_server.url, service_key=volcano_server.service_key) as outside:
        held = outside.get(board_key)
    assert held.held and held.fencing_token is not None

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            admin = _login(browser, stack.url, "admin")
            frame, row = _board_row(admin, board_key)
            row.get_by_text("held", exact=True).wait_for()
            text = row.inner_text()
            assert f"fencing token {held.fencing_token}" in text
            assert f"board_holder / {holder_run} / hold try 1" in text
            waiters = row.locator("li.waiter").all_inner_texts()
            assert len(waiters) == 2, waiters
            assert waiters[0].startswith("board_waiter_deferred / board__first / wait try 1 (deferred")
            assert waiters[1].startswith("board_waiter_slot / board__second / wait try 1 (in its worker slot")
            # Each waiter's expected start, from the three short tenures and the holder's time so far.
            assert "expected to start in about" in waiters[0] and "1 in line, from 3 tenures" in waiters[0]
            assert "2 in line, from 3 tenures" in waiters[1], waiters
            # The history: the holder's tenure and the three short ones, each released.
            history = row.locator("details.history")
            assert "3 hand-overs among the last 4 tenures" in history.locator("summary").inner_text()
            history.locator("summary").click()
            tenures = history.locator("tr.tenure").all_inner_texts()
            assert len(tenures) == 4 and f"board_holder / {holder_run} / hold try 1" in tenures[0], tenures
            assert "holding" in tenures[0] and all("released" in t for t in tenures[1:]), tenures
            assert all("board_short / board__short_" in t for t in tenures[1:]), tenures
            _shot(admin, "volcano-lock-board.png")

            # The waiter's Lock tab: the same lock, and its place in line.
            admin.goto(
                f"{stack.url}/dags/board_waiter_slot/runs/board__second/tasks/wait/plugin/volcano-lock"
            )
            tab = admin.frame_locator("iframe[title='Lock']")
            tab.get_by_text("number 2 in line of 2").wait_for()
            tab_row = tab.locator(f"tr[data-lock='{board_key}']")
            assert f"board_holder / {holder_run} / hold try 1" in tab_row.inner_text()
            assert tab_row.locator("li.waiter").all_inner_texts()[0].startswith("board_waiter_deferred")
            _shot(admin, "volcano-lock-tab.png")

            # The viewer may read the board but not force release: no button, and the confirmation
            # page opened by hand says why and offers none either; the lock stays held.
            viewer = _login(browser, stack.url, "viewer")
            _vframe, vrow = _board_row(viewer, board_key)
            assert f"fencing token {held.fencing_token}" in vrow.inner_text()
            assert vrow.get_by_role("button").count() == 0
            viewer.goto(f"{stack.url}/volcano-locks/confirm?lock_key={board_key}")
            viewer.get_by_text("it needs edit on a DAG").wait_for()  # refused before Volcano is asked
            assert viewer.get_by_role("button").count() == 0
            with VolcanoLocks(volcano_server.url, service_key=volcano_server.service_key) as outside:
                assert outside.get(board_key).fencing_token == held.fencing_token

            # The admin confirms after reading what happens, and the lease ends.
            admin.goto(f"{stack.url}/plugin/volcano-locks")
            frame, row = _board_row(admin, board_key)
            row.get_by_role("button", name="Force release…").click()
            frame.get_by_text("fencing rejects its late writes").wait_for()
            _shot(admin, "volcano-lock-force-release.png")
            frame.get_by_role("button", name=f"Force release lease {held.fencing_token}").click()
            frame.get_by_text(
                f"Force-released lock {board_key} (fencing token {held.fencing_token})"
            ).wait_for()
        finally:
            browser.close()

    until("the holder's failure", lambda: _state(stack, "board_holder") == "failed", 90, stack=stack)
    log = stack.logs(holder_run)
    assert "it was force-released by admin" in log, log[-3000:]
    for dag_id in ("board_waiter_deferred", "board_waiter_slot"):
        until(f"{dag_id} to run", lambda d=dag_id: _state(stack, d) == "success", 120, stack=stack)
    # Each waiter's log named the holder try (its provenance record), not just its fencing token.
    named = f"held by board_holder / {holder_run} / hold try 1 on "
    for run_id in ("board__first", "board__second"):
        assert named in stack.logs(run_id), run_id
    audit = stack.query(
        "SELECT owner, dag_id, run_id, extra FROM log WHERE event = 'volcano_lock_force_release'"
    )
    # The entry names the holder from its sealed record, bound to the lease that was released.
    assert len(audit) == 1 and audit[0][:3] == ("admin", "board_holder", holder_run), audit
    assert json.loads(audit[0][3])["fencing_token"] == held.fencing_token
    token = stack.rest("POST", "/auth/token", {"username": "viewer", "password": USERS["viewer"]})[
        "access_token"
    ]
    board = stack.rest("GET", "/volcano-locks/api/locks", token=token)
    named = {lock["lock_key"]: lock for lock in board["locks"]}[f"{board_key}-named"]
    # The history after the force release: the holder's tenure force-released, the waiters' released.
    endings = {
        (t["holder"] or {}).get("dag_id"): t["ending"]
        for t in {lock["lock_key"]: lock for lock in board["locks"]}[board_key]["history"]
    }
    assert endings["board_holder"] == "force-released", endings
    assert endings["board_waiter_deferred"] == endings["board_waiter_slot"] == "released", endings
    assert named["named_by"] == ["board_named"] and named["holder"] is None and not named["waiters"]
    assert volcano_server.service_key not in json.dumps(board)
    for secret in (volcano_server.service_key,):
        assert secret not in log and secret not in json.dumps(audit)
