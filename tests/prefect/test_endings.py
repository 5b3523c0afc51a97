"""Runs that end the way they went: refused releases, raising bodies, retries, the view after every
ending (release, refused release, crash, force release), two projects on one lock name, skips marked."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
from prefect.events.worker import EventsWorker

from prefect_volcano import (
    LOCK_RESOURCE_PREFIX,
    SKIPPED_TAG,
    VolcanoCredentials,
    current_lease,
    locked_task,
    refresh_lock_view,
)
from tests.prefect.helpers import FLOWS_DIR, PROJECT, collecting_flow, lock_events, run_logs, token_task
from tests.prefect.test_board import CRASH_HOLDER, current_view, view_once
from volcano_locks import VolcanoLocks
from volcano_locks.server.harness import LocalServer

pytestmark = pytest.mark.usefixtures("volcano_env")


@pytest.fixture
def faulty(volcano_server: LocalServer) -> Any:
    """The session's lock server, its faults cleared after the test."""
    try:
        yield volcano_server
    finally:
        volcano_server.set_faults(None)


def _view_state(key: str, project: str = PROJECT) -> str | None:
    view = current_view(key) if project == PROJECT else None
    return None if view is None else str(view["record"].get("state"))


# --------------------------------------------------------------------------- releases that do not go through


def test_a_rate_limited_release_leaves_the_task_completed_with_its_result(
    faulty: LocalServer, unique_key: str
) -> None:
    faulty.set_faults("status=429:op=release:count=1")
    f, states = collecting_flow(token_task(unique_key))
    f()
    (state,) = states
    assert state.is_completed() and state.name == "Completed"
    token = state.result()
    assert isinstance(token, int) and token > 0
    logs = run_logs(state)
    assert "was refused at first" in logs and "released on attempt 2" in logs
    assert "Released lock" in logs
    with VolcanoLocks() as client:
        assert client.get(unique_key).held is False
    view_once(unique_key, "free", token)


def test_an_unanswered_release_lapses_with_a_warning_and_the_view_says_so(
    faulty: LocalServer, unique_key: str
) -> None:
    faulty.set_faults("drop:op=release")
    f, states = collecting_flow(token_task(unique_key, ttl=5))
    f()
    faulty.set_faults(None)
    (state,) = states
    assert state.is_completed(), state
    token = state.result()
    logs = run_logs(state)
    assert "left to lapse at its expiry" in logs and "Released lock" not in logs
    view_once(unique_key, "lapsing", token)
    events = lock_events(unique_key, ["acquired", "lapsing"])
    assert [e.event for e in events][-1] == "volcano.lock.lapsing"
    # One look after the lease lapsed (TTL 5 plus the grace second) sets the view right.
    time.sleep(6.5)
    assert refresh_lock_view(unique_key).held is False
    assert _view_state(unique_key) == "free"


# ------------------------------------------------------------------------------------ bodies that raise


def test_a_raising_body_is_released_and_told(unique_key: str) -> None:
    @task
    @locked_task(unique_key)
    def boom() -> None:
        raise ValueError("the body failed")

    f, states = collecting_flow(boom)
    f()
    (state,) = states
    assert state.is_failed()
    logs = run_logs(state)
    assert "Released lock" in logs
    events = lock_events(unique_key, ["acquired", "released"])
    token = events[-1].payload["fencing_token"]
    assert [e.event for e in events] == ["volcano.lock.acquired", "volcano.lock.released"]
    assert current_view(unique_key)["record"]["state"] == "free"  # type: ignore[index]
    assert current_view(unique_key)["record"]["fencing_token"] == str(token)  # type: ignore[index]


def test_a_retried_task_leaves_no_false_alarm(unique_key: str, caplog: pytest.LogCaptureFixture) -> None:
    attempts: list[int] = []

    @locked_task(unique_key)
    @task(retries=1, retry_delay_seconds=0)
    def flaky() -> int:
        attempts.append(current_lease().fencing_token)
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")
        return current_lease().fencing_token

    f, states = collecting_flow(flaky)
    with caplog.at_level(logging.WARNING):
        f()
    (state,) = states
    assert state.is_completed() and state.result() == attempts[1] > attempts[0]
    logs = run_logs(state)
    assert "still recorded as held" not in logs and "still recorded as held" not in caplog.text
    events = [e.event for e in lock_events(unique_key, ["acquired", "released"])]
    assert "volcano.lock.lapsed" not in events
    assert events.count("volcano.lock.released") == 2
    view_once(unique_key, "free", attempts[1])


