"""VolcanoLockOperator against the real local server: acquire, skip, fail, defer, resume, loss."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException

from airflow_provider_volcano._tokens import TaskIdentity, derive_token, new_nonce
from airflow_provider_volcano.operators.lock import (
    VolcanoLockContended,
    VolcanoLockLost,
    VolcanoLockOperator,
)
from airflow_provider_volcano.triggers.lock import VolcanoLockTrigger
from tests.airflow.versions import AirflowSkipException, TaskDeferred
from volcano_locks.eta import NO_ESTIMATE, Eta, reporting


class _TI(SimpleNamespace):
    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def _context(task_id: str = "t", try_number: int = 1) -> dict[str, Any]:
    ti = _TI(dag_id="d", task_id=task_id, run_id="manual__x", map_index=-1, try_number=try_number, xcoms={})
    return {"ti": ti}


def _op(key: str, fn: Any = None, **kwargs: Any) -> VolcanoLockOperator:
    return VolcanoLockOperator(
        task_id=kwargs.pop("task_id", "t"), lock_key=key, python_callable=fn or (lambda: "done"), **kwargs
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # The core's own messages: the same bad value reads the same in the core, Airflow and Prefect.
        ({"ttl": 4}, r"invalid ttl 4: expected an integer number of seconds, 5\.\.7776000"),
        ({"ttl": 30.5}, r"invalid ttl 30\.5: expected an integer"),
        ({"on_contention": "queue"}, "on_contention must be one of"),
        ({"wait_timeout": -1}, r"invalid wait_timeout -1: expected None or seconds >= 0"),
        ({"wait_timeout": float("inf")}, r"invalid wait_timeout inf"),
        ({"poll_interval": 0}, r"invalid poll_interval 0: expected seconds > 0"),
    ],
)
def test_bad_arguments_are_rejected_at_construction(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _op("k", **kwargs)


def test_a_literal_lock_key_is_checked_at_parse_time_a_template_when_rendered() -> None:
    with pytest.raises(ValueError, match=r"invalid lock key 'bad key!'"):
        _op("bad key!")
    assert _op("rollup:{{ ds }}").lock_key == "rollup:{{ ds }}"


def test_runs_callable_under_the_lock_and_pushes_public_lease(volcano_conn, outside, unique_key) -> None:
    seen: dict[str, Any] = {}

    def work(x: int, volcano_lease: dict[str, Any]) -> int:
        seen.update(volcano_lease)
        seen["held_during"] = outside.get(unique_key).held
        return x * 2

    ctx = _context()
    result = _op(unique_key, work, op_args=[21]).execute(ctx)
    assert result == 42
    assert seen["held_during"] is True
    lease = ctx["ti"].xcoms["volcano_lease"]
    assert set(lease) == {"lock_key", "fencing_token", "acquired_at", "expires_at", "ttl"}
    assert lease["lock_key"] == unique_key and lease["fencing_token"] == seen["fencing_token"]
    assert outside.get(unique_key).held is False  # released afterwards


def test_releases_when_the_callable_fails(volcano_conn, outside, unique_key) -> None:
    def boom() -> None:
        raise RuntimeError("callable failed")

    with pytest.raises(RuntimeError, match="callable failed"):
        _op(unique_key, boom).execute(_context())
    assert outside.get(unique_key).held is False


@pytest.mark.parametrize(
    ("on_contention", "raised"), [("skip", AirflowSkipException), ("fail", VolcanoLockContended)]
)
def test_skip_and_fail_name_the_lock_and_the_holders_fencing_token(
    volcano_conn, outside, unique_key, on_contention: str, raised: type[Exception]
) -> None:
    held = outside.acquire(unique_key, 30)
    with pytest.raises(raised) as info:
        _op(unique_key, on_contention=on_contention).execute(_context())
    assert unique_key in str(info.value) and f"fencing token {held.fencing_token}" in str(info.value)
    outside.release(unique_key, held)


def test_wait_in_place_times_out_naming_the_holder(volcano_conn, outside, unique_key) -> None:
    held = outside.acquire(unique_key, 30)
    with pytest.raises(VolcanoLockContended, match="Timed out") as info:
        _op(unique_key, deferrable=False, wait_timeout=1.5, poll_interval=0.5).execute(_context())
    assert unique_key in str(info.value)
    outside.release(unique_key, held)


def test_wait_in_place_acquires_after_release(volcano_conn, outside, unique_key) -> None:
    held = outside.acquire(unique_key, 30)
    threading.Timer(1.0, outside.release, (unique_key, held)).start()
    ctx = _context()
    assert _op(unique_key, deferrable=False, wait_timeout=30, poll_interval=0.5).execute(ctx) == "done"
    assert ctx["ti"].xcoms["volcano_lease"]["fencing_token"] > held.fencing_token


def test_deferrable_wait_defers_with_primitive_trigger(volcano_conn, outside, unique_key) -> None:
    held = outside.acquire(unique_key, 30)
    ctx = _context()
    with pytest.raises(TaskDeferred) as info:
        _op(unique_key, deferrable=True, wait_timeout=60, poll_interval=0.5).execute(ctx)
    deferred = info.value
    assert deferred.method_name == "execute_complete"
    assert isinstance(deferred.trigger, VolcanoLockTrigger)
    _, kwargs = deferred.trigger.serialize()
    assert kwargs["lock_key"] == unique_key and kwargs["deadline"] > time.time()
    nonce = kwargs["identity"]["nonce"]
    assert deferred.kwargs == {"deadline": kwargs["deadline"], "nonce": nonce}
    token = derive_token(volcano_conn.service_key, TaskIdentity.from_dict(kwargs["identity"]), unique_key)
    assert token not in repr(kwargs) and volcano_conn.service_key not in repr(kwargs)
    outside.release(unique_key, held)


def test_execute_complete_acquired_resumes_with_the_triggers_lease(volcano_conn, outside, unique_key) -> None:
    # What the trigger does: acquire with the derived token; the task re-acquires the same lease.
    nonce = new_nonce()
    token = derive_token(
        volcano_conn.service_key, TaskIdentity("d", "t", "manual__x", -1, 1, nonce), unique_key
    )
    by_trigger = outside.acquire(unique_key, 30, token=token)
    ctx = _context()
    event = {"status": "acquired", "lock_key": unique_key, "fencing_token": by_trigger.fencing_token}
    assert _op(unique_key).execute_complete(ctx, event, deadline=None, nonce=nonce) == "done"
    assert ctx["ti"].xcoms["volcano_lease"]["fencing_token"] == by_trigger.fencing_token
    assert outside.get(unique_key).held is False


def test_execute_complete_acquired_but_taken_meanwhile_defers_again(
    volcano_conn, outside, unique_key
) -> None:
    held = outside.acquire(unique_key, 30)  # someone else got it between trigger and resume
    event = {"status": "acquired", "lock_key": unique_key, "fencing_token": held.fencing_token - 1}
    deadline = time.time() + 60
    with pytest.raises(TaskDeferred) as info:
        _op(unique_key, deferrable=True).execute_complete(
            _context(), event, deadline=deadline, nonce=new_nonce()
        )
    assert info.value.trigger.serialize()[1]["deadline"] == deadline
    with pytest.raises(VolcanoLockContended, match="Timed out"):
        _op(unique_key, deferrable=True).execute_complete(
            _context(), event, deadline=time.time() - 1, nonce=new_nonce()
        )
    outside.release(unique_key, held)


def test_execute_complete_timeout_and_error_fail(unique_key: str) -> None:
    op = _op(unique_key)
    with pytest.raises(VolcanoLockContended, match="fencing token 7"):
        op.execute_complete(_context(), {"status": "timeout", "fencing_token": 7, "message": "m"})
    with pytest.raises(Exception, match=r"Waiting for lock .* failed: boom"):
        op.execute_complete(_context(), {"status": "error", "message": "boom"})


def test_loss_while_running_fails_the_task(volcano_conn, outside, unique_key) -> None:
    progress: list[int] = []

    def work() -> str:
        outside.force_release(unique_key)
        for i in range(200):  # far longer than the keeper needs to notice (ttl 5: renewal ~1.7 s)
            time.sleep(0.05)
            progress.append(i)
        return "should never be reported"

    with pytest.raises(VolcanoLockLost, match="Lost ownership of lock"):
        _op(unique_key, work, ttl=5).execute(_context())
    assert len(progress) < 200  # the callable was interrupted


def test_on_kill_releases_the_lock_and_stops_the_callable(volcano_conn, outside, unique_key):
    op = _op(unique_key, ttl=30)
    after_kill: list[str] = []

    def work() -> None:
        op.on_kill()  # what SIGTERM does in the task process: the handler runs in this thread
        after_kill.append("the callable went on")

    with pytest.raises(VolcanoLockLost, match="killed"):
        op.python_callable = work
        op.execute(_context())
    assert after_kill == []
    assert outside.get(unique_key).held is False


def test_on_kill_from_another_thread_releases_and_the_keeper_stops_the_callable(
    volcano_conn, outside, unique_key
):
    op = _op(unique_key, ttl=6)
    progress: list[int] = []

    def work() -> None:
        killer = threading.Thread(target=op.on_kill)
        killer.start()
        killer.join()
        progress.append(-1 if outside.get(unique_key).held else 0)
        for i in range(200):  # the keeper notices the release at its next renewal (~2 s)
            time.sleep(0.05)
            progress.append(i)

    with pytest.raises(VolcanoLockLost, match="killed"):
        op.python_callable = work
        op.execute(_context())
    assert progress[0] == 0 and len(progress) < 150


def test_two_executions_of_one_task_try_are_two_owners(volcano_conn, unique_key) -> None:
    """Two deployments of one DAG share dag, task, run id (scheduled__<date>), map index and try.

    Both executions below see exactly the same task instance facts and the same service key; the
    second must still be refused while the first holds the lock (it used to derive the same token
    and re-acquire the first one's lease idempotently: two owners, one fencing token).
    """
    inside, release = threading.Event(), threading.Event()

    def hold() -> str:
        inside.set()
        assert release.wait(20)
        return "first"

    first = threading.Thread(target=lambda: _op(unique_key, hold, on_contention="skip").execute(_context()))
    first.start()
    try:
        assert inside.wait(20)
        ran = []
        with pytest.raises(AirflowSkipException, match="fencing token"):
            _op(unique_key, lambda: ran.append(1), on_contention="skip").execute(_context())
        assert ran == []
    finally:
        release.set()
        first.join(20)


def test_a_resumed_try_without_its_nonce_fails_clearly(volcano_conn, unique_key) -> None:
    event = {"status": "acquired", "lock_key": unique_key, "fencing_token": 1}
    with pytest.raises(AirflowException, match="without this try's owner nonce"):
        _op(unique_key).execute_complete(_context(), event, deadline=None)


def test_tokens_differ_per_nonce_and_nonces_are_checked() -> None:
    one, two = new_nonce(), new_nonce()
    assert one != two
    key = "k"
    tokens = {derive_token(key, TaskIdentity("d", "t", "scheduled__x", -1, 1, n), "lock") for n in (one, two)}
    assert len(tokens) == 2
    with pytest.raises(ValueError, match="nonce must be 32 lowercase hex digits"):
        TaskIdentity("d", "t", "r", -1, 1, "not-a-nonce")


# -- the handoff from trigger to resumed task (issue 11, item 2) ------------------------------------


def _log(capfd: pytest.CaptureFixture[str]) -> str:
    """What the task logged so far (Airflow's task logger writes to the process's stdout)."""
    out = capfd.readouterr()
    return out.out + out.err


def _lines(capfd: pytest.CaptureFixture[str], needle: str) -> list[str]:
    return [line for line in _log(capfd).splitlines() if needle in line]


def _triggers_lease(volcano_conn, outside, key: str, nonce: str, ttl: int = 30):
    """Acquire as the trigger does for task "t": with the token derived from the try and its nonce."""
    token = derive_token(volcano_conn.service_key, TaskIdentity("d", "t", "manual__x", -1, 1, nonce), key)
    return outside.acquire(key, ttl, token=token)


def _event(lease: Any, seconds_ago: float, handoff_ttl: int) -> dict[str, Any]:
    from datetime import UTC, datetime, timedelta

    return {
        "status": "acquired",
        "lock_key": lease.key,
        "fencing_token": lease.fencing_token,
        "acquired_at": (datetime.now(UTC) - timedelta(seconds=seconds_ago)).isoformat(),
        "handoff_ttl": handoff_ttl,
    }


def test_handoff_ttl_is_validated_and_never_below_ttl() -> None:
    with pytest.raises(ValueError, match=r"invalid handoff_ttl 4: expected an integer number of seconds, 5"):
        _op("k", handoff_ttl=4)
    with pytest.raises(ValueError, match=r"invalid handoff_ttl 60\.0: expected an integer"):
        _op("k", handoff_ttl=60.0)
    assert _op("k").handoff_ttl == 300
    assert _op("k", ttl=900, handoff_ttl=60).handoff_ttl == 900


def test_the_deferred_trigger_acquires_for_the_handoff(volcano_conn, outside, unique_key) -> None:
    held = outside.acquire(unique_key, 30)
    with pytest.raises(TaskDeferred) as info:
        _op(unique_key, deferrable=True, ttl=10, handoff_ttl=120).execute(_context())
    outside.release(unique_key, held)
    assert info.value.trigger.serialize()[1]["handoff_ttl"] == 120


def test_a_resume_slower_than_the_ttl_keeps_the_triggers_lease(
    volcano_conn, outside, unique_key, capfd
) -> None:
    """The trigger's lease (handoff 60 s) outlives a resume 12 s later, past the task's 5 s TTL."""
    nonce = new_nonce()
    by_trigger = _triggers_lease(volcano_conn, outside, unique_key, nonce, ttl=60)
    ctx = _context()
    result = _op(unique_key, ttl=5).execute_complete(ctx, _event(by_trigger, 12, 60), nonce=nonce)
    assert result == "done"
    assert ctx["ti"].xcoms["volcano_lease"]["fencing_token"] == by_trigger.fencing_token
    log = _log(capfd)
    assert "12." in log and "handoff allowance 60 s" in log
    assert "The handoff of lock" not in log
    assert f"Released lock {unique_key!r} (fencing token {by_trigger.fencing_token})" in log


def test_a_lapsed_handoff_on_a_free_lock_is_logged_and_the_task_runs(
    volcano_conn, outside, unique_key, capfd
) -> None:
    nonce = new_nonce()
    by_trigger = _triggers_lease(volcano_conn, outside, unique_key, nonce, ttl=5)
    outside.release(unique_key, by_trigger)  # what a lapse leaves behind: a free lock
    ctx = _context()
    assert _op(unique_key).execute_complete(ctx, _event(by_trigger, 40, 5), nonce=nonce) == "done"
    assert ctx["ti"].xcoms["volcano_lease"]["fencing_token"] > by_trigger.fencing_token
    lapsed = _lines(capfd, "The handoff of lock")
    assert len(lapsed) == 1 and "40." in lapsed[0] and "handoff_ttl=5 s" in lapsed[0]
    assert "Raise handoff_ttl" in lapsed[0]


def test_a_lapsed_handoff_taken_meanwhile_waits_again_with_a_longer_allowance(
    volcano_conn, outside, unique_key, capfd
) -> None:
    nonce = new_nonce()
    by_trigger = _triggers_lease(volcano_conn, outside, unique_key, nonce, ttl=5)
    outside.release(unique_key, by_trigger)
    taken = outside.acquire(unique_key, 30)  # another task got the lock while this one was queued
    op = _op(unique_key, deferrable=True, ttl=10, handoff_ttl=60)
    try:
        with pytest.raises(TaskDeferred) as info:
            op.execute_complete(
                _context(), _event(by_trigger, 100, 60), deadline=time.time() + 60, nonce=nonce
            )
        # Twice the measured 100 s delay (plus the test's own milliseconds), within 4 x handoff_ttl.
        allowance = info.value.trigger.serialize()[1]["handoff_ttl"]
        assert 200 <= allowance <= 202
        (lapsed,) = _lines(capfd, "The handoff of lock")
        assert "100." in lapsed and f"fencing token {taken.fencing_token}" in lapsed
        assert f"waiting again with a handoff allowance of {allowance} s" in lapsed
        capfd.readouterr()
        with pytest.raises(TaskDeferred) as info:
            op.execute_complete(
                _context(), _event(by_trigger, 1000, 200), deadline=time.time() + 60, nonce=nonce
            )
        assert info.value.trigger.serialize()[1]["handoff_ttl"] == 240  # the cap: 4 x 60 s
    finally:
        outside.release(unique_key, taken)


# -- what the task log says (issue 11, item 4) -------------------------------------------------------


def test_waiting_in_the_worker_slot_says_so_and_how_to_defer(
    volcano_conn, outside, unique_key, capfd
) -> None:
    held = outside.acquire(unique_key, 30)
    threading.Timer(1.5, outside.release, (unique_key, held)).start()
    assert _op(unique_key, deferrable=False, wait_timeout=30, poll_interval=0.5).execute(_context()) == "done"
    (notice,) = _lines(capfd, "worker slot")
    assert f"fencing token {held.fencing_token}" in notice
    assert "deferrable=True" in notice and "[operators] default_deferrable" in notice


def test_no_in_slot_notice_when_the_lock_is_free_or_the_wait_is_deferred(
    volcano_conn, outside, unique_key, capfd
) -> None:
    _op(unique_key, deferrable=False).execute(_context())
    held = outside.acquire(unique_key, 30)
    with pytest.raises(TaskDeferred):
        _op(unique_key, deferrable=True).execute(_context())
    outside.release(unique_key, held)
    assert "worker slot" not in _log(capfd)


def test_the_first_acquire_rides_out_503s_and_skip_decides_on_contention_only(
    volcano_conn, outside, unique_key, capfd
) -> None:
    # Four 503s: the client's own retry absorbs one per call, the operator waits out the rest.
    volcano_conn.server.set_faults("status=503:op=acquire:count=4")
    assert (
        _op(unique_key, on_contention="skip", poll_interval=0.2, wait_timeout=30).execute(_context())
        == "done"
    )
    assert "Volcano lock API unavailable while acquiring lock" in _log(capfd)
    statuses = [
        r["status"]
        for r in volcano_conn.requests()
        if unique_key in r.get("path", "") and r["op"] == "acquire"
    ]
    assert statuses == [503, 503, 503, 503, 201], statuses


def test_an_unreachable_api_fails_at_wait_timeout_naming_it(volcano_conn, unique_key) -> None:
    volcano_conn.server.set_faults("status=503:op=acquire:count=1000")
    with pytest.raises(AirflowException, match=r"did not answer for lock .* within wait_timeout=1\.5 s"):
        _op(unique_key, on_contention="fail", poll_interval=0.2, wait_timeout=1.5).execute(_context())


def test_the_first_acquire_waits_out_a_stopped_server(monkeypatch, unique_key, capfd) -> None:
    """The API goes away and comes back on the same address: the task acquires, then runs."""
    from tests.airflow.helpers import volcano_conn_json
    from volcano_locks.server.harness import LocalServer

    with LocalServer(admin=True) as server:
        monkeypatch.setenv("AIRFLOW_CONN_VOLCANO_FLAKY", volcano_conn_json(server.url, server.service_key))
        server.stop()
        op = _op(
            unique_key,
            on_contention="fail",
            poll_interval=0.5,
            wait_timeout=60,
            volcano_conn_id="volcano_flaky",
        )
        threading.Timer(3.0, server.start).start()
        assert op.execute(_context()) == "done"
        assert server.running
        ops = [(r["op"], r["status"]) for r in server.requests() if unique_key in r.get("path", "")]
    assert ops == [("acquire", 201), ("release", 204)], ops  # nothing reached the stopped server
    assert "Volcano lock API unavailable while acquiring lock" in _log(capfd)


def test_a_wait_in_the_worker_slot_reports_every_minute_naming_the_holder(
    volcano_conn, outside, unique_key, capfd
) -> None:
    """The callback the core's wait engine calls every 5 s (a line a minute, and the start is announced)."""
    from volcano_locks import LockState

    held = outside.acquire(unique_key, 30)
    from airflow_provider_volcano.runtime.slot_wait import SlotWait

    op = _op(unique_key)
    wait = SlotWait(op.hook, unique_key, None, None, op.log)
    wait.on_waiting(LockState(held=True, fencing_token=7), 0.0)  # the start: announced already
    for waited in (5.0, 10.0, 55.0):
        wait.on_waiting(None, waited)  # looks for a stranded handoff only
    wait.on_waiting(LockState(held=True, expires_at=held.expires_at, fencing_token=held.fencing_token), 61.2)
    wait.on_waiting(LockState(held=True), 66.0)
    # A refused acquisition says neither who nor until when: the line reads the holder. Inside the wait
    # engine's report the line carries the engine's expected start (issue 30).
    eta = Eta(expected=40.0, earliest=25.0, latest=70.0, confidence="medium", position=1, tenures=3)
    with reporting(eta):
        wait.on_waiting(LockState(held=True), 122.0)
    lines = _lines(capfd, f"Still waiting for lock {unique_key!r}")
    assert len(lines) == 2, lines
    facts = f"fencing token {held.fencing_token} until {held.expires_at.isoformat()}"
    for line, after in zip(lines, ("after 61 s", "after 122 s"), strict=True):
        assert after in line and facts in line, line
        assert "not a handoff" in line, line
    assert f"; {NO_ESTIMATE}" in lines[0], lines[0]
    assert f"; {eta.describe()}" in lines[1], lines[1]
    assert "expected to start in about 40 s" in lines[1] and "medium confidence" in lines[1]
    wait.close()  # what the end of a wait does
    outside.release(unique_key, held)


def test_group_membership_is_checked_at_construction() -> None:
    with pytest.raises(ValueError, match="lock_key 'k' must not be given with lock_group"):
        _op("k", lock_group="g.volcano_lock_acquire")
    with pytest.raises(ValueError, match="lock_group must be a lock group"):
        VolcanoLockOperator(task_id="t", python_callable=lambda: None, lock_group=42)
    with pytest.raises(ValueError, match="lock_key must be a non-empty string"):
        VolcanoLockOperator(task_id="t", python_callable=lambda: None)
    member = VolcanoLockOperator(task_id="t", python_callable=lambda: None, lock_group="g.acquire")
    assert member.lock_group_task_id == "g.acquire"


def test_the_release_after_a_failed_callable_is_logged(volcano_conn, outside, unique_key, capfd) -> None:
    def boom(volcano_lease: dict[str, Any]) -> None:
        raise RuntimeError(f"failed under fencing token {volcano_lease['fencing_token']}")

    with pytest.raises(RuntimeError, match="failed under fencing token") as info:
        _op(unique_key, boom).execute(_context())
    fencing = str(info.value).rsplit(" ", 1)[1]
    assert not outside.get(unique_key).held
    (line,) = _lines(capfd, "Released lock")
    assert f"(fencing token {fencing}) after the callable failed" in line


def test_a_release_refused_with_429_is_retried_and_the_task_keeps_its_result(
    volcano_conn, outside, unique_key, capfd
) -> None:
    """Issue 34's rule in the operator: a refused release never fails finished work; it is retried."""
    volcano_conn.server.set_faults("status=429:op=release:count=1")
    assert _op(unique_key, ttl=10).execute(_context()) == "done"
    log = _log(capfd)
    assert "was refused at first" in log and "released on attempt 2" in log, log[-2000:]
    assert not outside.get(unique_key).held
    releases = [
        r["status"]
        for r in volcano_conn.requests()
        if unique_key in r.get("path", "") and r["op"] == "release"
    ]
    assert releases == [429, 204], releases


def test_an_unanswered_release_is_left_to_lapse_and_the_task_keeps_its_result(
    volcano_conn, outside, unique_key, capfd
) -> None:
    volcano_conn.server.set_faults("drop:op=release")
    assert _op(unique_key, ttl=5).execute(_context()) == "done"
    volcano_conn.server.set_faults(None)
    log = _log(capfd)
    assert "left to lapse at its expiry" in log, log[-2000:]
    assert "Released lock" not in log
    assert volcano_conn.service_key not in log
