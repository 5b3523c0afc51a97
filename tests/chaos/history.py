"""The histories the model checker reads: every lock call as a client saw it, and as the server decided it.

**Client side** (:class:`RecordingTransport`): each chaos worker sends through it, and it appends two
JSON lines per HTTP attempt to ``calls-<worker>.jsonl``: ``invoke`` before the request leaves (op, key,
the token's SHA-256 prefix, request id, TTL, the server index, ``mono``) and, when the attempt ends,
``ok`` (status and body) or ``unknown`` (no complete answer: a timeout, a reset, a dropped connection).
The ownership token itself is never written; the fencing token is public.

**Server side**: every server process appends its request history (``serve --history``, see
``volcano_locks/server/requestlog.py``): what the service decided (``served``, ``answer``), when by its
own clock (``now_us``) and when on the machine's monotonic clock (``mono`` .. ``mono_end``), flushed per
request, so a server killed with SIGKILL leaves everything it answered.

:func:`load_ops` joins them into the checker's operations (:class:`linearizability.Op`):

- a request the server decided is an operation with the server's answer, placed in the server's window;
  a request the server decided while its store failed (503 ``unavailable``) may or may not have
  committed, so it is optional;
- a request refused before any decision (bad input, 401/403, 429, an injected fault before it) changed
  nothing and is left out;
- every client attempt is matched to the server's record of it (request id, op, token): an answer the
  client saw must be the answer the server logged (``answer_mismatches`` otherwise: a violation); an
  attempt the client saw no answer to is an *unknown outcome*, resolved by the server's record when there
  is one; when there is none but a server process had received it (its ``recv`` record, written before
  anything can change) and was killed after, it is a *phantom*: optional, placed anywhere between its
  receipt and that kill, its effect unknown. Received by no process, or by one that lived on and
  logged no decision: it changed nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote

import httpx

from volcano_locks.transport import DeadlineTransport

from .events import read_events
from .linearizability import Op

__all__ = ["LoadedOps", "RecordingTransport", "load_ops", "read_calls", "read_server_history"]

_LEASE_OPS = {"POST": "acquire", "PATCH": "renew", "DELETE": "release"}
_LOCK_OPS = {"GET": "get", "DELETE": "force_release"}
_NO_EFFECT = {400, 401, 403, 404, 405, 429}
"""Answers given before any decision: the request changed nothing."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def token_hash(token: str) -> str:
    """The first 12 hex digits of the token's SHA-256: what the server's history records too."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()[:12]


def _describe_request(request: httpx.Request) -> dict[str, Any]:
    path = request.url.path
    rest = path.removeprefix("/locks/")
    if rest.endswith("/lease"):
        key, op = rest[: -len("/lease")], _LEASE_OPS.get(request.method)
    else:
        key, op = rest, _LOCK_OPS.get(request.method)
    token = request.headers.get("x-volcano-lock-token")
    ttl = None
    if request.method in ("POST", "PATCH"):
        try:
            ttl = json.loads(request.content)["ttl_seconds"]
        except (ValueError, KeyError, TypeError):
            ttl = None
    return {
        "op": op,
        "key": unquote(key),
        "token_sha256": token_hash(token) if token else None,
        "request_id": request.headers.get("x-volcano-request-id"),
        "ttl": ttl,
    }


class _Writer:
    """Append JSON lines to one file, flushed per line (a SIGKILL loses at most a torn last line)."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            if not self._file.closed:
                self._file.write(line)
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


class _RecordedStream(httpx.SyncByteStream):
    """The response body as the client reads it; the attempt ends when the body is complete or dropped."""

    def __init__(self, inner: httpx.SyncByteStream, finish: Any) -> None:
        self._inner = inner
        self._finish = finish
        self._chunks: list[bytes] = []
        self._complete = False

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            self._chunks.append(chunk)
            yield chunk
        self._complete = True

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._finish(b"".join(self._chunks) if self._complete else None)


