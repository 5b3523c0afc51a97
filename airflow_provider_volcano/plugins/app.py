"""The lock board's FastAPI app: the "Volcano locks" page, a task instance's Lock tab, force release.

Airflow mounts plugin apps without authenticating them, so every route here depends on Airflow's own
auth dependencies (:func:`~airflow.api_fastapi.core_api.security.get_user` and the auth manager's
``is_authorized_dag``): reading needs read access to DAGs (a task instance's tab: to its DAG), force
release needs edit access to the holder's DAG (to every DAG when the holder is not in this
deployment). A force release is written to Airflow's audit log (the ``log`` table, as Airflow's own
routes do) with who did it, and to the force-release record the losing holder names in its failure.
The pages are server-rendered HTML (no script), shown by the UI in an iframe.
"""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote, urlsplit

from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse

from airflow_provider_volcano._provenance import FORCED_PREFIX, ForcedRecord
from airflow_provider_volcano.plugins.board import Board, GovernedReader, LockRow, collect

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["FORCE_RELEASE_EVENT", "app"]

FORCE_RELEASE_EVENT = "volcano_lock_force_release"
CONFIRMATION = (
    "Force release ends the current lease at once, whoever holds it. The old holder is not stopped "
    "now: it notices at its next renewal (within a third of its TTL) and stops, and its task fails "
    "naming this force release. Until then it may still be writing: fencing rejects its late writes "
    "(its fencing token is older than the next holder's). The next waiter in line can acquire at once."
)

app = FastAPI(title="Volcano locks", description="Who holds each Volcano lock, who waits, and force release.")


def _reader(request: Request) -> GovernedReader:
    """The app's one reader (its cache is what keeps the page within one look per lock per refresh)."""
    reader: GovernedReader | None = getattr(request.app.state, "volcano_reader", None)
    if reader is None:
        from airflow.configuration import conf

        from airflow_provider_volcano.hooks.volcano import VolcanoHook

        conn_id = conf.get("volcano", "board_conn_id", fallback="volcano_default")
        reader = GovernedReader(VolcanoHook(conn_id).get_client())
        request.app.state.volcano_reader = reader
    return reader


ReaderDep = Annotated[GovernedReader, Depends(_reader)]


def _may(user: Any, method: str, dag_id: str | None) -> bool:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails

    return bool(
        get_auth_manager().is_authorized_dag(
            method=method,  # type: ignore[arg-type]
            user=user,
            details=DagDetails(id=dag_id) if dag_id else None,
        )
    )


def _ti_href(dag_id: str, run_id: str, task_id: str, map_index: int) -> str:
    base = f"/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}/tasks/{quote(task_id, safe='')}"
    return base + (f"/mapped/{map_index}" if map_index >= 0 else "")


def _e(value: object) -> str:
    return html.escape(str(value))


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


_STYLE = """
body{font-family:system-ui,sans-serif;margin:16px;color:#1a202c}
table{border-collapse:collapse;width:100%}th,td{border:1px solid #cbd5e0;padding:6px 8px;text-align:left;
vertical-align:top}th{background:#edf2f7}.held{color:#c05621;font-weight:600}.free{color:#2f855a}
ol{margin:0;padding-left:20px}.note{color:#4a5568;font-size:90%}button{padding:4px 10px}
.refused{color:#9b2c2c;font-weight:600}.done{color:#2f855a;font-weight:600}
"""


def _page(title: str, body: str, refresh: bool = False) -> HTMLResponse:
    meta = '<meta http-equiv="refresh" content="10">' if refresh else ""
    return HTMLResponse(
        f'<!doctype html><html><head><meta charset="utf-8">{meta}<title>{_e(title)}</title>'
        f"<style>{_STYLE}</style></head><body><h2>{_e(title)}</h2>{body}</body></html>"
    )


def _state_cell(row: LockRow, now: datetime) -> str:
    look = row.look
    if look.state is None:
        why = f" ({_e(look.error)})" if look.error else " (within the page's request budget; next refresh)"
        return f'<span class="note">not read yet{why}</span>'
    if not look.state.held:
        return '<span class="free">free</span>'
    expires = row.expires_in(now)
    left = f", expires in {_ago(expires)}" if expires is not None else ""
    return f'<span class="held">held</span>, fencing token {_e(look.state.fencing_token)}{left}'


def _holder_cell(row: LockRow, now: datetime) -> str:
    if not row.held:
        return ""
    h = row.holder
    if h is None:
        return "held by another owner"
    href = _ti_href(h.dag_id, h.run_id, h.task_id, h.map_index)
    link = f'<a target="_top" href="{_e(href)}">{_e(h.names())}</a>'
    if h.handoff:
        return f"{link}<br><span class='note'>handoff: acquired by its trigger, task not resumed yet</span>"
    renewal = (
        f"last renewal {_ago((now - h.last_renewal).total_seconds())} ago"
        if h.last_renewal is not None
        else "last renewal unknown"
    )
    return f"{link}<br>on {_e(h.hostname)}, acquired at {_e(h.acquired_at)}, {renewal}"


