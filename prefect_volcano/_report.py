"""What a locked run tells its user: log lines, events and the messages of its errors.

Each fact is told once: the acquisition, a wait (at its start and about every minute after), a
skip, a loss (at the moment the keeper reports it, whichever path sees it first), the release.
Messages say what is true for this run: whether the body is stopped or keeps running until a
blocking call returns, and whether Prefect will retry.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Literal

from prefect import State
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext, SyncClientContext, TaskRunContext
from prefect.exceptions import MissingContextError
from prefect.logging import get_run_logger
from prefect.states import Completed
from prefect.transactions import get_transaction

from prefect_volcano._board import LockBoard, describe_holder
from prefect_volcano._events import LockEvents
from volcano_locks import ErrorCode, LockContention, LockLease, LockState, OwnershipLost, WaitTimeout
from volcano_locks.integration import ReleaseOutcome, expected_start, reported
from volcano_locks.once import OnceRecord, Who

__all__ = [
    "DUPLICATE_TAG",
    "SKIPPED_MESSAGE_PREFIX",
    "SKIPPED_STATE_NAME",
    "SKIPPED_TAG",
    "LossReport",
    "RunReport",
    "Scope",
    "WaitReporter",
    "is_skipped",
    "run_who",
]

SKIPPED_STATE_NAME = "Completed"
"""The name of the state a skipped task run or flow run ends in: Completed, with a message that
starts with `SKIPPED_MESSAGE_PREFIX`.

Not a name of its own: the Prefect UI's lists of runs (a deployment's Runs tab, the flow run list)
filter by a fixed list of state names, and a run in a state named otherwise is hidden from them.
"""

SKIPPED_MESSAGE_PREFIX = "Skipped: "
"""How a skipped run's state message starts (the body did not run): `is_skipped` reads it."""

SKIPPED_TAG = "volcano-lock:skipped"
"""The tag a skip adds to its flow run: every list of flow runs in the Prefect UI (the Runs page, a
deployment's and a flow's Runs tabs, the dashboard) shows a run's tags beside its state, on Prefect's
old (Vue) and new (React) UI alike, so a skipped run is told from one that did the work at a glance.
A skipped task tags the flow run it belongs to (a task run's tags are fixed when it is created)."""

DUPLICATE_TAG = "volcano-lock:duplicate"
"""The tag a duplicate run (its business key already done, ``once_key``) adds to its flow run, beside
`SKIPPED_TAG`: the runs list tells "someone else did it" from "the lock was busy"."""

_JUST_BEFORE = timedelta(milliseconds=1)
RECORDING_BOUND = 10.0
"""Seconds a release or loss waits at most for the lock board's record of the acquisition."""
_OLD_SKIPPED_NAME = "Skipped"  # the name states had before 0.x; still recognised in stored states


def is_skipped(obj: object) -> bool:
    """Whether `obj` is what a skipped locked run ends in: a Completed state whose message says Skipped.

    Args:
        obj: A task call's value, or any state (e.g. from `return_state=True`).

    Returns:
        True for the Skipped state; False for anything else, including a body's own value.
    """
    if not isinstance(obj, State) or not obj.is_completed():
        return False
    return obj.name == _OLD_SKIPPED_NAME or (obj.message or "").startswith(SKIPPED_MESSAGE_PREFIX)


Log = logging.Logger | logging.LoggerAdapter[Any]
Scope = Literal["task", "flow"]

_fallback_logger = logging.getLogger("prefect_volcano")
logger = logging.getLogger("prefect_volcano.report")


def run_logger() -> Log:
    """The Prefect run logger when in a run (its lines reach the UI), else `prefect_volcano`."""
    try:
        return get_run_logger()
    except MissingContextError:
        return _fallback_logger


def run_who() -> Who:
    """The running flow run and task run, as a run-once record names them (ids and names, never a secret)."""
    flow_run = getattr(FlowRunContext.get(), "flow_run", None)
    task_run = getattr(TaskRunContext.get(), "task_run", None)
    return Who.of(
        "prefect",
        flow_run_id=getattr(flow_run, "id", None) or getattr(task_run, "flow_run_id", None),
        flow_run_name=getattr(flow_run, "name", None),
        task_run_id=getattr(task_run, "id", None),
        task_run_name=getattr(task_run, "name", None),
        run_count=getattr(task_run or flow_run, "run_count", None),
    )


def _subject(scope: Scope) -> str:
    return "flow run" if scope == "flow" else "task"


