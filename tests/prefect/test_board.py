"""The lock's current view (its keyed artifact), the lapse a crashed holder leaves, and skipped runs in
the runs lists, all read back from the Prefect API the UI reads."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import prefect.server
import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactCollectionFilter,
    ArtifactCollectionFilterKey,
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateName,
)
from prefect.flow_engine import run_flow
from prefect.states import Completed

from prefect_volcano import (
    ARTIFACT_KEY_PREFIX,
    VolcanoCredentials,
    artifact_key,
    current_lease,
    is_skipped,
    locked_flow,
    locked_task,
)
from prefect_volcano._board import LockBoard, RunFacts
from prefect_volcano._report import LossReport
from tests.prefect.helpers import PROJECT, assert_no_secret, lock_events, related_ids, token_flow
from volcano_locks import ErrorCode, LeaseFacts, LockLease, OwnershipLost, VolcanoLocks

pytestmark = pytest.mark.usefixtures("volcano_env")

CRASH_HOLDER = Path(__file__).with_name("crash_holder.py")
UI_ASSETS = Path(prefect.server.__file__).with_name("ui") / "assets"


def view_once(lock_key: str, state: str, fencing_token: object, bound: float = 15.0) -> dict[str, Any]:
    """The lock's view once it says ``state`` for ``fencing_token``: the board is written beside the
    body, not before it, so a look from inside the body may come a moment before the record."""
    ends = time.monotonic() + bound
    while True:
        view = current_view(lock_key)
        record = view["record"] if view else {}
        if record.get("state") == state and record.get("fencing_token") == str(fencing_token):
            return view  # type: ignore[return-value]
        if time.monotonic() > ends:
            raise AssertionError(f"the view never said {state} for fencing token {fencing_token}: {view}")
        time.sleep(0.1)


def current_view(lock_key: str) -> dict[str, Any] | None:
    """The lock's latest artifact as the Artifacts page lists it: metadata, markdown, description."""
    with get_client(sync_client=True) as client:
        found = client.read_latest_artifacts(
            artifact_filter=ArtifactCollectionFilter(
                key=ArtifactCollectionFilterKey(any_=[artifact_key(lock_key, PROJECT)])
            ),
            limit=1,
        )
    if not found:
        return None
    return {
        "record": found[0].metadata_ or {},
        "markdown": found[0].data,
        "description": found[0].description,
    }


# ------------------------------------------------------------------------------------- key grammar


@pytest.mark.parametrize(
    "lock_key",
    ["rollup:EU", "rollup-eu", "Rollup:eu", "a.b_c:d", "x" * 128, "::", "nightly:2026-01-01"],
)
def test_artifact_keys_fit_prefects_grammar_and_keep_keys_apart(lock_key: str) -> None:
    from prefect.client.schemas.actions import ArtifactCreate

    key = artifact_key(lock_key, PROJECT)
    assert re.fullmatch(r"[a-z0-9-]+", key) and key.startswith(ARTIFACT_KEY_PREFIX)
    ArtifactCreate(key=key)  # Prefect's own validation accepts it
    others = {"rollup:EU", "rollup-eu", "Rollup:eu"} - {lock_key}
    assert key not in {artifact_key(o, PROJECT) for o in others}


def test_a_loss_before_the_local_deadline_is_a_force_release() -> None:
    lease = LockLease("k", "secret-token", Completed().timestamp, 3, 30, Completed().timestamp, 100.0, 1e9)
    refused = OwnershipLost("renew failed", status=409, code=ErrorCode.OWNERSHIP_LOST)
    assert LossReport.force_released(refused, lease, now=99.0)
    assert not LossReport.force_released(refused, lease, now=100.0)  # it may have expired
    stalled = OwnershipLost("stalled", code=ErrorCode.RENEWAL_STALLED)
    assert not LossReport.force_released(stalled, lease, now=50.0)
    assert not LossReport.force_released(refused, None, now=50.0)


# ------------------------------------------------------------------------------------ current view


