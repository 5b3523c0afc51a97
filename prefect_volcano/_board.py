"""The current view of a lock where Prefect shows things: one keyed markdown artifact per lock.

Prefect has no UI plugin API, so the Artifacts page is the lock board: every acquisition, release,
refused release, loss and skip of a lock creates a new version of the artifact
`volcano-lock-<slug>-<hash>` (the hash is over the Volcano project and the lock key: two projects may
use one lock name), and the page lists each lock with its latest state (held, free, lapsing, lost;
the holder's flow run and task run with links, fencing token, acquired at, expiry, deployment, work
pool) and when the lock server last confirmed it. The same facts go in the artifact's metadata,
where the next acquirer reads them back to tell a holder that crashed (`previous_holder`) and a
waiter reads who holds the lock (`holder_of`).

The view is true when read, as far as the last look: every answer of the lock server that a run
gets (an acquisition, a refusal, a skip, a wait's look, `refresh_lock_view`) is compared with the
record, and a record the answer contradicts (still "held" by a lease that ended without a release:
a crash, a force release, a lapse) is corrected then (`look`), not only by the next holder.

Writing costs Prefect API calls, never Volcano requests, and never fails the run: a failed read or
write logs a warning and the lock goes on. Writes happen inside the run; once the run is over
(`close`) a late write is dropped quietly. Renewals are not recorded (the expiry shown is the one at
acquisition). Every user-supplied string (run, task, deployment, pool and queue names) is escaped
before it goes into the markdown. Never the service key or an ownership token: only the lock key,
the project, the fencing token, times and Prefect's own run names and ids.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.actions import ArtifactCreate
from prefect.client.schemas.filters import (
    ArtifactCollectionFilter,
    ArtifactCollectionFilterKey,
    ArtifactFilter,
    ArtifactFilterKey,
)
from prefect.client.schemas.sorting import ArtifactSort
from prefect.context import FlowRunContext, TaskRunContext
from prefect.utilities.urls import url_for

from volcano_locks import LeaseFacts, LockState

__all__ = ["ARTIFACT_KEY_PREFIX", "LockBoard", "RunFacts", "artifact_key"]

ARTIFACT_KEY_PREFIX = "volcano-lock-"
"""Every lock's artifact key starts with this; the Artifacts page's search finds them all by it."""

_SLUG_LENGTH = 60
RELEASED_NOTE = "released by its holder"
"""The note of the record a holder writes when its release went through."""
_HISTORY_READ = 20  # the lock's latest records read to find a release another run's copy buried
logger = logging.getLogger("prefect_volcano.board")


def artifact_key(lock_key: str, project: str) -> str:
    """The artifact key of lock `lock_key` of Volcano project `project`, in Prefect's grammar.

    A readable slug of the key plus 8 hex digits of the SHA-256 of `project/key`, so keys that slug
    alike (`Rollup:EU`, `rollup-eu`) and one lock name in two projects keep apart.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", lock_key.lower()).strip("-")[:_SLUG_LENGTH].strip("-")
    digest = hashlib.sha256(f"{project}/{lock_key}".encode()).hexdigest()[:8]
    return f"{ARTIFACT_KEY_PREFIX}{slug + '-' if slug else ''}{digest}"


@dataclass(frozen=True)
class RunFacts:
    """The Prefect run a lock attempt belongs to, read from the run context where it is built."""

    flow_run_id: str | None = None
    flow_run_name: str | None = None
    task_run_id: str | None = None
    task_run_name: str | None = None
    deployment_id: str | None = None
    work_pool_name: str | None = None
    work_queue_name: str | None = None

    @classmethod
    def current(cls) -> RunFacts:
        """The facts of the current flow run and task run (all None outside a run)."""
        flow_run = getattr(FlowRunContext.get(), "flow_run", None)
        task_run = getattr(TaskRunContext.get(), "task_run", None)
        flow_run_id = flow_run.id if flow_run is not None else getattr(task_run, "flow_run_id", None)
        return cls(
            flow_run_id=_str(flow_run_id),
            flow_run_name=getattr(flow_run, "name", None),
            task_run_id=_str(getattr(task_run, "id", None)),
            task_run_name=getattr(task_run, "name", None),
            deployment_id=_str(getattr(flow_run, "deployment_id", None)),
            work_pool_name=getattr(flow_run, "work_pool_name", None),
            work_queue_name=getattr(flow_run, "work_queue_name", None),
        )


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds")


