"""locked_flow: one lease for a whole flow run, its tasks, its skip and its loss."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from prefect import flow, task

from prefect_volcano import SKIPPED_STATE_NAME, current_lease, locked_flow, locked_task
from tests.prefect.helpers import assert_failed_with, force_release_when, run_logs
from volcano_locks import LockContention, OwnershipLost, VolcanoLocks

pytestmark = pytest.mark.usefixtures("volcano_env")


def test_every_task_sees_the_flow_runs_lease_and_the_lock_is_free_after(unique_key: str) -> None:
    @task
    def token() -> int:
        return current_lease().fencing_token

    @flow
    @locked_flow(unique_key, ttl=5)
    def f() -> tuple[int, list[int], int]:
        # Longer than the TTL: the flow's one lease is renewed, its token stays.
        direct = token()
        time.sleep(6)
        submitted = [fut.result() for fut in [token.submit() for _ in range(3)]]
        return direct, submitted, current_lease().fencing_token

    direct, submitted, own = f()
    assert submitted == [own, own, own] and direct == own
    with VolcanoLocks() as client:
        assert client.get(unique_key).held is False


def test_a_locked_task_inside_takes_its_own_lease_then_the_flows_is_back(unique_key: str) -> None:
    @locked_task(f"{unique_key}-inner")
    @task
    def inner() -> tuple[str, int]:
        lease = current_lease()
        return lease.lock_key, lease.fencing_token

    @locked_flow(unique_key)
    @flow
    def f() -> tuple[tuple[str, int], str]:
        return inner(), current_lease().lock_key

    (inner_key, _), outer_key = f()
    assert (inner_key, outer_key) == (f"{unique_key}-inner", unique_key)


def test_fail_policy_fails_the_flow_run(unique_key: str) -> None:
    @locked_flow(unique_key, on_contention="fail")
    @flow
    def f() -> str:
        return "ran"

    with VolcanoLocks() as holder, holder.with_lock(unique_key, 10):
        state = f(return_state=True)
    assert_failed_with(state, LockContention, f"lock '{unique_key}' is held by another run")


def test_async_flow_skips_as_a_flow_run_named_skipped(unique_key: str, tmp_path: Path) -> None:
    ran: list[bool] = []

    @locked_flow(unique_key, on_contention="skip")
    @flow(result_storage=tmp_path)  # see ASYNC_FLOWS in conftest
    async def f() -> str:
        ran.append(True)
        return "ran"

    with VolcanoLocks() as holder, holder.with_lock(unique_key, 10):
        state = asyncio.run(f(return_state=True))
        value = asyncio.run(f())
    assert state.name == SKIPPED_STATE_NAME and state.is_completed() and value is None and ran == []
    assert asyncio.run(f()) == "ran"


def test_loss_fails_the_flow_run_and_current_lease_refuses_after_it(unique_key: str) -> None:
    started = threading.Event()
    seen_after_loss: list[str] = []

    @task
    def stamp() -> int:
        return current_lease().fencing_token

    @locked_flow(unique_key, ttl=5)
    @flow(retries=0)
    def f() -> str:
        stamp()
        started.set()
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                time.sleep(0.05)
        except OwnershipLost:
            try:
                current_lease()
            except OwnershipLost as exc:
                seen_after_loss.append(str(exc))
            raise
        return "should never complete"

    thread = force_release_when(started, unique_key)
    state = f(return_state=True)
    thread.join()
    assert state.is_failed() and len(seen_after_loss) == 1
    with pytest.raises(OwnershipLost):
        state.result()
    logs = run_logs(state)
    assert logs.count(f"Lost ownership of lock '{unique_key}'") == 1  # told once
    assert "the body is interrupted at its next Python instruction" in logs
    assert "the flow run fails; no retries are left" in logs
    assert "a retry takes a new lease" not in logs
