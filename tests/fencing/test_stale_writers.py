"""The matrix: a stale writer against a newer one, with a real pause, on every driver and commit style.

For each driver (sqlite3, aiosqlite, psycopg, psycopg2, asyncpg, psycopg's async side) the stale writer S
(fencing token 5) is a thread playing a script through ``begin`` or ``claim``; it is paused for real (it
blocks on an event, holding whatever it holds) while the newer writer N (token 6) writes; then it resumes.
The rows left say what landed, in insertion order: in every case 0 stale writes land after the newer one.

- ``claim`` with commit-as-you-go: a batch, ``conn.commit()``, the pause, the next batch (refused).
- ``begin`` with a ``conn.commit()`` inside: the same, inside the block.
- ``begin`` paused before its transaction: refused at the guard, nothing of it lands.
- ``begin`` paused inside its transaction, holding the guard: N waits for it, and lands after it.
- each of those on a session in autocommit mode: refused before any statement of S's ran.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from volcano_locks.fencing import Fence, StaleFencingToken

from .conftest import ALL_DRIVERS
from .helpers import PARTS, Script, SqlTarget

KEY = "matrix-lock"
STALE, NEWER = Fence(KEY, 5), Fence(KEY, 6)

SCRIPTS = {
    "claim, commit-as-you-go": ("claim", ("write", "commit", "mid", "write", "commit"), "mid"),
    "begin, commit inside": ("begin", ("write", "commit", "mid", "write"), "mid"),
    "begin, paused before": ("begin", ("write",), "before"),
}


def _batches(target: SqlTarget) -> list[tuple[int, str, int]]:
    """(token, writer, batch) of each whole batch, in insertion order; a partial batch fails the test."""
    rows = target.orders_of("orders")
    batches = [(t, w, p // PARTS) for t, w, p in rows if p % PARTS == 0]
    whole = [(t, w, b * PARTS + i) for t, w, b in batches for i in range(PARTS)]
    assert sorted(rows) == sorted(whole), "a partial batch landed"
    return batches


def _start(target: SqlTarget, script: Script) -> threading.Thread:
    thread = threading.Thread(target=target.run, args=(script,), name=script.writer, daemon=True)
    thread.start()
    return thread


def _finish(script: Script, thread: threading.Thread) -> None:
    script.resume.set()
    thread.join(60)
    assert script.done.is_set() and not thread.is_alive(), f"{script.writer} hung"


@pytest.mark.parametrize("driver", ALL_DRIVERS)
@pytest.mark.parametrize("case", sorted(SCRIPTS))
def test_a_stale_writer_resumed_after_a_newer_one_lands_nothing_after_it(
    make_target: Callable[..., SqlTarget], driver: str, case: str
) -> None:
    mode, steps, pause = SCRIPTS[case]
    stale_target, newer_target = make_target(driver), make_target(driver)
    stale = Script("orders", STALE, "stale", mode, steps, frozenset({pause}))
    thread = _start(stale_target, stale)
    assert stale.paused.wait(60), "the stale writer never reached its pause"
    newer_target.write("orders", NEWER, "newer")  # while the stale one is frozen
    _finish(stale, thread)
    assert isinstance(stale.error, StaleFencingToken), stale.error
    assert stale.error.stored_token == 6
    landed = _batches(newer_target)
    assert landed[-1] == (6, "newer", 0)
    assert all(w == "stale" and b == 0 for _, w, b in landed[:-1])  # only what it committed before N
    assert len(landed) == (1 if pause == "before" else 2)
    assert newer_target.guard.read("orders") == NEWER


@pytest.mark.parametrize("driver", ALL_DRIVERS)
def test_a_writer_paused_inside_its_transaction_holds_the_newer_one_back_until_it_ends(
    make_target: Callable[..., SqlTarget], driver: str
) -> None:
    """Paused while holding the guard: N queues on the guard row, and its write lands after S's commit."""
    stale_target, newer_target = make_target(driver), make_target(driver)
    stale = Script("orders", STALE, "stale", "begin", ("write", "mid", "write"), frozenset({"mid"}))
    thread = _start(stale_target, stale)
    assert stale.paused.wait(60)
    newer_done = threading.Event()
    newer_errors: list[BaseException] = []

    def newer() -> None:
        try:
            newer_target.write("orders", NEWER, "newer")
        except BaseException as exc:
            newer_errors.append(exc)
        finally:
            newer_done.set()

    threading.Thread(target=newer, daemon=True).start()
    assert not newer_done.wait(0.5), "the newer writer went past a guard held by another transaction"
    _finish(stale, thread)
    assert newer_done.wait(60) and not newer_errors and stale.error is None
    assert _batches(newer_target) == [(5, "stale", 0), (5, "stale", 2), (6, "newer", 0)]


@pytest.mark.parametrize("driver", ALL_DRIVERS)
@pytest.mark.parametrize("mode", ["claim", "begin"])
def test_a_writer_in_autocommit_mode_is_refused_before_any_of_its_statements(
    make_target: Callable[..., SqlTarget], driver: str, mode: str
) -> None:
    stale_target, newer_target = make_target(driver, autocommit=True), make_target(driver)
    stale = Script("orders", STALE, "stale", mode, ("write", "commit", "mid", "write"), frozenset({"mid"}))
    thread = _start(stale_target, stale)
    stale.done.wait(60)
    _finish(stale, thread)
    assert isinstance(stale.error, ValueError) and "autocommit mode" in str(stale.error)
    assert stale.ran_steps == [] and not stale.paused.is_set()
    newer_target.write("orders", NEWER, "newer")
    assert _batches(newer_target) == [(6, "newer", 0)]