def _retries_left(scope: Scope) -> int | None:
    """How many more attempts Prefect will make after this one fails (None: not in a run)."""
    if scope == "task":
        task_ctx = TaskRunContext.get()
        if task_ctx is None:
            return None
        return max(0, (task_ctx.task.retries or 0) + 1 - task_ctx.task_run.run_count)
    flow_ctx = FlowRunContext.get()
    if flow_ctx is None or flow_ctx.flow is None or flow_ctx.flow_run is None:
        return None
    return max(0, (flow_ctx.flow.retries or 0) + 1 - flow_ctx.flow_run.run_count)


def _by_holder(holder: LockState | None) -> str:
    """`" (holder's fencing token N)"` when the holder is known, else nothing."""
    token = holder.fencing_token if holder is not None else None
    return f" (holder's fencing token {token})" if token else ""


class RunReport:
    """Tells the user (log and events) what happens to one run's lock; one per lock attempt."""

    def __init__(
        self,
        key: str,
        scope: Scope,
        events: LockEvents,
        log: Log,
        *,
        cancels: bool,
        project: str,
        board: LockBoard | None = None,
    ) -> None:
        self.key = key
        self.scope = scope
        self.events = events
        self.log = log
        self.board = board if board is not None else LockBoard(key, project)
        self._recording: threading.Thread | None = None
        self.loss = LossReport(self, retries_left=_retries_left(scope), cancels=cancels)

    def acquired(self, lease: LockLease) -> None:
        """Say the lock is held, with the lease's fencing token; tell a previous holder's lapse beside.

        The events are emitted as things happen (Prefect's events worker sends them in the background):
        a waiting run is woken by the `released` event and a short hold must not delay it. Neither
        the body nor the task's exit waits for the lock board (Prefect API calls): its read, its
        re-check of a holder that looks lapsed (up to a second) and its writes go on threads of their
        own, one after the other, carrying the run's context. They are not daemons: a flow-run
        process that ends finishes them first. A lapse found there is emitted as having occurred just
        before this acquisition, so the Event Feed shows it first.
        """
        self.log.info(
            "Acquired lock %r (fencing token %d, ttl %ds)", self.key, lease.fencing_token, lease.ttl
        )
        acquired = self.events.emit(
            "acquired",
            fencing_token=lease.fencing_token,
            ttl=lease.ttl,
            expires_at=lease.expires_at.isoformat(),
        )
        self._then(self._record_acquired, lease, acquired)

    def _then(self, record: Callable[..., None], *args: Any) -> None:
        """Run ``record(*args)`` beside the run, after whatever this report is still recording."""
        before = self._recording

        def run() -> None:
            # The run's own Prefect client may be closed by now (the run ended): keep the run's
            # settings and facts, but let the board open a client of its own.
            SyncClientContext.__var__.set(None)  # type: ignore[arg-type]
            if before is not None:
                before.join(RECORDING_BOUND)
            record(*args)

        context = contextvars.copy_context()
        self._recording = threading.Thread(
            target=context.run, args=(run,), name=f"volcano-lock-board:{self.key}"
        )
        self._recording.start()

    def _record_acquired(self, lease: LockLease, acquired: datetime | None) -> None:
        facts = lease.facts()
        previous = self.board.previous_holder(facts)
        if previous is not None:
            self.lapsed(previous, before=acquired)
        self.board.held(facts)

    def settle(self) -> None:
        """Wait for what this report is still recording (bounded: a board that hangs only delays it)."""
        recording = self._recording
        if recording is not None:
            recording.join(RECORDING_BOUND)

    def close(self) -> None:
        """The run's lock business is over: finish recording inside the run, then drop what comes later.

        Prefect's events worker and the run's API client end with the run; a view write or an event
        sent after them would log an error (`Error emitting event`) or an atexit traceback.
        """
        self.settle()
        self.board.close()
        self.events.close()

    def lapsed(self, previous: dict[str, str], *, before: datetime | None = None) -> None:
        """Say that the previous lease ended unreleased (its holder crashed or hung, or it was dropped).

        Args:
            previous: The board's record of the previous holder.
            before: When this run's `acquired` event occurred: the lapse is emitted as just before it.
        """
        self.log.warning(
            "Lock %r was still recorded as held by %s: that lease %s without a release"
            " (its holder crashed or hung, or it was force-released)",
            self.key,
            describe_holder(previous),
            previous["how"],
        )
        related = []
        if previous.get("flow_run_id"):
            related.append(
                {
                    "prefect.resource.id": f"prefect.flow-run.{previous['flow_run_id']}",
                    "prefect.resource.role": "previous-holder",
                    "prefect.resource.name": previous.get("flow_run_name", ""),
                }
            )
        self.events.emit(
            "lapsed",
            extra_related=related,
            occurred=None if before is None else before - _JUST_BEFORE,
            previous_fencing_token=int(previous["fencing_token"]),
            previous_flow_run_id=previous.get("flow_run_id"),
            previous_flow_run_name=previous.get("flow_run_name"),
            previous_task_run_id=previous.get("task_run_id"),
            previous_expires_at=previous.get("expires_at"),
            how=previous["how"],
        )

    def released(self, lease: LockLease) -> None:
        """Say the lock was released (the event at once, the board's record beside the run)."""
        self.log.info("Released lock %r (fencing token %d)", self.key, lease.fencing_token)
        self.events.emit("released", fencing_token=lease.fencing_token)  # at once: it wakes waiters
        self._then(self.board.released, lease.facts())

    def release_ended(self, outcome: ReleaseOutcome[LockLease]) -> None:
        """Say how the release went: released (perhaps on a retry), or left to lapse at its expiry."""
        if outcome.released:
            if outcome.error is not None:
                self.log.warning("%s", outcome.describe())
            self.released(outcome.lease)
            return
        lease = outcome.lease
        self.log.warning("%s", outcome.describe())
        self.events.emit(
            "lapsing",
            fencing_token=lease.fencing_token,
            expires_at=lease.expires_at.isoformat(),
            reason=str(outcome.error) if outcome.error is not None else None,
        )
        self._then(self.board.lapsing, lease.facts(), "the release did not go through; lapses at its expiry")

    def expects(self, when: str) -> None:
        """This run waits, expecting to start ``when`` (the ETA phrase): into the view, beside the run."""
        self._then(self.board.waiting, when)

    def looked(self, state: LockState) -> None:
        """A fresh answer of the lock server: correct the view if it contradicts it (beside the run)."""
        self._then(self.board.look, state)

    def skipped(self, holder: LockState | None) -> State[None]:
        """Say the run skips, and return the Completed state named Skipped it ends in."""
        token = holder.fencing_token if holder else None
        message = (
            f"{SKIPPED_MESSAGE_PREFIX}the body did not run: lock {self.key!r} is held by another run"
            f"{_by_holder(holder)}; on_contention='skip'"
        )
        self.log.info("%s", message)
        self.events.emit("skipped", holder_fencing_token=token)
        self._mark_skipped()
        if holder is not None:
            self.looked(holder)
        self._then(self.board.skipped, token)
        _no_cache()
        return Completed(name=SKIPPED_STATE_NAME, message=message)

    def duplicate(self, record: OnceRecord) -> State[Any]:
        """Say the run is a duplicate of the one that did its business key; the state holds that result."""
        message = f"{SKIPPED_MESSAGE_PREFIX}duplicate run, the body did not run: {record.describe()}"
        self.log.info("%s", message)
        self.events.emit(
            "duplicate",
            business_key=record.business_key,
            first_fencing_token=record.fencing_token,
            first_run=record.who.describe(),
        )
        self._mark_skipped(DUPLICATE_TAG)
        _no_cache()
        return Completed(name=SKIPPED_STATE_NAME, message=message, data=record.result)

    def _mark_skipped(self, *more: str) -> None:
        """Tag the flow run, so every list of flow runs tells the skip from work done at a glance.

        A task run's tags are fixed when it is created (and on Prefect 3.9 its record may not exist yet
        when the body would start), so a skipped task marks the flow run it belongs to; the task run
        itself says "Skipped: ..." in its state message.
        """
        flow_run = getattr(FlowRunContext.get(), "flow_run", None)
        task_run = getattr(TaskRunContext.get(), "task_run", None)
        flow_run_id = getattr(flow_run, "id", None) or getattr(task_run, "flow_run_id", None)
        if flow_run_id is None:
            return
        try:
            with get_client(sync_client=True) as client:
                tags = set(client.read_flow_run(flow_run_id).tags) | {SKIPPED_TAG, *more}
                client.update_flow_run(flow_run_id, tags=sorted(tags))
        except Exception as exc:  # the mark is for people; never fail the run over it
            logger.info("could not tag the skipped flow run: %s", type(exc).__name__)

    def contention_message(self, exc: LockContention, on_contention: str) -> str:
        """The message of a contention that ends the run (on_contention='fail')."""
        by = _by_holder(exc.holder)
        return f"lock {self.key!r} is held by another run{by} and on_contention={on_contention!r}"

    def gave_up(self, exc: WaitTimeout, wait_timeout: float | None) -> None:
        """Say the wait ran out of time."""
        self.log.error("Gave up waiting for lock %r after %ss: %s", self.key, wait_timeout, exc)