def _waiters_cell(row: LockRow, now: datetime) -> str:
    if not row.waiters:
        return '<span class="note">none</span>'
    items = "".join(
        f'<li class="waiter"><a target="_top" '
        f'href="{_e(_ti_href(w.dag_id, w.run_id, w.task_id, w.map_index))}">'
        f"{_e(w.names())}</a> ({_e(w.where)}, waiting {_ago(w.waited(now).total_seconds())})</li>"
        for w in row.waiters
    )
    return f"<ol>{items}</ol>"


def _lock_table(board: Board, rows: list[LockRow], actions: bool = True) -> str:
    now = board.now
    head = "<tr><th>Lock</th><th>State</th><th>Holder</th><th>Waiters (in order)</th><th></th></tr>"
    body = []
    for row in rows:
        action = ""
        if actions and row.held:
            action = (
                f'<form method="get" action="confirm">'
                f'<input type="hidden" name="lock_key" value="{_e(row.key)}">'
                f"<button>Force release…</button></form>"
            )
        body.append(
            f'<tr data-lock="{_e(row.key)}"><td><code>{_e(row.key)}</code></td>'
            f"<td>{_state_cell(row, now)}</td>"
            f"<td>{_holder_cell(row, now)}</td><td>{_waiters_cell(row, now)}</td><td>{action}</td></tr>"
        )
    return f"<table>{head}{''.join(body)}</table>"


def _board(session: Session, reader: GovernedReader) -> Board:
    return collect(session, reader)


@app.get("/board", response_class=HTMLResponse, dependencies=[Depends(requires_access_dag("GET"))])
def board_page(session: SessionDep, reader: ReaderDep) -> HTMLResponse:
    """The "Volcano locks" page: every lock the deployment uses, holder and waiters in order."""
    board = _board(session, reader)
    note = (
        '<p class="note">Live states are read from Volcano at most once per lock every 10 s, from the '
        "waiting budget (the holders' renewals are never delayed by this page).</p>"
    )
    if not board.rows:
        return _page("Volcano locks", "<p>No lock is held, waited for or named by a parsed DAG.</p>", True)
    return _page("Volcano locks", note + _lock_table(board, list(board.rows.values())), refresh=True)


@app.get("/api/locks", dependencies=[Depends(requires_access_dag("GET"))])
def board_json(session: SessionDep, reader: ReaderDep) -> JSONResponse:
    """The board as JSON (public facts only)."""
    board = _board(session, reader)
    out = []
    for row in board.rows.values():
        state = row.look.state
        out.append(
            {
                "lock_key": row.key,
                "held": row.held,
                "fencing_token": state.fencing_token if state is not None else None,
                "expires_in": row.expires_in(board.now),
                "holder": None
                if row.holder is None
                else {**row.holder.__dict__, "last_renewal": str(row.holder.last_renewal)},
                "waiters": [{**w.__dict__, "since": w.since.isoformat()} for w in row.waiters],
                "named_by": sorted(row.named_by),
            }
        )
    return JSONResponse({"locks": out, "looks_sent": reader.sent})


@app.get("/ti/{dag_id}/{run_id}/{task_id}/{map_index}", response_class=HTMLResponse)
def task_instance_tab(
    dag_id: str,
    run_id: str,
    task_id: str,
    map_index: str,
    session: SessionDep,
    reader: ReaderDep,
    _: Annotated[None, Depends(requires_access_dag("GET"))],
) -> HTMLResponse:
    """A task instance's Lock tab: the lock it holds or waits for, its state and its place in line."""
    try:
        index = int(map_index) if map_index not in ("", "{MAP_INDEX}") else -1
    except ValueError:
        raise HTTPException(400, f"map_index must be an integer, got {map_index!r}") from None
    board = _board(session, reader)
    found = board.row_of(dag_id, run_id, task_id, index)
    title = f"Lock of {dag_id} / {run_id} / {task_id}"
    if found is None:
        return _page(title, "<p>This task instance neither holds nor waits for a Volcano lock now.</p>", True)
    row, place = found
    where = (
        '<p class="place">This task instance <b>holds</b> the lock.</p>'
        if place == 0
        else f'<p class="place">This task instance is <b>number {place}</b> in line '
        f"of {len(row.waiters)}.</p>"
    )
    return _page(title, where + _lock_table(board, [row], actions=False), refresh=True)