def test_the_current_view_names_the_holder_run_while_held_and_says_free_after(
    unique_key: str, credentials: VolcanoCredentials
) -> None:
    seen: dict[str, Any] = {}

    @locked_task(unique_key, ttl=30)
    @task
    def job() -> int:
        seen["view"] = view_once(unique_key, "held", current_lease().fencing_token)
        return current_lease().fencing_token

    @flow
    def owner() -> Any:
        return job(return_state=True)

    flow_state = owner(return_state=True)
    task_state = flow_state.result()
    token = task_state.result()
    held = seen["view"]["record"]
    assert held["state"] == "held" and held["fencing_token"] == str(token)
    assert held["flow_run_id"] == str(flow_state.state_details.flow_run_id)
    assert held["task_run_id"] == str(task_state.state_details.task_run_id)
    assert held["lock_key"] == unique_key and held["ttl"] == "30"
    assert held["acquired_at"] <= held["expires_at"]
    assert "**held**" in seen["view"]["markdown"] and held["flow_run_name"] in seen["view"]["markdown"]

    after = view_once(unique_key, "free", token)  # recorded beside the run's end, not before it
    text = json.dumps([seen["view"], after])
    assert credentials.service_key.get_secret_value() not in text
    assert credentials.anon_key is not None and credentials.anon_key.get_secret_value() not in text


def test_a_waiting_run_names_the_holding_flow_run(unique_key: str, caplog: pytest.LogCaptureFixture) -> None:
    inside, leave = threading.Event(), threading.Event()

    @locked_task(unique_key, ttl=30, wait_timeout=60)
    @task
    def job(hold: bool) -> int:
        if hold:
            inside.set()
            leave.wait(30)
        return current_lease().fencing_token

    @flow
    def holder() -> Any:
        return job(True, return_state=True)

    @flow
    def waiter() -> int:
        timer = threading.Timer(2.0, leave.set)
        timer.start()
        try:
            return job(False)
        finally:
            timer.cancel()

    states: list[Any] = []
    thread = threading.Thread(target=lambda: states.append(holder(return_state=True)))
    thread.start()
    try:
        assert inside.wait(30)
        with caplog.at_level(logging.INFO):
            waiter()
    finally:
        leave.set()
        thread.join(30)
    holder_run = str(states[0].state_details.flow_run_id)
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Waiting for lock")]
    assert len(waits) == 1 and ", held by flow run '" in waits[0], waits
    assert f"({holder_run})" in waits[0] and "fencing token" in waits[0], waits


# -------------------------------------------------------------------------------- crashed holder


