"""What the lock board shows: every lock the deployment uses, its live state, its holder and its line.

The metadata database says which locks the deployment uses and who is in them: holder records and
handoff records (Variables), deferred task instances whose trigger is a
:class:`~airflow_provider_volcano.triggers.lock.VolcanoLockTrigger` (the lock key is in the trigger's
kwargs), tasks waiting in their worker slot (the ``volcano_waiting`` XCom) and literal ``lock_key``
arguments of parsed DAGs. Volcano says who holds each lock now; those looks go through
:class:`GovernedReader`, so the page never spends what the holders need.

Building a board is two steps so that permission comes first: the rows come from the metadata database
alone, the caller keeps the rows its user may see (:mod:`airflow_provider_volcano.plugins.access`), and
only those are read from Volcano. The stored provenance of a lock is read in one place,
:func:`board_holder`; what a Variable says is a claim until its seal verifies.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.models import Variable
from airflow.models.serialized_dag import SerializedDagModel
from airflow.models.taskinstance import TaskInstance
from airflow.models.trigger import Trigger
from airflow.models.xcom import XComModel
from airflow.utils.state import TaskInstanceState

from airflow_provider_volcano.plugins.history import Tenure, expected_starts, read_tenures, tenures_seen
from airflow_provider_volcano.records.handoff import HANDOFF_PREFIX, HandoffRecord
from airflow_provider_volcano.records.holder import HOLDER_PREFIX, HolderRecord
from airflow_provider_volcano.records.in_slot import WAITING_XCOM_KEY
from airflow_provider_volcano.records.opened import open_record
from airflow_provider_volcano.records.tenure import TENURE_PREFIX
from volcano_locks import VolcanoError
from volcano_locks.integration import lease_clock

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from airflow_provider_volcano.records.seal import Keyring
    from volcano_locks import LockState, VolcanoLocks
    from volcano_locks.integration import Eta

__all__ = [
    "TRIGGER_CLASSPATH",
    "Board",
    "GovernedReader",
    "Holder",
    "LockRow",
    "Look",
    "Provenance",
    "Waiter",
    "board_holder",
    "collect",
    "resolve_holder",
]

log = logging.getLogger(__name__)
R = TypeVar("R", HolderRecord, HandoffRecord)

TRIGGER_CLASSPATH = "airflow_provider_volcano.triggers.lock.VolcanoLockTrigger"
REFRESH_INTERVAL = 10.0
"""Seconds a look at one lock is reused before the board may spend another (the page's refresh)."""
ACTION_WAIT = 2.0
"""Seconds a user's force release waits for the budget to admit its look before it says "not now"."""


@dataclass(frozen=True)
class Look:
    """A lock's live state as the board last read it (``state`` is ``None``: not read yet)."""

    state: LockState | None
    read_at: datetime | None
    error: str | None = None


class GovernedReader:
    """Reads locks from Volcano at most once per lock per refresh interval, from the waiting budget.

    Each look reserves a request from the core's governor (the waiting budget of the credential, the
    same one the process's waiters share) and is sent only if the governor admits it now; otherwise
    the reservation is handed back and the board shows the last look (or "not read yet"). Keeping
    requests (renewals, releases) are never delayed by the governor, so the board cannot cost the
    holders a refused renewal; it costs at most its budget, whatever the number of locks.

    :param client: the Volcano client (its governor is the credential's).
    :param refresh: seconds a look is reused.
    :param clock: the lease clock (the governor's), injectable for tests.
    :param sleep: how a user's force release waits for the budget (injectable for tests).
    :param keys: the connection's keyring: records are believed only once their seal verifies under
        it (``None``: no record is believed, every holder is unknown).
    """

    def __init__(
        self,
        client: VolcanoLocks,
        refresh: float = REFRESH_INTERVAL,
        clock: Callable[[], float] = lease_clock,
        keys: Keyring | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.keys = keys
        self._client = client
        self._refresh = refresh
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, Look]] = {}
        self.sent = 0
        """Looks sent to Volcano so far (the page's whole cost)."""

    def look(self, key: str) -> Look:
        """The lock's state: a fresh look if one is due and the budget admits it, else the last one."""
        governor = self._client.governor
        with self._lock:
            now = self._clock()
            cached = self._cache.get(key)
            if cached is not None and now - cached[0] < self._refresh:
                return cached[1]
            if governor.reserve() > self._clock():
                governor.refund()  # not admitted now: the page waits, the holders never do
                return cached[1] if cached is not None else Look(None, None)
            self._cache[key] = (now, cached[1] if cached is not None else Look(None, None))
            self.sent += 1
        try:
            governor.note_waiting()
            look = Look(self._client.get(key), datetime.now(UTC))
        except VolcanoError as exc:
            look = Look(None, datetime.now(UTC), error=f"{type(exc).__name__}: {exc}")
        with self._lock:
            self._cache[key] = (now, look)
        return look

    def look_for_release(self, key: str, wait: float = ACTION_WAIT) -> Look:
        """A fresh look for a user's force release, from the waiting budget ahead of the waiters' reads.

        Only an authorised release asks (permission is checked first). It is admitted at once unless a
        429's ``Retry-After`` holds the budget; then it waits up to ``wait`` seconds, else hands the
        reservation back and returns a look with no state saying when to try again.

        :raises VolcanoError: Volcano did not answer the read.
        """
        governor = self._client.governor
        admitted = governor.reserve(priority=True)
        delay = admitted - self._clock()
        if delay > wait:
            governor.refund()
            return Look(
                None, None, error=f"the request budget admits no read for {delay:.0f} s; try again then"
            )
        if delay > 0:
            self._sleep(delay)
        with self._lock:
            self.sent += 1
        governor.note_waiting()
        look = Look(self._client.get(key), datetime.now(UTC))
        with self._lock:
            self._cache[key] = (self._clock(), look)
        return look

    def force_release(self, key: str) -> None:
        """End the lock's current lease, whoever holds it (a user's direct action)."""
        self._client.force_release(key)