class RecordingTransport(DeadlineTransport):
    """The client's own transport (every network wait bounded), writing each attempt to a call log."""

    def __init__(self, path: Path, *, worker: str, server: int) -> None:
        """Append this worker's attempts to ``path``; ``server`` is the index of the server it talks to."""
        super().__init__(None)
        self._writer = _Writer(path)
        self._worker = worker
        self._server = server
        self._lock = threading.Lock()
        self._next = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``, writing ``invoke`` first and ``ok`` or ``unknown`` when the attempt ends."""
        with self._lock:
            self._next += 1
            call = f"{self._worker}:{os.getpid()}:{self._next}"
        self._writer.write(
            {
                "ph": "invoke",
                "call": call,
                "worker": self._worker,
                "server": self._server,
                "mono": time.monotonic(),
            }
            | _describe_request(request)
        )
        try:
            response = super().handle_request(request)
        except BaseException as exc:
            self._writer.write(
                {"ph": "unknown", "call": call, "mono": time.monotonic(), "error": type(exc).__name__}
            )
            raise
        status = response.status_code
        done = False

        def finish(body: bytes | None) -> None:
            nonlocal done
            if done:
                return
            done = True
            record: dict[str, Any] = {"call": call, "mono": time.monotonic(), "status": status}
            if body is None:
                self._writer.write({"ph": "unknown", **record, "error": "incomplete body"})
                return
            try:
                answer = json.loads(body) if body else None
            except ValueError:
                answer = None
            self._writer.write({"ph": "ok", **record, "answer": answer})

        assert isinstance(response.stream, httpx.SyncByteStream)
        response.stream = _RecordedStream(response.stream, finish)
        return response

    def close(self) -> None:
        """Close the connections and the call log."""
        super().close()
        self._writer.close()


# -- reading ----------------------------------------------------------------------------------------------


def read_calls(directory: Path) -> list[dict[str, Any]]:
    """Every client attempt in ``directory``'s ``calls-*.jsonl``: the invoke record with ``end`` and
    ``outcome`` (``ok`` with ``status``/``answer``, or ``unknown``, also when the process died first)."""
    calls: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("calls-*.jsonl")):
        for rec in read_events(path):
            if rec["ph"] == "invoke":
                calls[rec["call"]] = {**rec, "end": math.inf, "outcome": "unknown"}
            elif rec["call"] in calls:
                call = calls[rec["call"]]
                call["end"] = float(rec["mono"])
                call["outcome"] = rec["ph"]
                call["status"] = rec.get("status")
                call["answer"] = rec.get("answer")
    return list(calls.values())


def read_server_history(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every request record (``recv`` ones included, clock notes left out) of the servers' history files,
    with ``server``: the index of the file's server (``history-<index>.jsonl``)."""
    out = []
    for path in paths:
        index = int(path.stem.rsplit("-", 1)[1])
        out.extend({**rec, "server": index} for rec in read_events(path) if rec.get("op"))
    return out


def _parse_expires(text: Any) -> int | None:
    if not isinstance(text, str):
        return None
    try:
        when = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    except ValueError:
        return None
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def observed_of(op: str, status: int, answer: Any) -> dict[str, Any]:
    """The model's view of an answer: status, code, and the grant's or read's facts."""
    seen: dict[str, Any] = {"status": status}
    body = answer if isinstance(answer, Mapping) else {}
    if status == 409:
        seen["code"] = body.get("code")
    elif status in (200, 201) and op in ("acquire", "renew"):
        seen["fencing"] = body.get("fencing_token")
        seen["expires_us"] = _parse_expires(body.get("expires_at"))
    elif status == 200 and op == "get":
        seen["held"] = body.get("held")
        if body.get("held"):
            seen["fencing"] = body.get("fencing_token")
            seen["expires_us"] = _parse_expires(body.get("expires_at"))
    return seen


@dataclass
class LoadedOps:
    """The checker's operations and what the join counted."""

    ops: list[Op]
    counts: dict[str, int]
    mismatches: list[str]


def _kills(faults: Iterable[Mapping[str, Any]]) -> dict[int, list[float]]:
    kills: dict[int, list[float]] = defaultdict(list)
    for f in faults:
        if f.get("ev") == "server_kill":
            kills[int(f["server"])].append(float(f["mono"]))
    return kills


