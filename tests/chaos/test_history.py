"""Joining the clients' call logs with the servers' histories (history.load_ops), on records written by
hand: what is an operation, what an unknown outcome resolved by the server's log, what a phantom, and
what a mismatch between what a client saw and what its server logged."""

from __future__ import annotations

from typing import Any

from .history import load_ops

ANSWER = {"expires_at": "2027-01-15T08:00:05.000000Z", "fencing_token": 1}


def call(
    rid: str, outcome: str = "ok", status: int | None = 201, answer: Any = ANSWER, **kw: Any
) -> dict[str, Any]:
    return {
        "call": rid, "worker": "w0", "server": 0, "op": "acquire", "key": "k", "token_sha256": "t" * 12,
        "request_id": rid, "ttl": 5, "mono": 10.0, "end": 10.5, "outcome": outcome, "status": status,
        "answer": answer, **kw,
    }  # fmt: skip


def decided(rid: str, served: int | None = 201, status: int | None = 201, **kw: Any) -> dict[str, Any]:
    return {
        "server": 0, "pid": 1, "op": "acquire", "key": "k", "token_sha256": "t" * 12, "request_id": rid,
        "ttl": 5, "served": served, "status": status, "answer": ANSWER if served == 201 else None,
        "now_us": 1_800_000_000_000_000, "mono": 10.1, "mono_end": 10.2, **kw,
    }  # fmt: skip


def received(rid: str, mono: float = 10.1) -> dict[str, Any]:
    return {"ev": "recv", "server": 0, "pid": 1, "op": "acquire", "token_sha256": "t" * 12, "request_id": rid,
            "mono": mono}  # fmt: skip


KILL = {"ev": "server_kill", "server": 0, "mono": 12.0}


def test_an_answered_call_is_the_servers_decision() -> None:
    loaded = load_ops([call("a")], [received("a"), decided("a")])
    assert len(loaded.ops) == 1 and not loaded.ops[0].optional and loaded.ops[0].observed is not None
    assert loaded.counts["unknown_outcomes"] == 0 and not loaded.mismatches


def test_an_answer_the_server_never_gave_is_a_mismatch() -> None:
    other = {**ANSWER, "fencing_token": 7}
    loaded = load_ops([call("a", answer=other)], [received("a"), decided("a")])
    assert loaded.counts["answer_mismatches"] == 1 and "fencing_token': 7" in loaded.mismatches[0]


def test_a_fault_that_hid_the_decision_is_resolved_by_the_servers_log() -> None:
    loaded = load_ops(
        [call("a", status=503, answer={"code": "unavailable"})],
        [received("a"), decided("a", served=201, status=503)],  # decided, then answered 503 (when=after)
    )
    assert loaded.counts["unknown_outcomes"] == 1 and loaded.counts["resolved_by_server_log"] == 1
    (op,) = loaded.ops
    assert op.observed is not None and not op.optional
    assert (op.observed["status"], op.observed["fencing"]) == (201, 1) and isinstance(
        op.observed["expires_us"], int
    )


def test_a_request_a_killed_server_received_and_never_logged_is_a_phantom() -> None:
    loaded = load_ops(
        [call("a", outcome="unknown", status=None, answer=None)], [received("a", mono=10.1)], [KILL]
    )
    assert loaded.counts["phantoms"] == 1
    (phantom,) = loaded.ops
    assert phantom.optional and phantom.observed is None and (phantom.start, phantom.end) == (10.1, 12.0)


def test_an_unanswered_request_no_killed_server_had_received_changed_nothing() -> None:
    unknown = call("a", outcome="unknown", status=None, answer=None)
    assert load_ops([unknown], [], [KILL]).ops == []  # never received
    assert load_ops([unknown], [received("a")], []).ops == []  # its server lived on and decided nothing
    late = {**KILL, "mono": 9.0}  # killed before it was received: the process that had it lived on
    assert load_ops([unknown], [received("a")], [late]).ops == []


def test_a_decision_the_store_could_not_confirm_is_optional() -> None:
    loaded = load_ops(
        [call("a", status=503, answer={"code": "unavailable"})], [decided("a", served=503, status=503)]
    )
    (op,) = loaded.ops
    assert op.optional and op.observed is None and op.now_us is not None


def test_a_request_refused_before_any_decision_is_no_operation() -> None:
    for served in (None, 400, 429):
        assert load_ops([], [decided("a", served=served, status=served)]).ops == []
