"""A trigger's Airflow calls run off its event loop, in bounded time, and never queue behind each other.

The calls here are real blocking functions in real threads (a call Airflow does not answer is a thread
waiting for the supervisor); the full stack that makes Airflow slow for real is
``test_triggerer_stack.py``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading

import pytest

from airflow_provider_volcano.runtime.airflow_calls import ask, awaited

WHO = contextvars.ContextVar("who", default="nobody")


async def test_an_answer_comes_back_from_a_thread_of_its_own_in_the_callers_context() -> None:
    WHO.set("trigger 7")
    loop_thread = threading.get_ident()

    def call(x: int) -> tuple[int, str, bool]:
        return x * 2, WHO.get(), threading.get_ident() != loop_thread

    assert await ask("a sum", call, 21, default=(0, "", False)) == (42, "trigger 7", True)


async def test_under_dag_test_the_in_process_channel_is_asked_on_the_loop_one_call_at_a_time() -> None:
    # Airflow's in-process channel swaps the SDK's SUPERVISOR_COMMS while it answers: a call on another
    # thread, still running when the trigger ends, left it naming the trigger's supervisor, and the
    # resumed task's end was recorded by the wrong one (CI: "None is not a valid TerminalStateNonSuccess").
    from airflow.sdk.execution_time.supervisor import set_supervisor_comms

    loop_thread = threading.get_ident()
    with set_supervisor_comms(object()):  # dag.test()'s channel is not a CommsDecoder
        assert await ask("a thread", threading.get_ident, default=0) == loop_thread
    assert await ask("a thread", threading.get_ident, default=0) != loop_thread  # outside Airflow


async def test_an_unanswered_call_gives_the_default_and_says_what_went_unanswered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answer = threading.Event()
    try:
        with caplog.at_level(logging.WARNING):
            got = await ask("the handoff record of lock 'k'", answer.wait, 30, default="unknown", within=0.2)
    finally:
        answer.set()
    assert got == "unknown"
    said = "Airflow did not answer the handoff record of lock 'k' within 0.2 s; going on without it"
    assert said in caplog.text


async def test_a_call_airflow_does_not_answer_never_holds_the_next_one() -> None:
    # asgiref's default sync_to_async runs every call in one shared thread: the second call waited for
    # the first. Here each has a thread, and the loop stays free meanwhile.
    first = threading.Event()
    try:
        stuck = asyncio.ensure_future(ask("a stuck call", first.wait, 30, default=False, within=20))
        await asyncio.sleep(0.05)
        assert await ask("the next call", lambda: "answered", default="late", within=10) == "answered"
        assert not stuck.done()
    finally:
        first.set()
    assert await stuck is True


async def test_awaited_says_while_an_answer_is_late_and_returns_it(caplog: pytest.LogCaptureFixture) -> None:
    async def late_answer() -> str:
        await asyncio.sleep(0.35)
        return "conn"

    with caplog.at_level(logging.WARNING):
        assert await awaited("the lookup of connection 'vc'", late_answer(), every=0.1) == "conn"
    late = [r.getMessage() for r in caplog.records if "has not answered" in r.getMessage()]
    assert late, caplog.text
    assert late[0] == "Airflow has not answered the lookup of connection 'vc' for 0.1 s; still waiting"


async def test_awaited_cancelled_cancels_what_it_waits_for() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def never() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    waiting = asyncio.ensure_future(awaited("never", never(), every=0.05))
    await started.wait()
    await asyncio.sleep(0.12)  # past two warnings
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.wait_for(cancelled.wait(), 5)