def describe_holder(record: dict[str, str]) -> str:
    """`flow run 'name' (id), task run 'name', fencing token N, since T` from a record's metadata."""
    parts = [f"flow run {record.get('flow_run_name', '?')!r} ({record.get('flow_run_id', 'unknown id')})"]
    if record.get("task_run_name"):
        parts.append(f"task run {record['task_run_name']!r}")
    parts.append(f"fencing token {record.get('fencing_token', '?')}")
    if record.get("acquired_at"):
        parts.append(f"since {record['acquired_at']}")
    if record.get("flow_run_url"):
        parts.append(record["flow_run_url"])
    return ", ".join(parts)


class LockBoard:
    """Reads and writes one lock's artifact for one run; build it in the run's own thread.

    Args:
        key: The lock key.
        project: The Volcano project the lock belongs to (`client.project`).
        run: The run this attempt belongs to (default: read from the current context).
        client: Makes a sync Prefect client (default: `get_client(sync_client=True)`).
        clock: Wall-clock time (aware UTC), for "updated" and the lapse check.
        sleeper: Sleeps before a lapse is re-checked.
        recheck_after: Seconds to wait before re-reading a record that looks like a lapse: a
            release recorded by another process may land just after our acquisition.
        recheck_for: For a lease that ended before its expiry (released, or force-released), the
            re-reads go on, each wait twice the last, for up to this many seconds in all: a holder
            records its release beside its run, a second or two after it (seen on a busy machine).
    """

    def __init__(
        self,
        key: str,
        project: str,
        run: RunFacts | None = None,
        *,
        client: Callable[[], SyncPrefectClient] = lambda: get_client(sync_client=True),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleeper: Callable[[float], object] = time.sleep,
        recheck_after: float = 1.0,
        recheck_for: float = 7.0,
    ) -> None:
        self.key = key
        self.project = project
        self.artifact_key = artifact_key(key, project)
        self._open = True
        self.run = run if run is not None else RunFacts.current()
        self._client = client
        self._clock = clock
        self._sleep = sleeper
        self._recheck_after = recheck_after
        self._recheck_for = recheck_for
        self._deployment_name: str | None = None

    # ------------------------------------------------------------------------------------ reading

    def read(self) -> dict[str, str] | None:
        """The latest record of this lock (the artifact's metadata), or None (none, or unreadable)."""
        try:
            with self._client() as client:
                found = client.read_latest_artifacts(
                    artifact_filter=ArtifactCollectionFilter(
                        key=ArtifactCollectionFilterKey(any_=[self.artifact_key])
                    ),
                    limit=1,
                )
        except Exception as exc:  # the view is best effort: never fail the run over it
            logger.warning("Could not read the current view of lock %r: %s", self.key, type(exc).__name__)
            return None
        return dict(found[0].metadata_ or {}) if found else None

    def released_earlier(self, fencing_token: int) -> bool:
        """Whether the lock's recent records include its holder's release of ``fencing_token``.

        A run that records beside a holder (waiting, a skip, a look) copies the holder's record; when the
        holder's release lands between that run's read and its write, the copy buries it, and the latest
        record says "held" again for a lease that was released. The release is still in the history.
        """
        try:
            with self._client() as client:
                versions = client.read_artifacts(
                    artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[self.artifact_key])),
                    sort=ArtifactSort.CREATED_DESC,
                    limit=_HISTORY_READ,
                )
        except Exception as exc:  # the view is best effort: never fail the run over it
            logger.warning("Could not read the history of lock %r: %s", self.key, type(exc).__name__)
            return False
        released = {"state": "free", "fencing_token": str(fencing_token), "note": RELEASED_NOTE}
        return any(released.items() <= (v.metadata_ or {}).items() for v in versions)

    def holder_of(self, fencing_token: int | None) -> dict[str, str] | None:
        """The record of the run holding the lease with `fencing_token`, if this Prefect server has one."""
        if not fencing_token:
            return None
        record = self.read()
        if record and record.get("state") == "held" and record.get("fencing_token") == str(fencing_token):
            return record
        return None

    def previous_holder(self, lease: LeaseFacts) -> dict[str, str] | None:
        """The record of a holder that never released, when `lease` was acquired after it (else None).

        A record still `held` under an older fencing token means the previous lease ended without
        a recorded release: it expired (its holder crashed or hung) or was force-released. It is
        re-read after `recheck_after` seconds, since another process's release may be recorded
        just after our acquisition (and again, up to `recheck_for` seconds, while the lease looks
        ended before its expiry). The returned record gains `how`: `expired` when `lease` was
        acquired after the expiry recorded at the old acquisition, else `ended before its expiry`.
        """
        record = self.read()
        if not _stale_hold(record, lease):
            return None
        if record is not None and record.get("state") == "lapsing":
            return {**record, "how": "expired"}  # its holder said it would: nothing to re-check
        wait, waited = self._recheck_after, 0.0
        while True:
            self._sleep(wait)
            waited += wait
            record = self.read()
            if record is None or not _stale_hold(record, lease) or self.released_earlier(_token(record)):
                return None
            expires = _parse(record.get("expires_at"))
            expired = expires is None or lease.acquired_at >= expires
            wait *= 2
            if expired or waited + wait > self._recheck_for:
                return {**record, "how": "expired" if expired else "ended before its expiry"}

    # ------------------------------------------------------------------------------------ writing

    def held(self, lease: LeaseFacts) -> None:
        """Record that this run holds the lock."""
        self._write("held", lease, note=None)

    def released(self, lease: LeaseFacts) -> None:
        """Record the release, unless the record already names a newer holder (a late write)."""
        latest = self.read()
        if latest is not None and _token(latest) > lease.fencing_token:
            return
        self._write("free", lease, note=RELEASED_NOTE)

    def lost(self, lease: LeaseFacts | None, reason: str) -> None:
        """Record that this run lost the lease (the lock may be free, or held by a newer lease)."""
        latest = self.read()
        if lease is not None and latest is not None and _token(latest) > lease.fencing_token:
            return
        self._write("lost", lease, note=reason)

    def lapsing(self, lease: LeaseFacts, reason: str) -> None:
        """Record that the release did not go through: the lease lapses at its expiry."""
        self._write("lapsing", lease, note=reason)

    def look(self, state: LockState) -> None:
        """Correct the record from a fresh answer of the lock server (one look), if they disagree.

        A record `held` (or `lapsing`, or `lost`) whose lease the answer shows ended (the lock is free,
        or held under a newer fencing token that no run has recorded) is rewritten, keeping the last
        holder's facts: the view is never left saying "held" by a run whose lease is gone.
        """
        try:
            record = self.read()
            if record is None or not _contradicts(record, state):
                return
            if state.held:  # a newer holder may be recording itself right now: let its write win
                self._sleep(self._recheck_after)
                record = self.read()
                if record is None or not _contradicts(record, state):
                    return
            now = _iso(self._clock())
            ended = record.get("state", "held")
            note = {
                "held": "its lease ended without a release (its holder crashed or hung, or it was"
                " force-released)",
                "lapsing": "its release was refused; the lease lapsed",
                "lost": "its holder lost the lease",
            }.get(ended, "its lease ended")
            fixed = {**record, "updated_at": now, "confirmed_at": now, "note": note}
            if state.held:
                fixed.update(
                    state="held",
                    holder="another owner (not recorded here)",
                    fencing_token=str(state.fencing_token),
                )
                if state.expires_at is not None:
                    fixed["expires_at"] = _iso(state.expires_at)
            else:
                fixed["state"] = "free"
            self._create(fixed, _markdown(self.key, fixed))
        except Exception as exc:  # the view is best effort: never fail the run over it
            logger.warning("Could not update the current view of lock %r: %s", self.key, type(exc).__name__)

    def close(self) -> None:
        """The run is over: later writes are dropped quietly (its Prefect client and events are gone)."""
        self._open = False

    def skipped(self, holder_token: int | None) -> None:
        """Record that this run skipped, keeping the recorded holder when it is the one seen."""
        try:
            if holder_token:
                record = self.holder_of(holder_token)
            else:  # the refusal did not name the holder: keep the recorded one if it still holds
                latest = self.read()
                record = latest if latest is not None and latest.get("state") == "held" else None
            now = _iso(self._clock())
            me = self.run.flow_run_name or "a run"
            if record is None:
                record = {"state": "held", "holder": "another owner"}
                if holder_token:
                    record["fencing_token"] = str(holder_token)
            record = {**record, "last_skipped": f"{me} at {now}", "updated_at": now}
            self._create(record, _markdown(self.key, record), also=f"{me} skipped")
        except Exception as exc:
            logger.warning("Could not update the current view of lock %r: %s", self.key, type(exc).__name__)

    def waiting(self, expected: str) -> None:
        """Record beside the holder that this run waits, and when it expects to start (the ETA phrase).

        The holder's record is kept as it is; a newer waiting run's report replaces an older one's.
        """
        try:
            record = self.read()
            if record is None or record.get("state") != "held":
                return
            now = _iso(self._clock())
            me = self.run.flow_run_name or "a run"
            record = {**record, "waiting": f"{me}: {expected} (as of {now})", "updated_at": now}
            self._create(record, _markdown(self.key, record))
        except Exception as exc:  # the view is best effort: never fail the run over it
            logger.warning("Could not update the current view of lock %r: %s", self.key, type(exc).__name__)

    def _write(self, state: str, lease: LeaseFacts | None, *, note: str | None) -> None:
        try:
            record = self._record(state, lease, note)
            self._create(record, _markdown(self.key, record))
        except Exception as exc:  # the view is best effort: never fail the run over it
            logger.warning("Could not update the current view of lock %r: %s", self.key, type(exc).__name__)

    def _record(self, state: str, lease: LeaseFacts | None, note: str | None) -> dict[str, str]:
        run = self.run
        record: dict[str, Any] = {
            "state": state,
            "lock_key": self.key,
            "updated_at": _iso(self._clock()),
            "flow_run_id": run.flow_run_id,
            "flow_run_name": run.flow_run_name,
            "flow_run_url": url_for("flow-run", obj_id=run.flow_run_id) if run.flow_run_id else None,
            "task_run_id": run.task_run_id,
            "task_run_name": run.task_run_name,
            "deployment_id": run.deployment_id,
            "deployment_name": self._deployment(),
            "work_pool_name": run.work_pool_name,
            "work_queue_name": run.work_queue_name,
            "note": note,
            "project": self.project,
            "confirmed_at": _iso(self._clock()),
        }
        if lease is not None:
            record.update(
                fencing_token=str(lease.fencing_token),
                acquired_at=_iso(lease.acquired_at),
                expires_at=_iso(lease.expires_at),
                ttl=str(lease.ttl),
            )
        return {k: str(v) for k, v in record.items() if v is not None}

    def _deployment(self) -> str | None:
        if self.run.deployment_id is None or self._deployment_name is not None:
            return self._deployment_name
        with self._client() as client:
            self._deployment_name = client.read_deployment(self.run.deployment_id).name
        return self._deployment_name

    def _create(self, record: dict[str, str], markdown: str, also: str | None = None) -> None:
        if not self._open:
            logger.debug("lock %r: the run is over; its view update is dropped", self.key)
            return
        run = self.run
        state = record.get("state", "?")
        if state == "held" and (record.get("holder") or record.get("flow_run_name")):
            state += f" by {record.get('holder') or record['flow_run_name']}"
        artifact = ArtifactCreate(
            key=self.artifact_key,
            type="markdown",
            description=escape_markdown(
                f"Volcano lock {self.key} of project {self.project}: {state}" + (f"; {also}" if also else "")
            ),
            data=markdown,
            metadata_=record,
            flow_run_id=run.flow_run_id,  # type: ignore[arg-type]  # pydantic parses the UUID
            task_run_id=run.task_run_id,  # type: ignore[arg-type]
        )
        with self._client() as client:
            client.create_artifact(artifact)


