"""Airflow calls from a trigger's event loop: off the loop, each in bounded time, none behind another.

Trigger code reads and writes Airflow's state (Variables, task states) with the Task SDK's synchronous
calls, which in a triggerer travel to its supervisor and back. The supervisor answers on one thread,
and on a fresh triggerer its first answer waits for Airflow to build its in-process Execution API (see
:mod:`airflow_provider_volcano.runtime.execution_api`): tens of seconds on a busy machine. So trigger code
never calls Airflow on the event loop, never waits for an answer without a bound, and never puts one
call behind another: ``asgiref``'s default ``sync_to_async`` runs every call of the process in *one*
shared thread, so one unanswered read held the handoff record's write, and the lock's event with it.

:func:`ask` runs one call in a thread of the event loop's own small pool (never the loop's default
executor, which name resolution for the lock client's requests uses), in the caller's context (the
triggerer routes log lines by it), and gives Airflow ``ANSWER_WITHIN`` seconds: then the caller goes on
with ``default`` and a warning names what Airflow did not answer. What a trigger cannot go on without
(its connection) is awaited with :func:`awaited`, which says every ``ANSWER_WITHIN`` seconds that Airflow
has not answered yet, instead of waiting in silence.

Under ``dag.test()`` the channel is Airflow's in-process one, which is not a channel at all: it answers on
the calling thread and swaps the Task SDK's ``SUPERVISOR_COMMS`` global while it does. Two calls at once,
or one still running in a thread after the trigger ended, leave that global naming the trigger's
supervisor, and the resumed task's end is then recorded by the wrong one (Airflow's ``None is not a valid
TerminalStateNonSuccess``). There, :func:`ask` calls Airflow on the loop, one call at a time.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from airflow.sdk.execution_time import task_runner
from airflow.sdk.execution_time.comms import CommsDecoder
from asgiref.sync import sync_to_async

__all__ = ["ANSWER_WITHIN", "ask", "awaited", "channel_serves_threads"]

T = TypeVar("T")

log = logging.getLogger(__name__)

ANSWER_WITHIN = 3.0
"""Seconds a trigger gives Airflow to answer one call (a Variable read or write, a task state)."""
_THREADS = 4
"""Airflow calls one event loop may have in flight: calls beyond wait for a thread, within their bound."""

_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ThreadPoolExecutor] = weakref.WeakKeyDictionary()


def channel_serves_threads() -> bool:
    """Whether Airflow calls travel a real channel to a supervisor, which takes calls from several threads.

    ``False`` under ``dag.test()`` (Airflow's in-process channel) and outside Airflow.
    """
    return isinstance(getattr(task_runner, "SUPERVISOR_COMMS", None), CommsDecoder)


def _pool(loop: asyncio.AbstractEventLoop) -> ThreadPoolExecutor:
    pool = _POOLS.get(loop)
    if pool is None:
        pool = _POOLS[loop] = ThreadPoolExecutor(_THREADS, thread_name_prefix="volcano-airflow-call")
    return pool


async def ask(
    what: str,
    call: Callable[..., T],
    *args: Any,
    default: T,
    within: float = ANSWER_WITHIN,
    logger: logging.Logger | Any = log,
) -> T:
    """Run the synchronous Airflow call ``call(*args)`` off the loop; ``default`` if it takes over ``within``.

    :param what: what is asked, for the warning (e.g. "the handoff record of lock 'x'"; never a secret).
    :param call: a Task SDK call (``Variable.get``...) or a function made of them.
    :param default: what the caller goes on with when Airflow does not answer in time.
    :param within: seconds Airflow has to answer.
    :param logger: where the warning goes (a trigger's ``self.log``: the task's log).
    """

    if getattr(task_runner, "SUPERVISOR_COMMS", None) is not None and not channel_serves_threads():
        return call(*args)  # dag.test(): answered in-process, at once (see the module's docstring)
    # asgiref, not a bare executor: on Airflow 3.1 the SDK's call reaches the event loop through the
    # thread asgiref marks; thread_sensitive=False with a pool of our own keeps it off the shared thread.
    runner = sync_to_async(call, thread_sensitive=False, executor=_pool(asyncio.get_running_loop()))
    try:
        return await asyncio.wait_for(runner(*args), within)
    except TimeoutError:
        logger.warning("Airflow did not answer %s within %g s; going on without it", what, within)
        return default


async def awaited(
    what: str, answer: Awaitable[T], *, every: float = ANSWER_WITHIN, logger: logging.Logger | Any = log
) -> T:
    """Await an Airflow answer the caller cannot go on without, saying every ``every`` s that it is late."""
    task = asyncio.ensure_future(answer)
    waited = 0.0
    while True:
        try:
            return await asyncio.wait_for(asyncio.shield(task), every)
        except TimeoutError:
            waited += every
            logger.warning("Airflow has not answered %s for %g s; still waiting", what, waited)
        except asyncio.CancelledError:
            task.cancel()
            raise