def _no_cache() -> None:
    """A skip or a duplicate says nothing about the inputs: never let it answer a later run from the cache."""
    txn = get_transaction()
    if txn is not None:
        txn.write_on_commit = False


class LossReport:
    """Reports one lease's loss exactly once, from whichever path learns of it first."""

    def __init__(self, report: RunReport, *, retries_left: int | None, cancels: bool) -> None:
        self._report = report
        self._retries_left = retries_left
        self._cancels = cancels
        self._once = threading.Lock()
        self._told = False

    def message(self, exc: OwnershipLost) -> str:
        """The log line for this loss: what happened, what happens to the body, and whether it retries."""
        r = self._report
        subject = _subject(r.scope)
        if self._cancels:
            stop = "the body is cancelled"
        else:
            stop = (
                "the body is interrupted at its next Python instruction"
                " (a call blocked in C code, such as a sleep or a socket read, runs until it returns)"
            )
        if r.scope == "flow":
            stop += "; tasks already running in other threads run on, so fence their writes"
        if self._retries_left is None:
            retry = ""
        elif self._retries_left == 0:
            retry = "; no retries are left"
        else:
            retry = f"; Prefect may retry it ({self._retries_left} left), and a retry takes a new lease"
        forced = (
            "; the server dropped the lease before it could expire: it was force-released"
            if self.forced
            else ""
        )
        return f"Lost ownership of lock {r.key!r} ({exc}){forced}; {stop} and the {subject} fails{retry}"

    forced = False
    """Whether the loss was a force release, as far as this holder can tell (set when told)."""

    @staticmethod
    def force_released(exc: OwnershipLost, lease: LockLease | None, now: float) -> bool:
        """Whether the server refused the lease (409 ownership lost) while it cannot have expired yet.

        The lease's local deadline (when the last successful request was sent plus its TTL) is never
        later than the server's expiry, so a refusal before it means the lease was dropped early:
        by a force release (`DELETE /locks/{key}`), the one way the contract drops a live lease.
        """
        return exc.code == ErrorCode.OWNERSHIP_LOST and lease is not None and now < lease.local_deadline

    def __call__(self, exc: OwnershipLost, lease: LockLease | None = None) -> None:
        """Log and emit the loss, once."""
        with self._once:
            if self._told:
                return
            self._told = True
        self.forced = self.force_released(exc, lease, time.monotonic())
        r = self._report
        r.settle()
        r.log.error("%s", self.message(exc))
        r.events.emit(
            "lost",
            fencing_token=lease.fencing_token if lease is not None else None,
            reason=str(exc),
            code=exc.code,
            force_released=True if self.forced else None,
        )
        note = "force-released (dropped before its expiry)" if self.forced else f"lost: {exc.code or exc}"
        r.board.lost(lease.facts() if lease is not None else None, note)