def _holder_dag(row: LockRow) -> str | None:
    return row.holder.dag_id if row.holder is not None else None


@app.get("/confirm", response_class=HTMLResponse, dependencies=[Depends(requires_access_dag("GET"))])
def confirm_page(lock_key: str, session: SessionDep, reader: ReaderDep) -> HTMLResponse:
    """The confirmation of a force release: what it does, for which lease."""
    board = _board(session, reader)
    row = board.rows.get(lock_key)
    if row is None or not row.held or row.look.state is None:
        return _page("Force release", f"<p>Lock <code>{_e(lock_key)}</code> is not held (as last read).</p>")
    token = row.look.state.fencing_token
    body = (
        f"<p>Force release lock <code>{_e(lock_key)}</code>, held with fencing token {_e(token)} by "
        f"{_holder_cell(row, board.now) or 'another owner'}?</p><p>{_e(CONFIRMATION)}</p>"
        f'<form method="post" action="release"><input type="hidden" name="lock_key" value="{_e(lock_key)}">'
        f'<input type="hidden" name="fencing_token" value="{_e(token)}">'
        f'<button name="confirm" value="yes">Force release lease {_e(token)}</button> '
        f'<a href="board">Cancel</a></form>'
    )
    return _page("Force release", body)


@app.post("/release", response_class=HTMLResponse)
def release(
    request: Request,
    session: SessionDep,
    user: GetUserDep,
    reader: ReaderDep,
    lock_key: Annotated[str, Form()] = "",
    fencing_token: Annotated[str, Form()] = "",
) -> HTMLResponse:
    """Force release a lock's lease (edit access to the holder's DAG), with an audit log entry.

    A plain function: FastAPI runs it in its thread pool, so its database and Volcano calls never
    block the api-server's event loop.
    """
    origin = request.headers.get("origin")
    if origin and urlsplit(origin).netloc != request.headers.get("host"):
        # Airflow's session cookie is SameSite=Lax; this refuses a cross-origin form post outright too.
        raise HTTPException(403, f"cross-origin force release refused (origin {origin!r})")
    raw_token = fencing_token
    if not lock_key or not raw_token.isdigit():
        raise HTTPException(
            400, f"lock_key and an integer fencing_token are required, got {lock_key!r}, {raw_token!r}"
        )
    token = int(raw_token)
    from volcano_locks import VolcanoError

    try:
        fresh = collect(session, reader, direct=lock_key).rows[lock_key]
    except VolcanoError as exc:
        return _page("Force release", f"<p>Nothing released: Volcano did not answer ({_e(exc)}).</p>")
    live = fresh.look.state
    assert live is not None  # look_now raises instead
    dag_id = _holder_dag(fresh)
    if not _may(user, "PUT", dag_id):
        scope = f"DAG {dag_id!r}" if dag_id else "every DAG (the holder is not in this deployment)"
        return HTMLResponse(
            _page(
                "Force release refused",
                f'<p class="refused">Refused: user {_e(user.get_name())} may not edit {_e(scope)}; lock '
                f"<code>{_e(lock_key)}</code> stays held.</p>",
            ).body,
            status_code=403,
        )
    if not live.held or live.fencing_token != token:
        return _page(
            "Force release",
            f"<p>Nothing released: lock <code>{_e(lock_key)}</code> is no longer held with fencing token "
            f"{token} (it is {'held with ' + str(live.fencing_token) if live.held else 'free'}).</p>",
        )
    by = user.get_name()
    record = ForcedRecord(lock_key, token, by, datetime.now(UTC).isoformat(timespec="seconds"))
    from airflow.models import Variable
    from airflow.models.log import Log

    Variable.set(
        FORCED_PREFIX + lock_key,
        record.to_json(),
        description="volcano-locks: a force release",
        session=session,
    )
    session.commit()  # the holder reads it when it notices the loss: before the release
    reader.force_release(lock_key)
    holder = fresh.holder
    entry = Log(
        event=FORCE_RELEASE_EVENT,
        owner=by,
        owner_display_name=by,
        extra=json.dumps(
            {
                "lock_key": lock_key,
                "fencing_token": token,
                "holder": holder.names() if holder else None,
            }
        ),
    )
    if holder is not None:
        entry.dag_id, entry.run_id, entry.task_id, entry.map_index = (
            holder.dag_id,
            holder.run_id,
            holder.task_id,
            holder.map_index,
        )
        entry.try_number = holder.try_number
    session.add(entry)
    session.commit()
    return _page(
        "Force release",
        f'<p class="done">Force-released lock <code>{_e(lock_key)}</code> (fencing token {token}) as '
        f'{_e(by)}; recorded in the audit log.</p><p><a href="board">Back to the board</a></p>',
    )
