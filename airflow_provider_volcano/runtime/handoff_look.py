"""A look at a lock's handoff record: one decision, a sync driver and an async driver.

A waiter (a task waiting in its worker slot, or the triggerer's watch of a key) looks every few
seconds at the lock's handoff record (:mod:`airflow_provider_volcano._handoff`) and frees the lease it
names when the try it was acquired for can no longer use it. The decision is :func:`look_flow`, a
generator without I/O (as the core's flows are): it yields what it needs done, a :class:`Need`, and
gets the answer back. :func:`drive` runs it in a thread and :func:`adrive` in an event loop, each
answering from an :class:`Answers` (one callable per kind of need): :func:`look` in the waiting task's
thread, :func:`alook` in the triggerer's event loop (every Airflow call there bounded and off the loop),
and the API server after a user's action (:mod:`airflow_provider_volcano.plugins.actions`). What a
look ends with is a :class:`Look`: the record still standing, its owner's state, and the line to log.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Generator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

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

__all__ = [
    "Answers",
    "Look",
    "Need",
    "adrive",
    "alook",
    "drive",
    "first_answer",
    "lease_in",
    "look",
    "look_flow",
    "record_of",
    "waiting_facts",
]

logger = logging.getLogger(__name__)
A = TypeVar("A")


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


@dataclass(frozen=True)
class Answers(Generic[A]):
    """How a driver answers each :class:`Need` of :func:`look_flow`: one callable per kind, given the need
    (for the async driver each returns an awaitable)."""

    record: Callable[[Need], A]
    state: Callable[[Need], A]
    live: Callable[[Need], A]
    release: Callable[[Need], A]
    tell: Callable[[Need], A]
    clear: Callable[[Need], A]


def drive(flow: Generator[Need, object, Look], answers: Answers[object]) -> Look:
    """Run ``flow`` to its :class:`Look`, answering each need in this thread."""
    answer: object = None
    try:
        while True:
            need = flow.send(answer)
            answer = getattr(answers, need.what)(need)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def adrive(flow: Generator[Need, object, Look], answers: Answers[Awaitable[object]]) -> Look:
    """Run ``flow`` to its :class:`Look` in the event loop, awaiting each need's answer."""
    answer: object = None
    try:
        while True:
            need = flow.send(answer)
            answer = await getattr(answers, need.what)(need)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def record_of(need: Need) -> HandoffRecord:
    """The record a need is about (every need but ``record`` carries it)."""
    assert need.record is not None
    return need.record


def lease_in(need: Need) -> LeaseRef:
    """The lease a ``release`` need names."""
    assert need.lease is not None
    return need.lease


def look(
    key: str, waiters: Collection[TaskIdentity | None], client: VolcanoLocks, hook: VolcanoHook, log: Any
) -> Look:
    """One look, in the waiting task's thread (the in-slot wait); its lines go to ``log``."""
    keys = hook.keyring
    answers: Answers[object] = Answers(
        record=lambda need: read_handoff(keys, key, log),
        state=lambda need: owner_state(record_of(need)),
        live=lambda need: read_state(client, key, log),
        release=lambda need: outcome(partial(client.release, key, lease_in(need))),
        tell=lambda need: log.info("%s", need.line),
        clear=lambda need: clear_handoff(keys, key, record_of(need).fencing_token, log),
    )
    return drive(look_flow(key, waiters, _token_for(hook, key)), answers)


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

    async def record(need: Need) -> object:
        return await ask(f"the handoff record of lock {key!r}", read_handoff, keys, key, log, default=None)

    async def state(need: Need) -> object:
        owner = record_of(need)
        return await ask(f"the state of {owner.names()}", owner_state, owner, default=_NOT_REPORTED)

    async def live_now(need: Need) -> object:
        return await live()

    async def release(need: Need) -> object:
        return await async_outcome(client.release(key, lease_in(need)))

    async def told(need: Need) -> object:
        return tell(str(need.line))

    async def clear(need: Need) -> object:
        fencing = record_of(need).fencing_token
        what = f"the deletion of the handoff record of lock {key!r}"
        return await ask(what, clear_handoff, keys, key, fencing, log, default=None)

    answers: Answers[Awaitable[object]] = Answers(record, state, live_now, release, told, clear)
    return await adrive(look_flow(key, waiters, _token_for(hook, key)), answers)


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
