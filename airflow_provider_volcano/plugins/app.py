"""The lock board's FastAPI app: the "Volcano locks" page, a task instance's Lock tab, force release.

Airflow mounts plugin apps without authenticating them, so every route here depends on Airflow's own
auth (:func:`~airflow.api_fastapi.core_api.security.get_user` and the auth manager), through
:class:`~airflow_provider_volcano.plugins.access.Access`, before the board sends Volcano anything:

- the board, its JSON and the confirmation page show the locks of the DAGs the user may read, and of
  those DAGs only (other DAGs' holders, waiters and names are left out); ``?dag_id=`` narrows that;
- force release needs edit on the DAG of the lease's *sealed* provenance record, or on every DAG when
  the holder is unknown or its record unsealed; the button is shown only to users who have it;
- a refused force release sends Volcano nothing and is written to Airflow's audit log (the ``log``
  table, as Airflow's own routes do) with the user and the lock, as is a force release done (also to
  the force-release record the losing holder names in its failure);
- an authorised release reads the lock once, from the request budget, and releases only the lease
  with the fencing token the user confirmed (Volcano cannot make that check and the release one
  step: :data:`NOT_ATOMIC`).

The pages are server-rendered HTML (no script), shown by the UI in an iframe of the same origin only
(``frame-ancestors 'self'`` on every response).
"""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote, urlsplit

from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.configuration import conf
from airflow.models import Variable
from airflow.models.log import Log
from fastapi import Depends, FastAPI, Form, HTTPException, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse

from airflow_provider_volcano.hooks.volcano import VolcanoHook
from airflow_provider_volcano.plugins.access import Access
from airflow_provider_volcano.plugins.actions import UserActions
from airflow_provider_volcano.plugins.board import Board, GovernedReader, LockRow, collect, resolve_holder
from airflow_provider_volcano.plugins.history import handovers
from airflow_provider_volcano.records.forced import ForcedRecord, forced_variable
from airflow_provider_volcano.records.opened import sealed
from volcano_locks import InvalidRequest, VolcanoError, validate_key
from volcano_locks.integration import Eta, expected_start

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = [
    "FORCE_RELEASE_EVENT",
    "FORCE_RELEASE_REFUSED_EVENT",
    "FRAME_HEADERS",
    "NOT_ATOMIC",
    "UserActions",
    "app",
]

FORCE_RELEASE_EVENT = "volcano_lock_force_release"
FORCE_RELEASE_REFUSED_EVENT = "volcano_lock_force_release_refused"
FRAME_HEADERS = {"Content-Security-Policy": "frame-ancestors 'self'", "X-Frame-Options": "SAMEORIGIN"}
"""Sent with every response: only Airflow's own UI (same origin) may frame the board."""
NOT_ATOMIC = (
    "The board checks that the lease is still the one you confirmed, then releases it: two requests, "
    "because Volcano's force release takes no condition. If the lock changes hands between them (one "
    "request's time), the new lease is the one released; fencing still rejects every older holder's writes."
)
CONFIRMATION = (
    "Force release ends the current lease at once, whoever holds it. The old holder is not stopped "
    "now: it notices at its next renewal (within a third of its TTL) and stops, and its task fails "
    "naming this force release. Until then it may still be writing: fencing rejects its late writes "
    "(its fencing token is older than the next holder's). The next waiter in line can acquire at once."
)

app = FastAPI(title="Volcano locks", description="Who holds each Volcano lock, who waits, and force release.")


@app.middleware("http")
async def _frame_headers(request: Request, call_next: Any) -> Response:
    response: Response = await call_next(request)
    response.headers.update(FRAME_HEADERS)
    return response


def _reader(request: Request) -> GovernedReader:
    """The app's one reader (its cache is what keeps the page within one look per lock per refresh)."""
    reader: GovernedReader | None = getattr(request.app.state, "volcano_reader", None)
    if reader is None:
        conn_id = conf.get("volcano", "board_conn_id", fallback="volcano_default")
        hook = VolcanoHook(conn_id)
        reader = GovernedReader(hook.get_client(), keys=hook.keyring)
        request.app.state.volcano_reader = reader
    return reader


ReaderDep = Annotated[GovernedReader, Depends(_reader)]


def _access(user: GetUserDep, session: SessionDep) -> Access:
    """The signed-in user's access; 403 for a user who may read no DAG (Airflow's DAG list does the same)."""
    access = Access.of(user, session)
    if not access.reads_any:
        raise HTTPException(403, f"user {access.user!r} may not read any DAG")
    return access


AccessDep = Annotated[Access, Depends(_access)]


