"""locked_task under a real Prefect run against the real local lock server."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from prefect import flow, task
from prefect.cache_policies import INPUTS
from prefect.states import Completed, State

from prefect_volcano import (
    SKIPPED_STATE_NAME,
    LockedResult,
    VolcanoCredentials,
    current_lease,
    is_skipped,
    locked_task,
)
from tests.prefect.helpers import (
    assert_failed_with,
    collecting_flow,
    force_release_when,
    release_once_waiting,
    run_logs,
    token_flow,
    token_task,
)
from volcano_locks import InvalidRequest, LeaseFacts, LockContention, OwnershipLost, VolcanoLocks, WaitTimeout

pytestmark = pytest.mark.usefixtures("volcano_env")


def lock_state(key: str) -> Any:
    with VolcanoLocks() as client:
        return client.get(key)


# ------------------------------------------------------------------------------------------- basics


@pytest.mark.parametrize("order", ["above", "below"])
def test_sync_task_runs_under_its_lease(order: str, unique_key: str) -> None:
    seen: dict[str, Any] = {}

    def rollup(region: str) -> str:
        lease = current_lease()
        seen["lease"] = lease
        seen["state"] = lock_state(lease.lock_key)
        return f"done:{region}"

    template = unique_key + ":{region}"
    locked = (
        locked_task(template, ttl=10)(task(rollup))
        if order == "above"
        else task(locked_task(template, ttl=10)(rollup))
    )

    @flow
    def f() -> str:
        return locked("eu")

    assert f() == "done:eu"
    lease = seen["lease"]
    assert lease.lock_key == f"{unique_key}:eu"
    assert lease.ttl == 10
    # While the body ran, the server saw exactly this lease as the holder.
    assert seen["state"].held and seen["state"].fencing_token == lease.fencing_token
    assert lease.expires_at > lease.acquired_at
    assert not lock_state(lease.lock_key).held  # released after the body


@pytest.mark.parametrize("order", ["above", "below"])
async def test_async_task_runs_under_its_lease(order: str, unique_key: str, tmp_path: Path) -> None:
    async def rollup(region: str) -> LockedResult[str]:
        await asyncio.sleep(0)
        return f"async:{region}:{current_lease().fencing_token}"  # type: ignore[return-value]

    template = unique_key + ":{region}"
    locked = (
        locked_task(template, result="locked_result")(task(rollup))
        if order == "above"
        else task(locked_task(template, result="locked_result")(rollup))
    )

    @flow(result_storage=tmp_path)  # see ASYNC_FLOWS in conftest
    async def f() -> LockedResult[str]:
        return await locked("us")

    out = await f()
    assert isinstance(out, LockedResult)
    assert out.lock_key == f"{unique_key}:us"
    assert out.value == f"async:us:{out.fencing_token}"
    assert not lock_state(out.lock_key).held


def test_locked_result_carries_the_fencing_token_not_the_ownership_token(unique_key: str) -> None:
    @task
    @locked_task(unique_key, result="locked_result")
    def work() -> int:
        return 7

    @flow
    def f() -> LockedResult[int]:
        return work()

    out = f()
    assert out.value == 7 and out.lock_key == unique_key and out.fencing_token > 0
    # The value and the core's one public form of the lease: nothing else, never the token.
    assert set(vars(out)) == {"value", "lease"} and isinstance(out.lease, LeaseFacts)
    assert out.lease.as_dict()["fencing_token"] == out.fencing_token and "token" not in vars(out.lease)


def test_callable_key_and_bad_rendered_keys(unique_key: str) -> None:
    @task
    @locked_task(lambda params: f"{unique_key}-{params['n'] * 2}")
    def doubled(n: int) -> str:
        return current_lease().lock_key

    @task
    @locked_task("{name}")
    def named(name: str) -> str:
        return name

    states: list[State[Any]] = []

    @flow
    def f() -> str:
        states.append(named("not a valid key", return_state=True))
        return doubled(21)

    key, bad = f(), states[0]
    assert key == f"{unique_key}-42"
    assert_failed_with(
        bad, InvalidRequest, r"^invalid lock key 'not a valid key': .* \(rendered from key '\{name\}'\)$"
    )


def test_submit_and_map_take_one_lease_per_run(unique_key: str) -> None:
    @task
    @locked_task(unique_key + ":{region}", result="locked_result")
    def refresh(region: str) -> str:
        time.sleep(0.05)
        return region

    @flow
    def f() -> tuple[list[LockedResult[str]], LockedResult[str]]:
        mapped = refresh.map(["eu", "us", "apac"]).result()
        submitted = refresh.submit("sa").result()
        return mapped, submitted

    mapped, submitted = f()
    assert [r.value for r in mapped] == ["eu", "us", "apac"]
    assert [r.lock_key for r in mapped] == [f"{unique_key}:{r}" for r in ("eu", "us", "apac")]
    assert submitted.lock_key == f"{unique_key}:sa"


def test_retries_take_a_new_lease_each_time(unique_key: str) -> None:
    tokens: list[int] = []

    @locked_task(unique_key, ttl=5)
    @task(retries=2, retry_delay_seconds=0)
    def flaky() -> int:
        tokens.append(current_lease().fencing_token)
        if len(tokens) < 3:
            raise RuntimeError("transient")
        return tokens[-1]

    @flow
    def f() -> int:
        return flaky()

    assert f() == tokens[-1]
    assert len(tokens) == 3
    assert tokens[0] < tokens[1] < tokens[2]  # each attempt is a new lease
    assert not lock_state(unique_key).held


def test_caching_skips_the_body_and_the_lock(unique_key: str) -> None:
    calls: list[int] = []

    @task(cache_policy=INPUTS, persist_result=True)
    @locked_task(unique_key + "-{n}", result="locked_result")
    def cached(n: int) -> int:
        calls.append(n)
        return n * 10

    @flow
    def f() -> tuple[State[Any], State[Any]]:
        return cached(1, return_state=True), cached(1, return_state=True)

    first, second = f()
    assert calls == [1]
    assert first.name == "Completed" and second.name == "Cached"
    assert first.result().fencing_token == second.result().fencing_token
    assert f()[0].name == "Cached" and calls == [1]


# ------------------------------------------------------------------------------------- contention


def test_skip_completes_as_skipped_and_is_not_cached(unique_key: str) -> None:
    calls: list[int] = []

    @task(cache_policy=INPUTS, persist_result=True)
    @locked_task(unique_key, on_contention="skip")
    def leader(n: int) -> int:
        calls.append(n)
        return n

    states: list[State[Any]] = []

    @flow
    def f() -> None:
        states.append(leader(5, return_state=True))

    with VolcanoLocks() as holder, holder.with_lock(unique_key, 10):
        f()
    skipped = states[-1]
    assert skipped.is_completed() and skipped.name == SKIPPED_STATE_NAME
    assert unique_key in (skipped.message or "") and calls == []
    assert skipped.result() is None

    f()  # the lock is free now: a skip must not have been cached
    assert states[-1].name == "Completed" and calls == [5]
    f()
    assert states[-1].name == "Cached"


def test_skip_in_async_task(unique_key: str, tmp_path: Path) -> None:
    @locked_task(unique_key, on_contention="skip")
    @task
    async def leader() -> str:
        return "ran"

    states: list[State[Any]] = []

    @flow(result_storage=tmp_path)  # see ASYNC_FLOWS in conftest
    async def f() -> None:
        states.append(await leader(return_state=True))

    with VolcanoLocks() as holder, holder.with_lock(unique_key, 10):
        asyncio.run(f())
    state = states[0]
    assert state.name == SKIPPED_STATE_NAME and state.is_completed()


def test_fail_policy_fails_the_task_not_the_flow(unique_key: str) -> None:
    f, states = collecting_flow(token_task(unique_key, on_contention="fail"))

    with VolcanoLocks() as holder, holder.with_lock(unique_key, 10):
        assert f() == "flow went on"
    state = states[0]
    assert_failed_with(
        state, LockContention, f"lock '{unique_key}' is held by another run and on_contention='fail'"
    )


def test_wait_times_out_with_a_clear_failure(unique_key: str) -> None:
    f, states = collecting_flow(token_task(unique_key, wait_timeout=0.5))

    with VolcanoLocks() as holder, holder.with_lock(unique_key, 10):
        f()
    state = states[0]
    assert_failed_with(state, WaitTimeout)
    assert "Gave up waiting for lock" in run_logs(state)


def test_wait_acquires_once_the_holder_releases(unique_key: str) -> None:
    @task
    @locked_task(unique_key, wait_timeout=30, result="locked_result")
    def patient() -> str:
        return "ran"

    @flow
    def f() -> LockedResult[str]:
        return patient()

    with VolcanoLocks() as holder:
        lease = holder.acquire(unique_key, 10)
        timer = threading.Timer(1.0, holder.release, args=(unique_key, lease))
        timer.start()
        out = f()
        timer.join()
    assert out.value == "ran" and out.fencing_token > lease.fencing_token


# ------------------------------------------------------------------------------------ ownership loss


def test_force_release_fails_the_sync_task_and_names_the_loss(unique_key: str) -> None:
    started = threading.Event()
    finished: list[bool] = []

    @task
    @locked_task(unique_key, ttl=5)
    def long_job() -> str:
        started.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.05)
        finished.append(True)
        return "should never complete"

    f, states = collecting_flow(long_job)
    breaker = force_release_when(started, unique_key)
    after = f()
    state = states[0]
    breaker.join()
    assert after == "flow went on"  # the flow itself did not crash
    assert state.is_failed() and not finished
    with pytest.raises(OwnershipLost):
        state.result()
    assert f"Lost ownership of lock '{unique_key}'" in run_logs(state)


def test_force_release_cancels_the_async_task(unique_key: str, tmp_path: Path) -> None:
    started = threading.Event()
    cancelled: list[bool] = []

    @locked_task(unique_key, ttl=5)
    @task
    async def long_job() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "should never complete"

    states: list[State[Any]] = []

    @flow(result_storage=tmp_path)  # see ASYNC_FLOWS in conftest
    async def f() -> str:
        states.append(await long_job(return_state=True))
        return "flow went on"

    breaker = force_release_when(started, unique_key)
    assert asyncio.run(f()) == "flow went on"
    state = states[0]
    breaker.join()
    assert state.is_failed() and cancelled == [True]
    with pytest.raises(OwnershipLost):
        state.result()


def test_loss_is_retriable_and_the_retry_gets_a_newer_lease(unique_key: str) -> None:
    started = threading.Event()
    tokens: list[int] = []

    @locked_task(unique_key, ttl=5, result="locked_result")
    @task(retries=1, retry_delay_seconds=0)
    def job() -> str:
        tokens.append(current_lease().fencing_token)
        if len(tokens) == 1:
            started.set()
            time.sleep(0.05)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                time.sleep(0.05)
        return "second attempt"

    @flow
    def f() -> LockedResult[str]:
        return job()

    breaker = force_release_when(started, unique_key)
    out = f()
    breaker.join()
    assert out.value == "second attempt"
    assert len(tokens) == 2 and tokens[1] > tokens[0] and out.fencing_token == tokens[1]


# ---------------------------------------------------------------------------------------- credentials


def test_credentials_block_object_and_saved_name(
    volcano_server: Any, unique_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = VolcanoCredentials(api_url=volcano_server.url, service_key=volcano_server.service_key)
    name = f"creds-{uuid.uuid4().hex[:10]}"
    block.save(name)
    for var in ("VOLCANO_API_URL", "VOLCANO_SERVICE_KEY", "VOLCANO_ANON_KEY"):
        monkeypatch.delenv(var, raising=False)

    @task
    @locked_task(unique_key + "-obj", credentials=block)
    def by_object() -> int:
        return current_lease().fencing_token

    @task
    @locked_task(unique_key + "-name", credentials=name)
    def by_name() -> int:
        return current_lease().fencing_token

    @task
    @locked_task(unique_key + "-name-async", credentials=name)
    async def by_name_async() -> int:
        return current_lease().fencing_token

    @flow
    def f() -> list[int]:
        return [by_object(), by_name(), asyncio.run(by_name_async.fn())]

    assert all(token > 0 for token in f())


def test_missing_environment_fails_with_the_setting_named(
    unique_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VOLCANO_SERVICE_KEY")

    @task
    @locked_task(unique_key)
    def work() -> None:
        return None

    states: list[State[Any]] = []

    @flow
    def f() -> None:
        states.append(work(return_state=True))

    f()
    state = states[0]
    assert_failed_with(state, InvalidRequest, "VOLCANO_SERVICE_KEY")


def test_async_retries_map_and_caching(unique_key: str, tmp_path: Path) -> None:
    attempts: dict[str, list[int]] = {}

    @task(retries=1, retry_delay_seconds=0, cache_policy=INPUTS, persist_result=True)
    @locked_task(unique_key + ":{region}", result="locked_result")
    async def refresh(region: str) -> str:
        tokens = attempts.setdefault(region, [])
        tokens.append(current_lease().fencing_token)
        await asyncio.sleep(0.05)
        if region == "eu" and len(tokens) == 1:
            raise RuntimeError("transient")
        return region

    @flow(result_storage=tmp_path)  # see ASYNC_FLOWS in conftest
    async def f() -> None:
        futures = refresh.map(["eu", "us"])
        futures.wait()
        runs.append([future.state for future in futures])

    runs: list[list[State[Any]]] = []
    asyncio.run(f())
    first = runs[-1]
    assert [s.name for s in first] == ["Completed", "Completed"]
    results = [s.result() for s in first]
    assert [r.lock_key for r in results] == [f"{unique_key}:eu", f"{unique_key}:us"]
    eu = attempts["eu"]
    assert len(eu) == 2 and eu[0] < eu[1] and results[0].fencing_token == eu[1]  # the retry's new lease

    asyncio.run(f())  # same inputs: answered from the cache, no new lease
    second = runs[-1]
    assert [s.name for s in second] == ["Cached", "Cached"]
    assert len(attempts["eu"]) == 2 and len(attempts["us"]) == 1


def test_outside_a_run_logs_go_to_the_prefect_volcano_logger(
    unique_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    @locked_task(unique_key, result="locked_result")
    def plain() -> int:
        return current_lease().fencing_token

    with caplog.at_level("INFO", logger="prefect_volcano"):
        out = plain()
    assert out.value == out.fencing_token
    names = {(r.name, r.getMessage().split(" (")[0]) for r in caplog.records if r.name == "prefect_volcano"}
    assert names == {
        ("prefect_volcano", f"Acquired lock '{unique_key}'"),
        ("prefect_volcano", f"Released lock '{unique_key}'"),
    }


def test_a_named_block_is_loaded_once_per_process(
    unique_key: str, credentials: VolcanoCredentials, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"volcano-once-{uuid.uuid4().hex[:8]}"
    credentials.save(name)
    for var in ("VOLCANO_API_URL", "VOLCANO_SERVICE_KEY", "VOLCANO_ANON_KEY"):
        monkeypatch.delenv(var, raising=False)

    f = token_flow(unique_key, credentials=name)
    first = f()
    # Gone from the Prefect API: later runs in this process must not need it again.
    VolcanoCredentials.delete(name)
    assert f() > first and f() > first + 1


def test_a_skipped_call_returns_the_skipped_state_whatever_the_call(unique_key: str) -> None:
    @locked_task(unique_key, on_contention="skip", result="locked_result")
    def plain() -> str:
        return "ran"

    as_task = task(plain)

    @flow
    def f() -> tuple[Any, State[Any]]:
        return as_task(), as_task(return_state=True)

    with VolcanoLocks() as holder, holder.with_lock(unique_key, 10):
        outside = plain()
        inside, state = f()
    for value in (outside, inside, state):
        assert is_skipped(value) and value.name == SKIPPED_STATE_NAME
    assert state.result() is None
    assert not is_skipped(None) and not is_skipped(Completed())


@pytest.mark.parametrize(
    ("retries", "told"), [(0, "no retries are left"), (1, "Prefect may retry it (1 left)")]
)
def test_the_loss_message_says_what_is_true(unique_key: str, retries: int, told: str) -> None:
    started = threading.Event()

    @task(retries=retries, retry_delay_seconds=0)
    @locked_task(unique_key, ttl=5)
    def job() -> str:
        if started.is_set():
            return "retried"
        started.set()
        time.sleep(20)  # blocked in C: the interrupt lands only when the sleep returns
        return "should never complete"

    states: list[State[Any]] = []

    @flow
    def f() -> None:
        states.append(job(return_state=True))

    breaker = force_release_when(started, unique_key)
    f()
    breaker.join()
    logs = run_logs(states[0])
    assert logs.count(f"Lost ownership of lock '{unique_key}'") == 1
    line = next(line for line in logs.splitlines() if line.startswith("Lost ownership"))
    assert "a call blocked in C code, such as a sleep or a socket read, runs until it returns" in line
    assert told in line and ("a retry takes a new lease" in line) == (retries > 0)
    assert states[0].is_failed() == (retries == 0)


def test_a_waiting_task_says_so(unique_key: str, volcano_server: Any) -> None:
    f, states = collecting_flow(token_task(unique_key, wait_timeout=30))

    with VolcanoLocks() as holder:
        lease = holder.acquire(unique_key, 120)  # never lapses before the task waits
        releaser = release_once_waiting(volcano_server, holder, unique_key, lease)
        f()
        releaser.join(90)
    logs = run_logs(states[0])
    # The contract's 409 does not name the holder; the engine's later reports do, once it has looked.
    waiting = f"Waiting for lock '{unique_key}', held by another run"
    assert waiting in logs
    assert logs.index(waiting) < logs.index(f"Acquired lock '{unique_key}'")