def load_ops(
    calls: list[dict[str, Any]], server: list[dict[str, Any]], faults: Iterable[Mapping[str, Any]] = ()
) -> LoadedOps:
    """Join the client attempts with the servers' records into the checker's operations.

    Args:
        calls: client attempts (:func:`read_calls`).
        server: the servers' request records (:func:`read_server_history`).
        faults: the driver's records; ``server_kill`` (``server``, ``mono``) bound where phantoms may land.
    """
    ops: list[Op] = []
    counts = {
        "client_calls": len(calls),
        "unknown_outcomes": 0,
        "resolved_by_server_log": 0,
        "never_received": 0,
        "phantoms": 0,
    }
    mismatches: list[str] = []
    by_request: dict[tuple[str | None, str | None, str | None], list[dict[str, Any]]] = defaultdict(list)
    received: dict[tuple[str | None, str | None, str | None], list[dict[str, Any]]] = defaultdict(list)
    for rec in server:
        ident = (rec.get("request_id"), rec["op"], rec.get("token_sha256"))
        if rec.get("ev") == "recv":
            received[ident].append(rec)
            continue
        by_request[ident].append(rec)
        if rec.get("key") is None or rec.get("served") is None or rec["served"] in _NO_EFFECT:
            continue  # refused before any decision (or a fault answered first): nothing happened
        uncertain = rec["served"] >= 500  # the store failed: its commit may or may not have happened
        _add(
            ops,
            rec,
            end=float(rec["mono_end"]),
            now_us=rec.get("now_us"),
            observed=None if uncertain else observed_of(rec["op"], rec["served"], rec.get("answer")),
            label=f"server {rec['server']} pid {rec.get('pid')} request {rec.get('request_id')}",
        )
    kills = _kills(faults)
    for call in sorted(calls, key=lambda c: float(c["mono"])):
        if call.get("op") is None:
            continue
        records = by_request.get((call.get("request_id"), call["op"], call.get("token_sha256")), [])
        status = call.get("status")
        if call["outcome"] == "ok" and not any(
            r.get("status") == status and _same_answer(r, call) for r in records
        ):
            logged = [(r.get("status"), r.get("answer")) for r in records]
            mismatches.append(
                f"{call['worker']} {call['op']} request {call.get('request_id')}: the client saw {status} "
                f"{call.get('answer')}, the server logged {logged}"
            )
            continue
        if call["outcome"] == "ok" and status < 500:
            continue  # an answer the client could act on, and the server's record of it is an operation
        counts["unknown_outcomes"] += 1  # no answer, or a 5xx: the client cannot tell what happened
        if records:  # the server logged its fate: decided (an operation above) or refused before deciding
            counts["resolved_by_server_log"] += 1
            continue
        # Not decided in any server's log. Only a server process that had received it and was then killed
        # may have decided it unlogged: between receiving it and dying.
        receipts = received.get((call.get("request_id"), call["op"], call.get("token_sha256")), [])
        counts["never_received"] += not receipts  # lost on the way (a cut, a server down): nothing happened
        for got in receipts:
            start = float(got["mono"])
            later = [k for k in kills.get(int(got["server"]), []) if k >= start]
            if not later:
                continue  # that process lived on (or shut down at the end): it never decided it
            counts["phantoms"] += 1
            _add(
                ops,
                {**call, "mono": start},
                end=min(later),
                now_us=None,
                observed=None,
                label=f"phantom: {call['worker']} {call.get('request_id')}, killed server {got['server']}",
            )
    counts["answer_mismatches"] = len(mismatches)
    # The server kill -9s (and restarts) the model's state runs across: between the first and the last
    # operation checked. A grant lost or a fencing token reused across one is a violation.
    if ops:
        first, last = min(o.start for o in ops), max(o.start for o in ops)
        counts["kills_spanned"] = sum(first < k < last for ks in kills.values() for k in ks)
    return LoadedOps(ops, counts, mismatches)


def _add(
    ops: list[Op],
    source: Mapping[str, Any],
    *,
    end: float,
    now_us: int | None,
    observed: dict[str, Any] | None,
    label: str,
) -> None:
    """Append the operation ``source`` (a server record or a client call) describes; no observation:
    optional (it may never have taken effect)."""
    ops.append(
        Op(
            id=len(ops),
            key=source["key"],
            kind=source["op"],
            token=source.get("token_sha256"),
            ttl=source.get("ttl"),
            start=float(source["mono"]),
            end=end,
            now_us=now_us,
            observed=observed,
            optional=observed is None,
            label=label,
        )
    )


def _same_answer(record: Mapping[str, Any], call: Mapping[str, Any]) -> bool:
    """The client saw what the server sent: the served answer, or the fault that replaced it."""
    status = call.get("status")
    if record.get("served") != status:  # a fault replaced the answer: only its status is comparable
        return True
    return observed_of(call["op"], status, call.get("answer")) == observed_of(
        call["op"], status, record.get("answer")
    )
