"""A user's action in the API server frees the handoff lease of the task try it ended (issue 28).

A trigger acquires the lock for its deferred task and writes a handoff record; until the task resumes,
the lease belongs to that try. A user who clears the task, or marks it (or its run) failed or success,
ends the try, and nothing of Airflow's tells a provider: listeners cover a state set in the API server
but not a clear, and a waiter's watch sees a cleared task only in the second it has no state, before the
scheduler schedules the next try. Every such action from the UI or the REST API is a request to the API
server, so this root middleware (registered by the plugin) waits for a successful one and then, off the
request's path, takes the waiters' own decision (``runtime.handoff_look.look_flow``) for every sealed
handoff record whose owner is in that DAG, with the owner's state read from the metadata database: a
third driver of the one decision. The lease is released only if its try can no longer use it and it is
still Volcano's live lease, with the token derived from the record's owner, so the server refuses
(409) the release of any other lease.

A clear from the CLI (``airflow tasks clear``) does not pass through the API server: then a waiter's
watch, or the cleared task's next try at its first refusal, frees the lease, as before.
"""

from __future__ import annotations

import logging
import re
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any

from airflow.configuration import conf
from airflow.models import Variable
from airflow.models.dagrun import DagRun
from airflow.models.taskinstance import TaskInstance
from airflow.utils.session import create_session
from sqlalchemy import select

from airflow_provider_volcano._handoff import _NOT_REPORTED, GroupState
from airflow_provider_volcano.hooks.volcano import VolcanoHook
from airflow_provider_volcano.plugins.board import GovernedReader
from airflow_provider_volcano.records.handoff import HANDOFF_PREFIX, HandoffRecord
from airflow_provider_volcano.records.opened import Opened, open_record
from airflow_provider_volcano.runtime.handoff_look import (
    Answers,
    Look,
    Need,
    drive,
    lease_in,
    look_flow,
    record_of,
)
from volcano_locks import VolcanoError
from volcano_locks.integration import outcome

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.orm import Session

    from volcano_locks import LockState, VolcanoLocks

__all__ = ["UserActions", "acted_on", "db_owner_state", "free_after_action"]

log = logging.getLogger(__name__)

_DAG_PATH = re.compile(r"/api/v2/dags/(?P<dag_id>[^/]+)/(?P<rest>.+)$")


def acted_on(method: str, path: str) -> str | None:
    """The DAG whose task tries a request may have ended (``~``: any DAG), or ``None``.

    A clear (``POST .../clearTaskInstances``, ``POST .../dagRuns/<run>/clear``) or a state set
    (``PATCH`` of task instances or of a DAG run) may; reads and everything else may not.
    """
    found = _DAG_PATH.search(path)
    if found is None:
        return None
    rest = found["rest"]
    if method == "PATCH" and rest.startswith("dagRuns"):
        return found["dag_id"]
    if method == "POST" and (rest == "clearTaskInstances" or rest.endswith("/clear")):
        return found["dag_id"]
    return None


def _value(state: object) -> object:
    """A state as the decision compares it: a plain string (Airflow's are ``str`` enums) or ``None``."""
    return None if state is None else str(getattr(state, "value", state))


def db_owner_state(session: Session, record: HandoffRecord) -> object:
    """What the metadata database says of the record's owner, as ``owner_state`` says it from the Task SDK.

    A task instance that moved on to a later try than the record's answers ``None`` (the record's try was
    cleared), as it does while the cleared task instance has no state yet.
    """
    owner = record.owner
    if record.kind == "group":
        run = session.scalar(
            select(DagRun.state).where(DagRun.dag_id == owner.dag_id, DagRun.run_id == owner.run_id)
        )
        release: object = _NOT_REPORTED
        if record.release_task_id is not None:
            found = session.execute(
                select(TaskInstance.state).where(
                    TaskInstance.dag_id == owner.dag_id,
                    TaskInstance.run_id == owner.run_id,
                    TaskInstance.task_id == record.release_task_id,
                    TaskInstance.map_index == owner.map_index,
                )
            ).first()
            release = _NOT_REPORTED if found is None else _value(found[0])
        return GroupState(_NOT_REPORTED if run is None else _value(run), release)
    row = session.execute(
        select(TaskInstance.state, TaskInstance.try_number).where(
            TaskInstance.dag_id == owner.dag_id,
            TaskInstance.run_id == owner.run_id,
            TaskInstance.task_id == owner.task_id,
            TaskInstance.map_index == owner.map_index,
        )
    ).first()
    if row is None:
        return _NOT_REPORTED  # not in the database (a run deleted): safety over liveness
    state, try_number = row
    if try_number is not None and try_number > owner.try_number:
        return None
    return _value(state)


def _handoff_texts(session: Session) -> list[tuple[str, str]]:
    pattern = HANDOFF_PREFIX.replace("_", r"\_") + "%"
    rows = session.scalars(select(Variable).where(Variable.key.like(pattern, escape="\\")))
    return [(var.key[len(HANDOFF_PREFIX) :], var.val) for var in rows]