# ----------------------------------------------------------------------------- the view after each ending


def test_the_view_is_free_within_one_look_after_a_force_release(unique_key: str) -> None:
    inside, done = threading.Event(), threading.Event()

    @task
    @locked_task(unique_key, ttl=30)
    def hold() -> int:
        inside.set()
        done.wait(30)
        return current_lease().fencing_token

    f, _states = collecting_flow(hold)
    runner = threading.Thread(target=f)
    runner.start()
    try:
        assert inside.wait(30)
        with VolcanoLocks() as admin:
            token = admin.get(unique_key).fencing_token
            view_once(unique_key, "held", token)
            admin.force_release(unique_key)
        assert refresh_lock_view(unique_key).held is False  # one look
        assert _view_state(unique_key) == "free"
    finally:
        done.set()
        runner.join(60)


def test_the_view_is_free_within_one_look_after_its_holder_crashed(
    unique_key: str, prefect_subprocess_env: dict[str, str]
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
            token = line.split()[1]
            view_once(unique_key, "held", token)
        finally:
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(30)
    time.sleep(6.5)  # TTL 5, then the grace second: the lease lapsed
    assert refresh_lock_view(unique_key).held is False
    view = current_view(unique_key)
    assert view is not None and view["record"]["state"] == "free"
    assert "crashed" in view["record"]["note"]


def test_a_look_while_the_holder_lives_changes_nothing(unique_key: str) -> None:
    with VolcanoLocks() as client, client.with_lock(unique_key, 30):
        refresh_lock_view(unique_key)
        assert current_view(unique_key) is None  # no record to correct, none written


# ------------------------------------------------------------------------- two projects, one lock name


def test_two_projects_sharing_a_lock_name_keep_apart(
    volcano_server: LocalServer, unique_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = VolcanoCredentials(api_url=volcano_server.url, service_key=volcano_server.mint_key("other"))
    inside = threading.Barrier(2, timeout=30)

    def holder(credentials: VolcanoCredentials | None) -> Any:
        @task
        @locked_task(unique_key, credentials=credentials, on_contention="fail")
        def hold() -> int:
            inside.wait()  # both hold the same name at once: different projects, different locks
            return current_lease().fencing_token

        return hold

    ours, our_states = collecting_flow(holder(None))
    theirs, their_states = collecting_flow(holder(other))
    threads = [threading.Thread(target=ours), threading.Thread(target=theirs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert our_states[0].is_completed() and their_states[0].is_completed()
    for project in (PROJECT, "other"):
        events = lock_events(unique_key, ["acquired", "released"], project=project)
        assert [e.event for e in events] == ["volcano.lock.acquired", "volcano.lock.released"]
        assert {e.resource["volcano.project"] for e in events} == {project}
    logs = run_logs(our_states[0]) + run_logs(their_states[0])
    assert "still recorded as held" not in logs
    assert current_view(unique_key)["record"]["project"] == PROJECT  # type: ignore[index]


# ---------------------------------------------------------------------------------------- skips marked


def test_a_skip_tags_its_flow_run(unique_key: str) -> None:
    f, states = collecting_flow(token_task(unique_key, on_contention="skip"))
    with VolcanoLocks() as other, other.with_lock(unique_key, 30):
        f()
    (state,) = states
    assert state.is_completed() and (state.message or "").startswith("Skipped: ")
    with get_client(sync_client=True) as client:
        task_run = client.read_task_run(state.state_details.task_run_id)  # type: ignore[arg-type]
        flow_run = client.read_flow_run(task_run.flow_run_id)  # type: ignore[arg-type]
    assert SKIPPED_TAG in flow_run.tags
    assert flow_run.state is not None and flow_run.state.name == "Completed"


def test_a_run_that_did_the_work_is_not_marked(unique_key: str) -> None:
    @flow
    def work() -> int:
        return int(token_task(unique_key)())

    state = work(return_state=True)
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(state.state_details.flow_run_id)  # type: ignore[arg-type]
    assert SKIPPED_TAG not in flow_run.tags


# ------------------------------------------------------------------------------------ runs that end clean

ENDINGS = CRASH_HOLDER.with_name("endings_script.py")


# What a run's own outcome prints: Prefect's report of a body's deliberate failure, and of a loss
# (a force release fails the task, as documented). Anything else at ERROR, or any other traceback, is
# noise around the lock.
_OUTCOMES = ("deliberate failure", "OwnershipLost", "ownership lost", "Lost ownership of lock")


def _noise(output: str) -> list[str]:
    """ERROR lines and tracebacks that are not a run's own outcome."""
    noise = []
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" in line:
            block = lines[i : i + 80]
            end = next((b for b in block[1:] if b and not b.startswith((" ", "\t"))), "")
            if not any(o in end for o in _OUTCOMES):
                noise.append("\n".join(block[:20]))
        elif any(n in line for n in ("Error emitting event", "atexit")) or (
            "ERROR" in line and not any(o in line for o in _OUTCOMES)
        ):
            noise.append(line)
    return noise


def test_every_ending_runs_clean(unique_key: str, prefect_subprocess_env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, str(ENDINGS), unique_key],
        env=prefect_subprocess_env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "DONE" in proc.stdout, output
    assert "RAISES Failed" in proc.stdout and "SKIPPED True" in proc.stdout
    assert "FORCED Failed" in proc.stdout  # the loss fails the task, as documented
    assert "KILLED Completed" in proc.stdout  # the next run after a kill -9'd holder
    assert _noise(output) == [], output
    for suffix in ("retried", "raises", "skip", "forced"):
        events = [e.event for e in lock_events(f"{unique_key}:{suffix}", [])]
        assert "volcano.lock.lapsed" not in events, (suffix, events)
    # The killed holder's lease did lapse: a `lapsed` event there is true (whether one is emitted depends
    # on whether its view was written before the kill), so that key is not checked.


def _lapsed_under(marker: str) -> list[str]:
    """Locks whose name holds `marker` that had a `lapsed` event (none was ever killed or lost)."""
    EventsWorker.drain_all(timeout=10)
    with get_client(sync_client=True) as client:
        page = client.read_events(
            EventFilter(
                event=EventNameFilter(name=["volcano.lock.lapsed"]),
                resource=EventResourceFilter(id_prefix=[LOCK_RESOURCE_PREFIX]),
            ),
            limit=50,  # the newest first: this test's own are among them
        )
    return [e.resource.id for e in page.events if marker in e.resource.id]


def _run_example(example: str, args: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run(
        [sys.executable, str(FLOWS_DIR / f"{example}.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    return output


@pytest.mark.parametrize("example", sorted(p.stem for p in FLOWS_DIR.glob("*.py") if p.stem != "fenced_lake"))
def test_every_example_runs_clean(
    example: str, unique_key: str, prefect_subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """Each locked example of flows/ as its users run it (a script), free and then held elsewhere:
    no ERROR line, no traceback, no `lapsed` event."""
    env = dict(prefect_subprocess_env, VOLCANO_EXAMPLES_DB=str(tmp_path / "examples.sqlite3"))
    args = [f"{unique_key}-eu", f"{unique_key}-us"] if example == "regional_fanout" else [unique_key]
    output = _run_example(example, args, env)
    held = {"leader_rollup": f"rollup:{unique_key}", "nightly_pipeline": f"nightly:{unique_key}"}.get(example)
    if held is not None:  # its skip path, beside a holder in this process
        with VolcanoLocks() as other, other.with_lock(held, 30):
            skipped = _run_example(example, args, env)
        assert "Skipped" in skipped or "skipped" in skipped, skipped
        output += skipped
    assert _noise(output) == [], output
    assert _lapsed_under(unique_key) == []


@pytest.mark.parametrize("example_stores", ["sqlite"], indirect=True)
def test_the_fenced_lake_example_runs_clean(
    unique_key: str, prefect_subprocess_env: dict[str, str], example_stores: Any
) -> None:
    output = _run_example("fenced_lake", [unique_key], dict(prefect_subprocess_env, **example_stores.env))
    assert _noise(output) == [], output
    assert _lapsed_under(unique_key) == []