def _token(record: dict[str, str]) -> int:
    try:
        return int(record.get("fencing_token", "0"))
    except ValueError:
        return 0


def _parse(value: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if value else None
    except ValueError:
        return None


def _stale_hold(record: dict[str, str] | None, lease: LeaseFacts) -> bool:
    if record is None or record.get("state") not in ("held", "lapsing"):
        return False
    return 0 < _token(record) < lease.fencing_token


def _contradicts(record: dict[str, str], state: LockState) -> bool:
    """Whether a fresh answer shows that the record's lease has ended (free, or a newer holder)."""
    if record.get("state") not in ("held", "lapsing", "lost"):
        return False
    if not state.held:
        return True
    return state.fencing_token is not None and state.fencing_token > _token(record)


# Every value sits inside a table cell (never at a line's start, newlines flattened), so what could
# open markup there is: emphasis, code, links and images, a cell boundary, strikethrough and escapes.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]()!|~#])")


def escape_markdown(text: str) -> str:
    """`text` as literal markdown: no heading, link, image, emphasis, table cell or HTML it could open."""
    flat = " ".join(text.split())
    flat = flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKDOWN_SPECIAL.sub(r"\\\1", flat)


_ROWS = (
    ("State", "state"),
    ("Fencing token", "fencing_token"),
    ("Holder flow run", "flow_run"),
    ("Task run", "task_run"),
    ("Acquired at", "acquired_at"),
    ("Expires at (as of acquisition; renewed while held)", "expires_at"),
    ("TTL (s)", "ttl"),
    ("Deployment", "deployment_name"),
    ("Work pool / queue", "pool"),
    ("Project", "project"),
    ("Note", "note"),
    ("Last skipped run", "last_skipped"),
    ("Next waiting run and its expected start", "waiting"),
    ("Confirmed by the lock server at", "confirmed_at"),
    ("Updated at", "updated_at"),
)


def _markdown(key: str, record: dict[str, str]) -> str:
    """The artifact's page: a heading with the state and a table of the record, every value escaped."""
    cells = {name: escape_markdown(value) for name, value in record.items()}
    if record.get("holder"):
        cells["flow_run"] = escape_markdown(record["holder"])
    elif record.get("flow_run_name"):
        name = escape_markdown(record["flow_run_name"])
        url = record.get("flow_run_url", "")
        # Our own URL (the UI's address and a UUID); a user string never becomes a link target.
        link = f"[{name}](<{url}>)" if url.startswith(("http://", "https://")) and ">" not in url else name
        cells["flow_run"] = f"{link} ({escape_markdown(record.get('flow_run_id', ''))})"
    if record.get("task_run_name"):
        cells["task_run"] = (
            f"{escape_markdown(record['task_run_name'])} ({escape_markdown(record.get('task_run_id', ''))})"
        )
    if record.get("work_pool_name"):
        pool = " / ".join(filter(None, (record["work_pool_name"], record.get("work_queue_name"))))
        cells["pool"] = escape_markdown(pool)
    state = record.get("state", "?")
    who = "last held by" if state != "held" else "held by"
    heading = f"## Lock {escape_markdown(key)}: **{escape_markdown(state)}**"
    lines = [heading, "", f"{who.capitalize()} the run below.", ""]
    lines += ["| | |", "|---|---|"]
    for label, name in _ROWS:
        value = cells.get(name)
        if value:
            lines.append(f"| {label} | {value} |")
    return "\n".join(lines) + "\n"