def _names_dag(text: str, dag_id: str) -> bool:
    """Whether a record's (not yet verified) owner is in ``dag_id``: a filter only, nothing rests on it."""
    return dag_id == "~" or f'"dag_id": "{dag_id}"' in text or f'"dag_id":"{dag_id}"' in text


def free_after_action(
    dag_id: str,
    hook: VolcanoHook,
    client: VolcanoLocks,
    live: Callable[[str], LockState | None],
    logger: logging.Logger | Any = log,
) -> list[Look]:
    """After a user's action in ``dag_id``: one decision per handoff record whose owner is in that DAG.

    :param live: reads a lock's live state now (the board's governed read); ``None``: no answer.
    :returns: how each look ended (a lease freed: ``Look.freed``).
    """
    with create_session() as session:
        texts = [(key, text) for key, text in _handoff_texts(session) if _names_dag(str(text), dag_id)]
    looks = []
    for key, text in texts:
        name = f"Variable {HANDOFF_PREFIX + key!r}"
        opened = open_record(hook.keyring, HandoffRecord, text, lock_key=key, name=name, logger=logger)
        if opened.record is None or (dag_id != "~" and opened.record.owner.dag_id != dag_id):
            continue
        looks.append(_drive(key, opened, hook, client, live, logger))
    return looks


def _drive(
    key: str,
    opened: Opened[HandoffRecord],
    hook: VolcanoHook,
    client: VolcanoLocks,
    live: Callable[[str], LockState | None],
    logger: logging.Logger | Any,
) -> Look:
    """Drive :func:`look_flow` for one record, with no waiter of its own (the API server waits for none)."""

    def state(need: Need) -> object:
        with create_session() as session:
            return db_owner_state(session, record_of(need))

    answers: Answers[object] = Answers(
        record=lambda need: opened,
        state=state,
        live=lambda need: live(key),
        release=lambda need: outcome(partial(client.release, key, lease_in(need))),
        tell=lambda need: logger.info("%s (after a user's action in the API server)", need.line),
        clear=lambda need: _delete_if_still(hook, key, record_of(need)),
    )
    return drive(look_flow(key, (), lambda owner, seal: hook.ownership_token(owner, key, seal)), answers)


def _delete_if_still(hook: VolcanoHook, key: str, record: HandoffRecord) -> None:
    """Delete the record's Variable if it still names the lease that was freed (best effort)."""
    name = HANDOFF_PREFIX + key
    try:
        with create_session() as session:
            text = session.scalar(select(Variable).where(Variable.key == name))
            now = open_record(
                hook.keyring, HandoffRecord, text.val if text else None, lock_key=key, name=name
            )
            if now.record is not None and now.record.fencing_token == record.fencing_token:
                Variable.delete(name, session=session)
    except Exception as exc:
        log.warning("Could not delete Variable %r: %s", name, exc)


class UserActions:
    """The API server's root middleware: after a clear or a state set in a DAG, free what it stranded.

    The work runs on one background thread after the response is sent: the user's request is never
    slowed or failed by it, and actions are handled one at a time, in the order they came.
    """

    def __init__(self, app: Any, conn_id: str | None = None) -> None:
        self.app = app
        self._conn_id = conn_id or conf.get("volcano", "board_conn_id", fallback="volcano_default")
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="volcano-user-actions")
        self._parts: tuple[VolcanoHook, VolcanoLocks, Callable[[str], LockState | None]] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        dag_id = acted_on(scope.get("method", ""), scope.get("path", "")) if scope["type"] == "http" else None
        if dag_id is None:
            await self.app(scope, receive, send)
            return
        status = 0

        async def sending(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        await self.app(scope, receive, sending)
        if 200 <= status < 300:
            self._pool.submit(self._free, dag_id)

    def _free(self, dag_id: str) -> None:
        try:
            hook, client, live = self._connected()
            for done in free_after_action(dag_id, hook, client, live):
                if done.warning is not None:
                    log.warning("%s", done.warning)
        except Exception:  # a failure here must never reach a user's request: log it and go on
            log.exception("Freeing the handoff leases after a user's action in DAG %r failed", dag_id)

    def _connected(self) -> tuple[VolcanoHook, VolcanoLocks, Callable[[str], LockState | None]]:
        if self._parts is None:
            hook = VolcanoHook(self._conn_id)
            client = hook.get_client()
            self._parts = (hook, client, partial(_live, GovernedReader(client, keys=hook.keyring)))
        return self._parts


def _live(reader: GovernedReader, key: str) -> LockState | None:
    """The lock's live state, read as the board reads it for a user's force release (the request budget,
    ahead of the waiters' reads); ``None`` if Volcano did not answer or the budget admits no read."""
    try:
        return reader.look_for_release(key).state
    except VolcanoError as exc:
        log.warning("Could not read lock %r after a user's action: %s", key, exc)
        return None