@dataclass(frozen=True)
class Holder:
    """The task try holding a lock, when it is in this deployment."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    hostname: str | None
    acquired_at: str | None
    last_renewal: datetime | None
    handoff: bool = False

    def names(self) -> str:
        """The try as the board names it."""
        mapped = f" [{self.map_index}]" if self.map_index >= 0 else ""
        return f"{self.dag_id} / {self.run_id} / {self.task_id}{mapped} try {self.try_number}"


@dataclass(frozen=True)
class Waiter:
    """A task instance waiting for a lock: deferred (its trigger waits) or in its worker slot."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    try_number: int
    since: datetime
    where: str
    eta: Eta | None = None
    """When it may expect its turn (``None``: no estimate yet), from its place in the whole line."""

    @classmethod
    def of(cls, ti: Any, since: datetime, where: str) -> Waiter:
        """The waiter that task instance row ``ti`` is, waiting since ``since`` (``where``: how)."""
        return cls(ti.dag_id, ti.run_id, ti.task_id, ti.map_index, ti.try_number, _aware(since), where)

    def names(self) -> str:
        """The task instance as the board names it."""
        mapped = f" [{self.map_index}]" if self.map_index >= 0 else ""
        return f"{self.dag_id} / {self.run_id} / {self.task_id}{mapped} try {self.try_number}"

    def waited(self, now: datetime) -> timedelta:
        """How long it has waited."""
        return max(timedelta(0), now - self.since)


@dataclass(frozen=True)
class Provenance:
    """Who acquired a lock's lease ``fencing_token``, from a record whose seal verified (bound to the lease).

    :param holder: the task try the record names (``last_renewal`` unknown until Volcano is read).
    :param fencing_token: the lease the record describes.
    :param ttl: the lease's TTL (seconds), when the record says.
    """

    holder: Holder
    fencing_token: int
    ttl: int | None


def board_holder(
    keys: Keyring | None, lock_key: str, holder_text: object, handoff_text: object
) -> tuple[Provenance, ...]:
    """The provenance a lock's stored records give: the one place the board reads them.

    A record is believed only when its seal verifies under the connection's ``keys`` and it is bound to
    ``lock_key`` (:func:`~airflow_provider_volcano.records.open_record`, which logs the others): anyone
    who may write a Variable could have written an unsealed one. Without ``keys`` nothing is believed.

    :param holder_text: the holder record Variable's value (or ``None``).
    :param handoff_text: the handoff record Variable's value (or ``None``).
    """
    if keys is None:
        return ()
    ring = keys

    def opened(kind: type[R], text: object, prefix: str) -> R | None:
        return open_record(
            ring, kind, text, lock_key=lock_key, name=f"Variable {prefix + lock_key!r}", logger=log
        ).record

    found: list[Provenance] = []
    if (held := opened(HolderRecord, holder_text, HOLDER_PREFIX)) is not None:
        holder = Holder(
            held.dag_id,
            held.run_id,
            held.task_id,
            held.map_index,
            held.try_number,
            held.hostname,
            held.acquired_at,
            None,
        )
        found.append(Provenance(holder, held.fencing_token, held.ttl))
    if (handoff := opened(HandoffRecord, handoff_text, HANDOFF_PREFIX)) is not None:
        o = handoff.owner
        holder = Holder(o.dag_id, o.run_id, o.task_id, o.map_index, o.try_number, None, None, None, True)
        found.append(Provenance(holder, handoff.fencing_token, None))
    return tuple(found)