def _narrowed(access: Access, dag_id: str | None) -> str | None:
    """The ``dag_id`` filter, which only narrows: 403 naming it when the user may not read that DAG."""
    if dag_id is not None and not access.may_read(dag_id):
        raise HTTPException(403, f"user {access.user!r} may not read DAG {dag_id!r}")
    return dag_id


def _key(lock_key: str) -> str:
    try:
        return validate_key(lock_key)
    except InvalidRequest as exc:
        raise HTTPException(400, str(exc)) from None


def _force_dag(row: LockRow) -> tuple[bool, str | None]:
    """(held, the DAG whose edit permission a force release of the live lease needs: ``None`` for all)."""
    state = row.look.state
    if state is None or not state.held or state.fencing_token is None:
        return False, None
    return True, row.sealed_dag(state.fencing_token)


def _scope(dag_id: str | None) -> str:
    return (
        f"DAG {dag_id!r}"
        if dag_id is not None
        else "every DAG (the holder of this lease is unknown or its record is not sealed)"
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
.eta{color:#2c5282;font-size:90%}details.history{margin-top:6px;font-size:90%}
details.history table{margin-top:4px}.ending-lost,.ending-expired,.ending-force-released{color:#9b2c2c}
.ending-lapsed{color:#c05621}.ending-holding{color:#c05621;font-weight:600}
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
    if row.holder_hidden:
        return "held by a task of a DAG you may not read"
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
    hidden = (
        f'<p class="note">and {row.hidden_waiters} of DAGs you may not read</p>' if row.hidden_waiters else ""
    )
    if not row.waiters:
        return hidden or '<span class="note">none</span>'
    items = "".join(
        f'<li class="waiter"><a target="_top" '
        f'href="{_e(_ti_href(w.dag_id, w.run_id, w.task_id, w.map_index))}">'
        f"{_e(w.names())}</a> ({_e(w.where)}, waiting {_ago(w.waited(now).total_seconds())})"
        f'<br><span class="eta">{_e(_eta_phrase(w.eta))}</span></li>'
        for w in row.waiters
    )
    return f"<ol>{items}</ol>{hidden}"


def _eta_phrase(eta: Eta | None) -> str:
    """A waiter's expected start on the board: the waiting lines' phrase, its place counted board-wide."""
    if eta is None:
        return "no start estimate yet (no tenure of this lock has ended on record)"
    return expected_start(eta).replace(" in line here,", " in line,")


def _history(row: LockRow, *, open_: bool = False) -> str:
    """The lock's latest tenures, newest first, under a fold (open on a task instance's Lock tab)."""
    if not row.tenures:
        return ""
    lines = "".join(
        f'<tr class="tenure"><td>{_e(t.names())}</td><td>{_e(t.record.fencing_token)}</td>'
        f"<td>{_e(_clock(t.record.acquired_at))}</td><td>{_e(_clock(t.record.ended_at) or '-')}</td>"
        f'<td class="ending-{_e(t.ending)}">{_e(t.ending)}</td></tr>'
        for t in row.tenures
    )
    return (
        f'<details class="history"{" open" if open_ else ""}><summary>History: {_e(handovers(row.tenures))}'
        "</summary><table><tr><th>Holder</th><th>Fencing token</th><th>Start</th><th>End</th>"
        f"<th>How it ended</th></tr>{lines}</table></details>"
    )


def _clock(iso: str) -> str:
    """A record's time as the board shows it (UTC, to the second)."""
    try:
        return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return iso


def _lock_table(
    board: Board, rows: list[LockRow], access: Access | None = None, *, history_open: bool = False
) -> str:
    """The rows as a table (each lock's history under it); with ``access``, a Force release button where
    that user may use it."""
    now = board.now
    head = "<tr><th>Lock</th><th>State</th><th>Holder</th><th>Waiters (in order)</th><th></th></tr>"
    body = []
    for row in rows:
        action = ""
        held, dag_id = _force_dag(row)
        if access is not None and held and access.may_edit(dag_id):
            action = (
                f'<form method="get" action="confirm">'
                f'<input type="hidden" name="lock_key" value="{_e(row.key)}">'
                f"<button>Force release…</button></form>"
            )
        body.append(
            f'<tr data-lock="{_e(row.key)}"><td><code>{_e(row.key)}</code>'
            f"{_history(row, open_=history_open)}</td>"
            f"<td>{_state_cell(row, now)}</td>"
            f"<td>{_holder_cell(row, now)}</td><td>{_waiters_cell(row, now)}</td><td>{action}</td></tr>"
        )
    return f"<table>{head}{''.join(body)}</table>"


def _board(session: Session, reader: GovernedReader, access: Access, dag_id: str | None) -> Board:
    """The user's board: only the rows they may see are read from Volcano, then each is redacted."""
    board = collect(session, reader, only=lambda row: access.sees(row, dag_id))
    board.rows = {key: access.redact(row) for key, row in board.rows.items()}
    return board


@app.get("/board", response_class=HTMLResponse)
def board_page(
    session: SessionDep, reader: ReaderDep, access: AccessDep, dag_id: str | None = None
) -> HTMLResponse:
    """The "Volcano locks" page: the locks of the DAGs the user may read, holder and waiters in order."""
    board = _board(session, reader, access, _narrowed(access, dag_id))
    note = (
        '<p class="note">Live states are read from Volcano at most once per lock every 10 s, from the '
        "waiting budget (the holders' renewals are never delayed by this page).</p>"
    )
    if not board.rows:
        return _page(
            "Volcano locks", "<p>No lock is held, waited for or named by a DAG you may read.</p>", True
        )
    return _page("Volcano locks", note + _lock_table(board, list(board.rows.values()), access), refresh=True)


@app.get("/api/locks")
def board_json(
    session: SessionDep, reader: ReaderDep, access: AccessDep, dag_id: str | None = None
) -> JSONResponse:
    """The board as JSON (public facts only, of the DAGs the user may read)."""
    board = _board(session, reader, access, _narrowed(access, dag_id))
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
                "holder_hidden": row.holder_hidden,
                "waiters": [
                    {**w.__dict__, "since": w.since.isoformat(), "eta": w.eta.as_dict() if w.eta else None}
                    for w in row.waiters
                ],
                "history": [t.as_dict() for t in row.tenures],
                "hidden_waiters": row.hidden_waiters,
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
    access: AccessDep,
    _: Annotated[None, Depends(requires_access_dag("GET"))],
) -> HTMLResponse:
    """A task instance's Lock tab: the lock it holds or waits for, its state and its place in line."""
    try:
        index = int(map_index) if map_index not in ("", "{MAP_INDEX}") else -1
    except ValueError:
        raise HTTPException(400, f"map_index must be an integer, got {map_index!r}") from None
    ti = (dag_id, run_id, task_id, index)

    def names_this_ti(row: LockRow) -> bool:
        return any((w.dag_id, w.run_id, w.task_id, w.map_index) == ti for w in row.waiters) or any(
            (c.holder.dag_id, c.holder.run_id, c.holder.task_id, c.holder.map_index) == ti for c in row.claims
        )

    board = collect(session, reader, only=names_this_ti)  # the path's DAG is readable (checked above)
    board.rows = {key: access.redact(row) for key, row in board.rows.items()}
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
    return _page(title, where + _lock_table(board, [row], history_open=True), refresh=True)


@app.get("/confirm", response_class=HTMLResponse)
def confirm_page(
    lock_key: str, session: SessionDep, reader: ReaderDep, access: AccessDep, dag_id: str | None = None
) -> HTMLResponse:
    """The confirmation of a force release: what it does, for which lease (only to who may do it)."""
    key = _key(lock_key)
    narrowed = _narrowed(access, dag_id)
    if not access.edits_any:  # a Viewer: refused before anything is read from Volcano
        return _page(
            "Force release",
            f'<p class="refused">You may not force-release lock <code>{_e(key)}</code>: it needs edit on '
            "a DAG.</p>",
        )
    board = collect(
        session, reader, only=lambda row: row.key == key and access.sees(row, narrowed), lock_keys=[key]
    )
    row = board.rows.get(key)
    if row is None:
        return _page("Force release", f"<p>Lock <code>{_e(key)}</code> is not on your board.</p>")
    held, holder_dag = _force_dag(row)
    row = access.redact(row)
    if not held or row.look.state is None:
        return _page("Force release", f"<p>Lock <code>{_e(key)}</code> is not held (as last read).</p>")
    token = row.look.state.fencing_token
    what = (
        f"<p>Force release lock <code>{_e(key)}</code>, held with fencing token {_e(token)} by "
        f"{_holder_cell(row, board.now) or 'another owner'}?</p><p>{_e(CONFIRMATION)}</p>"
        f'<p class="note">{_e(NOT_ATOMIC)}</p>'
    )
    if not access.may_edit(holder_dag):
        return _page(
            "Force release",
            what + f'<p class="refused">You may not: it needs edit on {_e(_scope(holder_dag))}.</p>',
        )
    body = what + (
        f'<form method="post" action="release"><input type="hidden" name="lock_key" value="{_e(key)}">'
        f'<input type="hidden" name="fencing_token" value="{_e(token)}">'
        f'<button name="confirm" value="yes">Force release lease {_e(token)}</button> '
        f'<a href="board">Cancel</a></form>'
    )
    return _page("Force release", body)


def _audit(session: Session, event: str, access: Access, extra: dict[str, Any], row: LockRow) -> None:
    """One entry in Airflow's audit log, naming the sealed holder's task try when there is one."""
    entry = Log(event=event, owner=access.user, owner_display_name=access.user, extra=json.dumps(extra))
    holder = row.holder  # only ever from a sealed record bound to the lease
    if holder is not None:
        entry.dag_id, entry.run_id, entry.task_id = holder.dag_id, holder.run_id, holder.task_id
        entry.map_index, entry.try_number = holder.map_index, holder.try_number
    session.add(entry)
    session.commit()


@app.post("/release", response_class=HTMLResponse)
def release(
    request: Request,
    session: SessionDep,
    user: GetUserDep,
    reader: ReaderDep,
    lock_key: Annotated[str, Form()] = "",
    fencing_token: Annotated[str, Form()] = "",
) -> HTMLResponse:
    """Force release the lease ``fencing_token`` of ``lock_key``; refused or done, an audit log entry.

    Needs edit on the DAG of that lease's sealed provenance (every DAG without one), checked before
    any request to Volcano; then one read from the request budget confirms the lease is still the
    live one.

    A plain function: FastAPI runs it in its thread pool, so its database and Volcano calls never
    block the api-server's event loop.
    """
    origin = request.headers.get("origin")
    if origin and urlsplit(origin).netloc != request.headers.get("host"):
        # Airflow's session cookie is SameSite=Lax; this refuses a cross-origin form post outright too.
        raise HTTPException(403, f"cross-origin force release refused (origin {origin!r})")
    if not fencing_token.isdigit():
        raise HTTPException(400, f"fencing_token must be a non-negative integer, got {fencing_token!r}")
    key, token = _key(lock_key), int(fencing_token)
    access = Access.of(user, session)
    # Permission first, from Airflow's auth and the sealed provenance of the lease the user confirmed:
    # nothing is sent to Volcano for a refused attempt.
    row = collect(session, reader, lock_keys=[key], look=False).rows[key]
    needed = row.sealed_dag(token)
    if not access.may_edit(needed):
        claim = next((c for c in row.claims if c.fencing_token == token), None)
        row.holder = claim.holder if claim is not None else None
        _audit(
            session,
            FORCE_RELEASE_REFUSED_EVENT,
            access,
            {"lock_key": key, "fencing_token": token, "needed": f"edit on {_scope(needed)}"},
            row,
        )
        return HTMLResponse(
            _page(
                "Force release refused",
                f'<p class="refused">Refused: user {_e(access.user)} may not edit {_e(_scope(needed))}; lock '
                f"<code>{_e(key)}</code> stays held. Recorded in the audit log.</p>",
            ).body,
            status_code=403,
        )
    try:
        row.look = reader.look_for_release(key)
    except VolcanoError as exc:
        return _page("Force release", f"<p>Nothing released: Volcano did not answer ({_e(exc)}).</p>")
    live = row.look.state
    if live is None:
        return _page("Force release", f"<p>Nothing released: {_e(row.look.error)}.</p>")
    if not live.held or live.fencing_token != token:
        return _page(
            "Force release",
            f"<p>Nothing released: lock <code>{_e(key)}</code> is no longer held with fencing token "
            f"{token} (it is {'held with ' + str(live.fencing_token) if live.held else 'free'}).</p>",
        )
    resolve_holder(row)
    record = ForcedRecord(key, token, access.user, datetime.now(UTC).isoformat(timespec="seconds"))
    assert reader.keys is not None  # the app's reader has its connection's keys
    Variable.set(
        forced_variable(key),
        json.dumps(sealed(reader.keys, record), sort_keys=True),
        description="volcano-locks: a force release",
        session=session,
    )
    session.commit()  # the holder reads it when it notices the loss: before the release
    reader.force_release(key)
    holder = row.holder
    _audit(
        session,
        FORCE_RELEASE_EVENT,
        access,
        {
            "lock_key": key,
            "fencing_token": token,
            "holder": holder.names() if holder is not None else None,
        },
        row,
    )
    return _page(
        "Force release",
        f'<p class="done">Force-released lock <code>{_e(key)}</code> (fencing token {token}) as '
        f'{_e(access.user)}; recorded in the audit log.</p><p><a href="board">Back to the board</a></p>',
    )