def test_a_sigkilled_holder_leaves_a_lapsed_event_naming_its_token_and_flow_run(
    unique_key: str, prefect_subprocess_env: dict[str, str], credentials: VolcanoCredentials
) -> None:
    with subprocess.Popen(
        [sys.executable, str(CRASH_HOLDER), unique_key],
        env=prefect_subprocess_env,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None
            line = holder.stdout.readline()
            assert line.startswith("HOLDING"), line
            _, token, holder_run = line.split()
            view = view_once(unique_key, "held", token)
            assert view["record"]["flow_run_id"] == holder_run
        finally:
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(30)
    assert holder.returncode == -signal.SIGKILL

    ours = token_flow(unique_key, ttl=10, wait_timeout=60)()  # the successor
    assert ours > int(token)
    events = lock_events(unique_key, ["lapsed", "acquired"])
    (lapsed,) = [e for e in events if e.event == "volcano.lock.lapsed"]
    assert lapsed.payload["previous_fencing_token"] == int(token)
    assert lapsed.payload["previous_flow_run_id"] == holder_run
    assert lapsed.payload["how"] == "expired"
    assert related_ids(lapsed, "previous-holder") == [f"prefect.flow-run.{holder_run}"]
    # The successor's own acquisition follows the lapse it told.
    names = [e.event for e in events]
    assert names.index("volcano.lock.lapsed") < len(names) - 1 - names[::-1].index("volcano.lock.acquired")
    assert_no_secret(events, credentials)
    view = current_view(unique_key)
    assert (
        view is not None
        and view["record"]["state"] == "free"
        and view["record"]["fencing_token"] == str(ours)
    )


def test_a_clean_release_leaves_no_lapse(unique_key: str) -> None:
    @locked_task(unique_key, ttl=10)
    @task
    def job() -> int:
        return current_lease().fencing_token

    @flow
    def twice() -> list[int]:
        return [job(), job()]

    first, second = twice()
    assert second > first
    events = lock_events(unique_key, ["acquired", "released"])
    assert "volcano.lock.lapsed" not in [e.event for e in events]


# ---------------------------------------------------------------------------- skipped in run lists


def deployment_runs_tab_state_names() -> list[str]:
    """The state names the Prefect UI's deployment Runs tab filters on, read from the shipped UI bundle.

    Deployment-*.js builds the tab's filter as `flowRuns: {state: {name: O.filter(e => e !== "Scheduled")}}`
    over the UI's list of known state names (the one that starts with Scheduled, Late).
    """
    (page,) = UI_ASSETS.glob("Deployment-*.js")
    assert "flowRuns:{state:{name:" in page.read_text() and "filter(e=>e!==`Scheduled`)" in page.read_text()
    lists = []
    for bundle in UI_ASSETS.glob("index-*.js"):
        lists += re.findall(r"=\[(`Scheduled`,`Late`,[^\]]*)\]", bundle.read_text())
    assert lists, "the UI's list of state names was not found"
    names = [n.strip("`") for n in lists[0].split(",")]
    return [n for n in names if n != "Scheduled"]


def test_a_skipped_flow_run_is_listed_by_the_deployment_runs_tab_filter(unique_key: str) -> None:
    names = deployment_runs_tab_state_names()
    assert "Skipped" not in names  # why a state named Skipped was hidden there

    @locked_flow(unique_key, on_contention="skip")
    @flow(name=f"skipper-{unique_key[-12:]}")
    def skipper() -> str:
        return "body ran"

    with get_client(sync_client=True) as client:
        flow_id = client.create_flow(skipper)
        deployment_id = client.create_deployment(flow_id=flow_id, name="runs-tab", entrypoint="x.py:skipper")
        flow_runs = [client.create_flow_run_from_deployment(deployment_id) for _ in range(2)]
    with VolcanoLocks() as other, other.with_lock(unique_key, 30):
        skipped_state = run_flow(skipper, flow_run=flow_runs[0], return_type="state")
    ran_state = run_flow(skipper, flow_run=flow_runs[1], return_type="state")
    assert is_skipped(skipped_state) and skipped_state.name in names
    assert "did not run" in (skipped_state.message or "")
    assert not is_skipped(ran_state) and ran_state.result() == "body ran"

    with get_client(sync_client=True) as client:
        listed = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(name=FlowRunFilterStateName(any_=names))),
        )
    by_id = {run.id: run for run in listed}
    assert set(by_id) == {flow_runs[0].id, flow_runs[1].id}
    shown = by_id[flow_runs[0].id].state
    assert shown is not None and is_skipped(shown) and shown.message == skipped_state.message


# ------------------------------------------------------------------ the record's rules, on the real API