@dataclass
class LockRow:
    """One lock on the board."""

    key: str
    look: Look = field(default_factory=lambda: Look(None, None))
    holder: Holder | None = None
    waiters: list[Waiter] = field(default_factory=list)
    named_by: set[str] = field(default_factory=set)
    claims: tuple[Provenance, ...] = ()
    holder_hidden: bool = False
    """The holder is a task of a DAG the viewing user may not read."""
    hidden_waiters: int = 0
    """Waiters of DAGs the viewing user may not read (left out of ``waiters``)."""
    tenures: list[Tenure] = field(default_factory=list)
    """Its latest tenures, newest first (sealed tenure records)."""

    def dags(self) -> set[str]:
        """The DAGs this lock belongs to: those naming its key or waiting for it, its (sealed) holders'."""
        return set(self.named_by) | {w.dag_id for w in self.waiters} | {c.holder.dag_id for c in self.claims}

    def sealed_dag(self, fencing_token: int) -> str | None:
        """The DAG of the sealed provenance of lease ``fencing_token`` (``None``: unknown or unsealed)."""
        for claim in self.claims:
            if claim.fencing_token == fencing_token:
                return claim.holder.dag_id
        return None

    @property
    def held(self) -> bool | None:
        """Held now (``None``: not read yet)."""
        return None if self.look.state is None else self.look.state.held

    def expires_in(self, now: datetime) -> float | None:
        """Seconds until the live lease expires."""
        state = self.look.state
        if state is None or state.expires_at is None:
            return None
        return (state.expires_at - now).total_seconds()


@dataclass
class Board:
    """The board: its rows by key and the looks it cost."""

    rows: dict[str, LockRow]
    now: datetime

    def row_of(self, dag_id: str, run_id: str, task_id: str, map_index: int) -> tuple[LockRow, int] | None:
        """The lock a task instance holds (place 0) or waits for (its place in line, from 1)."""
        for row in self.rows.values():
            h = row.holder
            if h is not None and (h.dag_id, h.run_id, h.task_id, h.map_index) == (
                dag_id,
                run_id,
                task_id,
                map_index,
            ):
                return row, 0
            for place, w in enumerate(row.waiters, start=1):
                if (w.dag_id, w.run_id, w.task_id, w.map_index) == (dag_id, run_id, task_id, map_index):
                    return row, place
        return None


def _variables(session: Session, prefix: str) -> Iterable[tuple[str, Any]]:
    for var in session.query(Variable).filter(
        Variable.key.like(prefix.replace("_", r"\_") + "%", escape="\\")
    ):
        yield var.key[len(prefix) :], var.val


def _aware(value: datetime | None) -> datetime:
    if value is None:
        return datetime.now(UTC)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _deferred_waiters(session: Session) -> Iterable[tuple[str, Waiter]]:
    rows = (
        session.query(TaskInstance, Trigger)
        .join(Trigger, TaskInstance.trigger_id == Trigger.id)
        .filter(TaskInstance.state == TaskInstanceState.DEFERRED, Trigger.classpath == TRIGGER_CLASSPATH)
    )
    for ti, trigger in rows:
        try:
            key = trigger.kwargs.get("lock_key")
        except Exception as exc:  # a trigger row this process cannot decrypt: say so, show the rest
            log.warning("could not read the kwargs of trigger %s: %s", trigger.id, exc)
            continue
        if isinstance(key, str):
            yield key, Waiter.of(ti, trigger.created_date, "deferred")