class WaitReporter:
    """Tells that a run waits for a lock, whenever the core's wait engine reports.

    The engine (`volcano_locks.waiting`) decides when: at its first refusal (the wait starts) and
    about every minute after (`WaitPolicy.report_every`); this class says it in the run's log and
    emits the `waiting` event. It is the engine's `on_waiting` callback.

    Args:
        report: The run's report (its log, key and events).
        on_start: Called once, when the wait starts (e.g. to listen for releases), with when the
            `waiting` event occurred (None: none was emitted): the run's place in line.
    """

    def __init__(
        self, report: RunReport, on_start: Callable[[datetime | None], object] = lambda joined: None
    ) -> None:
        self._report = report
        self._on_start = on_start
        self._reports = 0
        self.holder: LockState | None = None
        self._described_token: int | None = None
        self._described: dict[str, str] | None = None

    @property
    def key(self) -> str:
        """The lock waited for."""
        return self._report.key

    def __call__(self, holder: LockState | None, waited: float) -> None:
        """The engine's report: the holder it saw last and the seconds waited so far."""
        if holder is not None and holder.fencing_token:
            self.holder = holder
        self._reports += 1
        r = self._report
        who = self._who()
        if holder is not None:
            r.looked(holder)  # the engine's look is a fresh answer: correct a stale view with it
        when = expected_start(reported())
        r.expects(when)
        if self._reports == 1:
            r.log.info("Waiting for lock %r, held by %s; %s", r.key, who, when)
            joined = r.events.emit(
                "waiting", holder_fencing_token=self.holder.fencing_token if self.holder else None
            )
            self._on_start(joined)
            return
        r.log.info("Still waiting for lock %r after %.0f s, held by %s; %s", r.key, waited, who, when)

    def _who(self) -> str:
        """The holder as the view records it (read again when its fencing token changes), or its token."""
        token = self.holder.fencing_token if self.holder else None
        if token != self._described_token:
            self._described_token = token
            self._described = self._report.board.holder_of(token)
        if self._described is not None:
            return describe_holder(self._described)
        return f"another run{_by_holder(self.holder)}"