def test_a_release_buried_by_a_waiters_copy_of_the_held_record_is_no_lapse(unique_key: str) -> None:
    """A waiting run copies the holder's record to add its ETA; the holder's release lands between the
    copy's read and its write, so the latest record says "held" again. The next holder finds the
    release in the lock's history: no lapse is reported."""
    t0 = datetime.now(UTC)
    old_lease = LeaseFacts(unique_key, 3, t0, t0 + timedelta(seconds=30), 30)
    new_lease = LeaseFacts(unique_key, 4, t0 + timedelta(seconds=2), t0 + timedelta(seconds=32), 30)
    old = LockBoard(unique_key, PROJECT, RunFacts(flow_run_id=str(uuid.uuid4()), flow_run_name="old-holder"))
    old.held(old_lease)
    waiter = LockBoard(unique_key, PROJECT, RunFacts(flow_run_name="waiter"))
    read_by_the_waiter = waiter.read()
    assert read_by_the_waiter is not None and read_by_the_waiter["state"] == "held"
    old.released(old_lease)  # lands here, between the waiter's read and its write
    buried = {**read_by_the_waiter, "waiting": "waiter: expected to start in about 1 s"}
    waiter._create(buried, "the waiter's copy")  # what `waiting` writes after its read
    latest = waiter.read()
    assert latest is not None and latest["state"] == "held" and latest["fencing_token"] == "3"

    sleeps: list[float] = []
    board = LockBoard(unique_key, PROJECT, RunFacts(flow_run_name="new-holder"), sleeper=sleeps.append)
    assert board.released_earlier(3) and not board.released_earlier(4)
    assert board.previous_holder(new_lease) is None
    assert sleeps == [1.0]  # one re-read, then the history


def test_a_release_recorded_during_the_recheck_is_no_lapse_and_a_late_release_is_dropped(
    unique_key: str,
) -> None:
    t0 = datetime.now(UTC)
    old_lease = LeaseFacts(unique_key, 3, t0, t0 + timedelta(seconds=30), 30)
    early = LeaseFacts(unique_key, 4, t0 + timedelta(seconds=5), t0 + timedelta(seconds=35), 30)
    late = LeaseFacts(unique_key, 4, t0 + timedelta(seconds=40), t0 + timedelta(seconds=70), 30)
    old = LockBoard(unique_key, PROJECT, RunFacts(flow_run_id=str(uuid.uuid4()), flow_run_name="old-holder"))

    first = f"{unique_key}-a"  # a lock of its own: a released lease is never held again
    first_old = LockBoard(first, PROJECT, RunFacts(flow_run_id=str(uuid.uuid4()), flow_run_name="old-holder"))
    first_old.held(old_lease)
    releasing = LockBoard(first, PROJECT, RunFacts(), sleeper=lambda _s: first_old.released(old_lease))
    assert releasing.previous_holder(early) is None  # its release landed while we re-checked

    old.held(old_lease)
    sleeps: list[float] = []
    board = LockBoard(unique_key, PROJECT, RunFacts(flow_run_name="new-holder"), sleeper=sleeps.append)
    before = board.previous_holder(early)
    assert before is not None and sleeps == [1.0, 2.0, 4.0]  # re-read while a release may still land
    assert before["how"] == "ended before its expiry" and before["flow_run_name"] == "old-holder"
    after = board.previous_holder(late)
    assert after is not None and after["how"] == "expired" and after["fencing_token"] == "3"
    assert sleeps == [1.0, 2.0, 4.0, 1.0]  # past its expiry: one re-read

    board.held(late)
    old.released(old_lease)  # recorded after the new acquisition: dropped
    old.lost(old_lease, "lost: lock_ownership_lost")
    view = current_view(unique_key)
    assert view is not None and view["record"]["state"] == "held" and view["record"]["fencing_token"] == "4"
    assert view["record"]["flow_run_name"] == "new-holder"


def test_an_unreachable_prefect_api_never_fails_the_lock(
    unique_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> Any:
        raise httpx.ConnectError("no Prefect API here")

    board = LockBoard(unique_key, PROJECT, RunFacts(), client=broken)
    now = datetime.now(UTC)
    lease = LeaseFacts(unique_key, 1, now, now + timedelta(seconds=30), 30)
    with caplog.at_level(logging.WARNING, logger="prefect_volcano.board"):
        assert board.read() is None and board.previous_holder(lease) is None
        board.held(lease)
        board.released(lease)
        board.skipped(None)
    warned = [r.getMessage() for r in caplog.records if r.name == "prefect_volcano.board"]
    assert warned and all("Could not" in w and unique_key in w for w in warned)
