"""A waiter's look at its lock's handoff record: one decision, a sync driver and an async driver.

A waiter (a task waiting in its worker slot, or the triggerer's watch of a key) looks every few
seconds at the lock's handoff record (:mod:`airflow_provider_volcano._handoff`) and frees the lease it
names when the try it was acquired for can no longer use it. The decision is :func:`look_flow`, a
generator without I/O (as the core's flows are): it yields what it needs done, a :class:`Need`, and
gets the answer back; :func:`look` drives it in the waiting task's thread, :func:`alook` in the
triggerer's event loop (every Airflow call there bounded and off the loop). What a look ends with is a
:class:`Look`: the record still standing, its owner's state, and the line to log.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Generator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from airflow_provider_volcano._handoff import (
    _NOT_REPORTED,
    lease_of,
    live_is,
    owner_state,
    released_line,
    unusable_because,
)
from airflow_provider_volcano.records.handoff import HandoffRecord, clear_handoff, read_handoff
from airflow_provider_volcano.records.opened import Opened
from airflow_provider_volcano.runtime.acquiring import read_state
from airflow_provider_volcano.runtime.airflow_calls import ask
from airflow_provider_volcano.runtime.waiting_line import holder_line
from volcano_locks import ConflictError, LeaseRef, LockState, VolcanoError
from volcano_locks.integration import async_outcome, outcome, wake

if TYPE_CHECKING:
    from airflow_provider_volcano._tokens import TaskIdentity
    from airflow_provider_volcano.hooks.volcano import VolcanoHook
    from airflow_provider_volcano.records.seal import SealKey
    from volcano_locks import AsyncVolcanoLocks, LockLease, VolcanoLocks

__all__ = ["Look", "Need", "alook", "first_answer", "look", "look_flow", "waiting_facts"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Need:
    """What the decision needs done: read the ``record`` (the answer: an ``Opened``), the ``state`` of
    its owner, the ``live`` lock, ``release`` the lease (the answer: ``None`` or the ``VolcanoError``),
    ``tell`` the waiters ``line`` (at once: a waiter may take the lock and stop looking), or ``clear``
    the record."""

    what: Literal["record", "state", "live", "release", "tell", "clear"]
    key: str
    record: HandoffRecord | None = None
    lease: LeaseRef | None = None
    line: str | None = None


@dataclass(frozen=True)
class Look:
    """How one look ended.

    :param record: the handoff record still standing (``None`` when there is none, or it was freed).
    :param state: its owner's state as Airflow reported it (``_NOT_REPORTED`` when it was not asked).
    :param warning: a line to log as a warning (``None``: nothing went wrong).
    :param freed: the lease was freed (or found gone): wake the key's waiters.
    """

    record: HandoffRecord | None
    state: object = _NOT_REPORTED
    warning: str | None = None
    freed: bool = False


TokenFor = Callable[["TaskIdentity", "SealKey | None"], str]


def look_flow(
    key: str, waiters: Collection[TaskIdentity | None], token_for: TokenFor
) -> Generator[Need, object, Look]:
    """Decide one look at ``key``'s handoff record for ``waiters`` (the tries waiting on it here).

    Only a sealed record is believed (the reader opens it); the lease it names is released only when
    its owner can no longer use it and it is still the live lease (a record that outlived its lease
    decides nothing). ``token_for(owner, key)`` derives that owner's ownership token with the key that
    sealed the record: the server refuses (409) the release of any lease but the one that try holds.
    """
    opened = yield Need("record", key)
    record = opened.record if isinstance(opened, Opened) else None
    if record is None or any(record.owner == w for w in waiters):
        return Look(record)  # none, or ours: never freed by our own wait
    state = yield Need("state", key, record)
    reason = next(
        (why for w in waiters or (None,) if (why := unusable_because(record, state, w)) is not None), None
    )
    if reason is None:
        return Look(record, state)
    live = yield Need("live", key, record)
    if not live_is(record, live if isinstance(live, LockState) else None):
        return Look(record, state)
    assert isinstance(opened, Opened)
    answer = yield Need("release", key, record, lease_of(record, token_for(record.owner, opened.key)))
    if isinstance(answer, VolcanoError) and not isinstance(answer, ConflictError):
        # Looked at again next time; a 409 means that try's lease is gone already (lapsed or released).
        return Look(record, state, f"Could not release the stranded handoff of lock {key!r}: {answer}")
    if answer is None:
        yield Need("tell", key, record, line=released_line(record, reason))
    yield Need("clear", key, record)
    return Look(None, state, freed=True)


def look(
    key: str, waiters: Collection[TaskIdentity | None], client: VolcanoLocks, hook: VolcanoHook, log: Any
) -> Look:
    """One look, in the waiting task's thread (the in-slot wait); its lines go to ``log``."""
    keys = hook.keyring
    flow = look_flow(key, waiters, _token_for(hook, key))
    answer: object = None
    try:
        while True:
            need = flow.send(answer)
            record = need.record
            if need.what == "record":
                answer = read_handoff(keys, key, log)
            elif need.what == "state":
                assert record is not None
                answer = owner_state(record)
            elif need.what == "live":
                answer = read_state(client, key, log)
            elif need.what == "release":
                assert need.lease is not None
                answer = outcome(partial(client.release, key, need.lease))
            elif need.what == "tell":
                log.info("%s", need.line)
                answer = None
            else:
                assert record is not None
                clear_handoff(keys, key, record.fencing_token, log)
                answer = None
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def alook(
    key: str,
    waiters: Collection[TaskIdentity | None],
    client: AsyncVolcanoLocks,
    hook: VolcanoHook,
    log: Any,
    *,
    live: Callable[[], Awaitable[LockState | None]],
    tell: Callable[[str], object],
) -> Look:
    """One look, in the triggerer's event loop: each Airflow call bounded, a silent one "not known".

    :param live: reads the live lock now (the watch's shared read, made fresh).
    :param tell: says a line in every waiting trigger's log.
    """
    keys = hook.keyring
    flow = look_flow(key, waiters, _token_for(hook, key))
    answer: object = None
    try:
        while True:
            need = flow.send(answer)
            record = need.record
            if need.what == "record":
                answer = await ask(
                    f"the handoff record of lock {key!r}", read_handoff, keys, key, log, default=None
                )
            elif need.what == "state":
                assert record is not None
                answer = await ask(
                    f"the state of {record.names()}", owner_state, record, default=_NOT_REPORTED
                )
            elif need.what == "live":
                answer = await live()
            elif need.what == "release":
                assert need.lease is not None
                answer = await async_outcome(client.release(key, need.lease))
            elif need.what == "tell":
                tell(str(need.line))
                answer = None
            else:
                assert record is not None
                answer = await ask(
                    f"the deletion of the handoff record of lock {key!r}",
                    clear_handoff,
                    keys,
                    key,
                    record.fencing_token,
                    log,
                    default=None,
                )
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def first_answer(
    attempt: Callable[[], LockLease],
    hook: VolcanoHook,
    client: VolcanoLocks,
    key: str,
    waiter: TaskIdentity,
    log: Any,
) -> LockLease:
    """``attempt()``; on a refusal, one :func:`look` for ``waiter`` and, if it freed the lease, once more.

    Issue 28: a try that finds its lock held by a handoff whose try was marked failed, cleared, or died
    before its body (or by its own earlier try's) frees it there and then, by the same decision
    (:func:`look_flow`) as the waits: user actions are honoured within seconds whether or not a waiter
    has deferred, with no scheduler, no trigger and no waiter in a slot needed.

    :raises volcano_locks.ConflictError: the refusal, when no stranded handoff stood in the way (or
        the second attempt's, when another waiter was quicker).
    """
    try:
        return attempt()
    except ConflictError:
        try:
            done = look(key, (waiter,), client, hook, log)
        except Exception as exc:  # a look never turns a refusal into another failure
            log.warning("Looking at the handoff record of lock %r failed: %s", key, exc)
            raise
        if done.warning is not None:
            log.warning("%s", done.warning)
        if not done.freed:
            raise
        wake(key)
    return attempt()


waiting_facts = holder_line  # the waiting lines' holder (issue 28: runtime/waiting_line)


def _token_for(hook: VolcanoHook, key: str) -> TokenFor:
    """The ownership token of a record's owner for ``key``, derived with the key that sealed the record."""
    return lambda owner, seal: hook.ownership_token(owner, key, seal)
