"""The waiting lines tell the truth (issue 28): the holder's token and expiry with the read's age, a
handoff and whose, a resumed handoff never "not resumed yet", a holder whose try ended."""

from __future__ import annotations

from datetime import UTC, datetime

from airflow_provider_volcano import _handoff
from airflow_provider_volcano._tokens import TaskIdentity, new_nonce
from airflow_provider_volcano.records.handoff import HandoffRecord
from airflow_provider_volcano.records.holder import HolderRecord
from airflow_provider_volcano.runtime.waiting_line import holder_line
from volcano_locks import LockState

UNTIL = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
HELD = LockState(held=True, expires_at=UNTIL, fencing_token=7)
OWNER = TaskIdentity("etl", "load", "manual__1", -1, 2, new_nonce())
HANDOFF = HandoffRecord("k", 7, UNTIL, OWNER)
HOLDER = HolderRecord("k", 7, 30, "2026-12-02T08:00:00+00:00", "w1", "etl", "manual__1", "load", -1, 2)


def test_the_line_says_how_old_the_holders_token_and_expiry_are() -> None:
    assert holder_line(HELD, None, None, age=12.4).startswith(
        "held with fencing token 7 until 2026-12-02T09:00:00+00:00 (as read 12 s ago); "
    )
    assert "(as of a read of unknown age)" in holder_line(HELD, None, None)


def test_a_handoff_is_named_with_whose_it_is_and_a_resumed_one_is_never_not_resumed() -> None:
    waiting = holder_line(HELD, HANDOFF, "queued", age=0)
    assert (
        "a handoff to etl.load (run 'manual__1', try 2), which has not resumed yet (task state: queued)"
        in (waiting)
    )
    resumed = holder_line(HELD, HANDOFF, "running", age=0)
    assert "which has resumed (task state: running) and holds it now" in resumed
    assert "not resumed" not in resumed
    assert "task state: none (cleared)" in holder_line(HELD, HANDOFF, None, age=0)
    assert "task state: not reported" in holder_line(HELD, HANDOFF, _handoff._NOT_REPORTED, age=0)


def test_a_lease_no_record_names_is_not_called_a_handoff_nor_anything_it_is_not_known_to_be() -> None:
    line = holder_line(HELD, None, None, age=0)
    assert "not a handoff this deployment recorded" in line
    other = HandoffRecord("k", 6, UNTIL, OWNER)  # an older lease's record
    assert "not a handoff this deployment recorded" in holder_line(HELD, other, "queued", age=0)


def test_the_holders_try_and_its_end_are_named_from_its_record_while_it_names_the_live_token() -> None:
    line = holder_line(HELD, None, None, HOLDER, age=3)
    assert line.startswith("held by etl / manual__1 / load try 2 on w1, fencing token 7, since ")
    assert line.endswith("until 2026-12-02T09:00:00+00:00 (as read 3 s ago)")
    ended = holder_line(HELD, None, None, HOLDER, age=3, holder_state="failed")
    assert "that try has ended (task state: failed): its lease ends at its release or its expiry" in ended
    newer = LockState(held=True, expires_at=UNTIL, fencing_token=8)
    assert "etl / manual__1" not in holder_line(newer, None, None, HOLDER, age=3)  # a stale record
    assert holder_line(None, None, None) == "held by another owner (not read yet)"
