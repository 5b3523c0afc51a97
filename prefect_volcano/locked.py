"""`locked_task` and `locked_flow`: run a Prefect task, or a whole flow run, alone across every worker.

Both hold a Volcano project lock for exactly as long as the body runs, renew it meanwhile and
release it however the body ends. The pieces live in private modules: `_spec` (arguments and key
templates), `_wrap` (wrapping tasks, flows and functions), `_hold` (the sync and async holds) and
`_report` / `_events` (what the run logs and emits).
"""

from __future__ import annotations

from typing import Any

from prefect_volcano._report import SKIPPED_STATE_NAME
from prefect_volcano._spec import KeySpec, OnContention, ResultMode, lock_spec
from prefect_volcano._wrap import Decorator
from prefect_volcano.credentials import VolcanoCredentials

__all__ = ["SKIPPED_STATE_NAME", "KeySpec", "OnContention", "ResultMode", "locked_flow", "locked_task"]


def locked_task(
    key: KeySpec,
    ttl: int = 30,
    *,
    credentials: VolcanoCredentials | str | None = None,
    on_contention: OnContention = "wait",
    wait_timeout: float | None = None,
    result: ResultMode = "value",
    once_key: KeySpec | None = None,
    ledger: Any = None,
) -> Decorator:
    """Make a Prefect task run only while it holds the Volcano lock `key`.

    Works above or below `@task`, on sync and async functions. Each run (and each retry)
    takes a new lease, renewed while the body runs and released when it ends, whatever
    the outcome. Inside the body, `current_lease()` gives the lease's fencing token.

    Args:
        key: The lock key; a `str.format` template over the task's parameters
            (`"rollup:{region}"`), or a callable taking the bound parameters (a dict)
            and returning the key. Rendered keys are checked when the task runs.
        ttl: Lease TTL in seconds (5 through 7,776,000); the lease is renewed at about a third of it.
        credentials: A `VolcanoCredentials` block, the name of a saved one (loaded once per
            process, on first use), or None to read `VOLCANO_API_URL` / `VOLCANO_SERVICE_KEY` /
            `VOLCANO_ANON_KEY` from the environment.
        on_contention: What to do when another run holds the lock: `"wait"` until it is free
            (bounded by `wait_timeout`; logged when the wait starts and every minute after),
            `"skip"` (the body does not run; the task run ends Completed, named Skipped, not
            cached, and the call's value is None), or `"fail"` (the task fails with `LockContention`).
        wait_timeout: Seconds to wait with `on_contention="wait"`, finite and >= 0; None waits
            without bound.
        result: `"value"` returns the body's value; `"locked_result"` returns a `LockedResult`
            carrying the value, the lock key and the fencing token.
        once_key: Run once per business key: a template over the task's parameters
            (`"rollup:{day}"`) or a callable, recorded in `ledger`. Once the lock is held the key is
            looked up: when an earlier run (any flow, deployment or orchestrator using the same
            ledger) already did it, the body does not run and the task run ends Completed with a
            message `"Skipped: duplicate run, ..."` naming the first run, its flow run tagged
            `volcano-lock:skipped` and `volcano-lock:duplicate`, and the state's result is the first
            run's recorded result. Otherwise the body does the effect through `current_once()`
            (`.begin()` for SQL, `.publish(files)` for S3), which records the key with it.
        ledger: The run-once ledger of `once_key`: a `SQLLedger` or `S3Ledger` for a sync task, an
            `AsyncSQLLedger` for an async one (`volcano_locks.once`).

    Returns:
        A decorator for a task or a function.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: An argument has an invalid value, named in the message (`InvalidRequest`,
            a `ValueError`, for the key and TTL rules of the Volcano contract).

    Example:
        ```python
        from prefect import flow, task
        from prefect_volcano import current_lease, locked_task

        @locked_task("rollup:{region}", ttl=60, on_contention="skip")
        @task(retries=2)
        def rollup(region: str) -> int:
            return write_rollup(region, fencing_token=current_lease().fencing_token)
        ```
    """
    spec = lock_spec(key, ttl, credentials, on_contention, wait_timeout, result, once_key, ledger)
    return Decorator(spec, "task")


def locked_flow(
    key: KeySpec,
    ttl: int = 30,
    *,
    on_contention: OnContention = "wait",
    wait_timeout: float | None = None,
    credentials: VolcanoCredentials | str | None = None,
) -> Decorator:
    """Make a whole Prefect flow run hold the Volcano lock `key`: one lease for the flow run.

    Works above or below `@flow`, on sync and async flows. The lease is taken before the flow's
    body starts, renewed while it runs and released however it ends. Every task the flow runs
    (called or submitted to Prefect's thread pool) sees the same lease through `current_lease()`.

    With `on_contention="skip"` a flow run that does not get the lock ends in a Completed state
    named Skipped (so the runs list shows which runs did the work) and its value is None. Loss
    fails the flow run: the flow's body is interrupted (sync) or cancelled (async), and
    `current_lease()` raises `OwnershipLost` from then on, so no task that asks for the fencing
    token reports success after the loss.

    Args:
        key: The lock key, or a template over the flow's parameters, or a callable (see `locked_task`).
        ttl: Lease TTL in seconds (5 through 7,776,000).
        on_contention: `"wait"`, `"skip"` or `"fail"`, as for `locked_task`.
        wait_timeout: Seconds to wait with `on_contention="wait"`; None waits without bound.
        credentials: A `VolcanoCredentials` block, a saved block's name, or None (environment).

    Returns:
        A decorator for a flow or a function.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: An argument has an invalid value, named in the message.

    Example:
        ```python
        from prefect import flow
        from prefect_volcano import current_lease, locked_flow

        @locked_flow("nightly:{day}", ttl=60, on_contention="skip")
        @flow
        def nightly(day: str) -> None:
            load(transform(extract(day)))  # every task: current_lease().fencing_token
        ```
    """
    return Decorator(lock_spec(key, ttl, credentials, on_contention, wait_timeout), "flow")