def _slot_waiters(session: Session) -> Iterable[tuple[str, Waiter]]:
    rows = (
        session.query(XComModel, TaskInstance)
        .join(
            TaskInstance,
            (TaskInstance.dag_id == XComModel.dag_id)
            & (TaskInstance.run_id == XComModel.run_id)
            & (TaskInstance.task_id == XComModel.task_id)
            & (TaskInstance.map_index == XComModel.map_index),
        )
        .filter(XComModel.key == WAITING_XCOM_KEY, TaskInstance.state == TaskInstanceState.RUNNING)
    )
    for xcom, ti in rows:
        value = XComModel.deserialize_value(xcom)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                continue
        if not isinstance(value, Mapping) or not isinstance(value.get("lock_key"), str):
            continue
        try:
            since = datetime.fromisoformat(str(value.get("since")))
        except ValueError:
            since = _aware(xcom.timestamp)
        yield value["lock_key"], Waiter.of(ti, since, "in its worker slot")


def _dag_keys(session: Session) -> Iterable[tuple[str, str]]:
    """Literal ``lock_key`` arguments of the parsed DAGs' Volcano tasks (templated keys are not known)."""
    for sdm in session.query(SerializedDagModel):
        try:
            data = sdm.data or {}
            tasks = data.get("dag", {}).get("tasks", [])
        except Exception:
            continue
        for task in tasks:
            var = task.get("__var", task) if isinstance(task, Mapping) else {}
            key = var.get("lock_key") if isinstance(var, Mapping) else None
            if isinstance(key, str) and key and "{{" not in key and "{%" not in key:
                yield key, str(data.get("dag", {}).get("dag_id", ""))


def collect(
    session: Session,
    reader: GovernedReader | None,
    now: datetime | None = None,
    *,
    only: Callable[[LockRow], bool] | None = None,
    lock_keys: Iterable[str] = (),
    look: bool = True,
) -> Board:
    """Build the board from the metadata database and (if ``reader`` and ``look``) Volcano's live states.

    :param reader: the Volcano reader; its keyring is what records are opened under.
    :param only: keeps the rows a user may see; it is applied before anything is read from Volcano.
    :param lock_keys: locks to have a row for even when the deployment names them nowhere.
    :param look: read the rows' states (``False``: the metadata database only, nothing sent).
    """
    rows: dict[str, LockRow] = {key: LockRow(key) for key in lock_keys}
    now = now or datetime.now(UTC)

    def row(key: str) -> LockRow:
        return rows.setdefault(key, LockRow(key))

    ring = reader.keys if reader is not None else None
    holders = dict(_variables(session, HOLDER_PREFIX))
    handoffs = dict(_variables(session, HANDOFF_PREFIX))
    for key in (*holders, *handoffs):
        row(key).claims = board_holder(ring, key, holders.get(key), handoffs.get(key))
    for key, waiter in (*_deferred_waiters(session), *_slot_waiters(session)):
        row(key).waiters.append(waiter)
    for key, dag_id in _dag_keys(session):
        row(key).named_by.add(dag_id)
    if only is not None:
        rows = {key: lock for key, lock in rows.items() if only(lock)}

    tenures = read_tenures(ring, _variables(session, TENURE_PREFIX)) if rows else {}
    for lock in rows.values():
        lock.waiters.sort(key=lambda w: (w.since, w.dag_id, w.run_id, w.task_id, w.map_index))
        if reader is not None and look:
            lock.look = reader.look(lock.key)
        resolve_holder(lock)
        lock.tenures = tenures_seen(tenures.get(lock.key, []), lock.look.state)
        starts = expected_starts(lock.tenures, lock.look.state, now, len(lock.waiters))
        lock.waiters = [replace(w, eta=starts[place]) for place, w in enumerate(lock.waiters, start=1)]
    return Board(rows=dict(sorted(rows.items())), now=now)


def resolve_holder(lock: LockRow) -> None:
    """Name the holder from the provenance whose lease is the live one (tokens only grow: no stale match)."""
    state = lock.look.state
    lock.holder = None
    if state is None or not state.held or state.fencing_token is None:
        return
    for claim in lock.claims:
        if claim.fencing_token == state.fencing_token:
            renewal = (
                state.expires_at - timedelta(seconds=claim.ttl)
                if state.expires_at is not None and claim.ttl is not None
                else None
            )
            lock.holder = replace(claim.holder, last_renewal=renewal)
            break
    # a holder (or waiter) that holds the lock is not in its line
    if lock.holder is not None:
        h = lock.holder
        lock.waiters = [
            w
            for w in lock.waiters
            if (w.dag_id, w.run_id, w.task_id, w.map_index) != (h.dag_id, h.run_id, h.task_id, h.map_index)
        ]
