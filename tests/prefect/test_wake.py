"""A waiting run is woken by another process's release event, and still gets the lock without events."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.prefect.helpers import token_flow

pytestmark = pytest.mark.usefixtures("volcano_env")

HOLDER = Path(__file__).with_name("wake_holder.py")
CRASH_HOLDER = Path(__file__).with_name("crash_holder.py")


def _refused(server: Any, key: str) -> Callable[[], bool]:
    """Whether the server has refused an acquisition of ``key`` (the waiter found it held)."""
    return lambda: any(
        r.get("op") == "acquire" and r.get("status") == 409 for r in _lock_requests(server, key)
    )


def _listening(caplog: pytest.LogCaptureFixture) -> Callable[[], bool]:
    """Whether the waiter has subscribed to the lock's events (its debug line says so)."""
    return lambda: any("listening for releases" in r.getMessage() for r in caplog.records)


def _wait_behind_a_holder_in_another_process(
    key: str, env: dict[str, str], release_when: Callable[[], bool]
) -> tuple[int, int]:
    """Start a holder process, wait for the lock here; return (holder's token, ours).

    The holder releases once ``release_when()`` holds for this process's waiter: a flow's start can take
    longer than any fixed hold on a busy machine, and a waiter that starts after the release has nothing
    to be woken from."""
    with subprocess.Popen(
        [sys.executable, str(HOLDER), key, "120"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            return _wait_behind(holder, key, release_when)
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()


def _wait_behind(
    holder: subprocess.Popen[str], key: str, release_when: Callable[[], bool]
) -> tuple[int, int]:
    assert holder.stdout is not None and holder.stdin is not None
    line = holder.stdout.readline()
    assert line.startswith("HOLDING"), line
    held = int(line.split()[1])

    won: list[int] = []
    waiter = threading.Thread(target=lambda: won.append(token_flow(key, ttl=15, wait_timeout=120)()))
    waiter.start()
    ends = time.monotonic() + 90
    while not release_when():
        assert time.monotonic() < ends and waiter.is_alive(), "the waiter never got to waiting"
        time.sleep(0.05)
    holder.stdin.write("release\n")
    holder.stdin.flush()
    waiter.join(timeout=180)
    assert holder.stdout.readline().strip() == "RELEASED"
    assert holder.wait(timeout=60) == 0
    assert won, "the waiter did not get the lock"
    return held, won[0]


def test_a_release_in_another_process_wakes_the_waiter(
    unique_key: str,
    prefect_subprocess_env: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="prefect_volcano.wake"):
        held, ours = _wait_behind_a_holder_in_another_process(
            unique_key, prefect_subprocess_env, _listening(caplog)
        )
    assert ours > held
    woke = [
        r.getMessage()
        for r in caplog.records
        if r.name == "prefect_volcano.wake" and "woke" in r.getMessage()
    ]
    assert woke == [
        f"lock {unique_key!r} released elsewhere (fencing token {held}):"
        " woke 1 waiter(s) at once (first in line)"
    ]


def test_a_release_before_the_waiter_listens_is_found_after_subscribing(
    unique_key: str,
    prefect_subprocess_env: dict[str, str],
    caplog: pytest.LogCaptureFixture,
    volcano_server: Any,
) -> None:
    """Released as soon as the waiter is refused, before it subscribes or while it does: Prefect's
    server may not have stored the release for the subscription's replay yet. The waiter, alone in
    line, finds it by its read of the persisted events or by its one look after that read; it does not
    wait out the released lease (TTL 15 s)."""
    with caplog.at_level(logging.DEBUG, logger="prefect_volcano.wake"):
        held, ours = _wait_behind_a_holder_in_another_process(
            unique_key, prefect_subprocess_env, _refused(volcano_server, unique_key)
        )
    assert ours > held
    calls = _lock_requests(volcano_server, unique_key)
    first = next(r for r in calls if r.get("op") == "acquire" and r.get("status") == 201)
    won = next(r for r in calls if r.get("op") == "acquire" and r.get("status") == 201 and r is not first)
    assert won["mono"] - first["mono"] < 15, _summary(calls, first["mono"])  # before the lease's end
    said = [r.getMessage() for r in caplog.records if r.name == "prefect_volcano.wake"]
    assert any("one look, first in line" in m or "released elsewhere" in m for m in said), said
    # The release was recorded before the waiter took the lock: no false alarm of a lapse.
    assert not [r for r in caplog.records if "without a release" in r.getMessage()]


def test_without_events_the_waiter_still_gets_the_lock_by_polling(
    unique_key: str,
    prefect_subprocess_env: dict[str, str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    volcano_server: Any,
) -> None:
    monkeypatch.setenv("VOLCANO_PREFECT_WAKE", "off")
    with caplog.at_level(logging.DEBUG, logger="prefect_volcano.wake"):
        held, ours = _wait_behind_a_holder_in_another_process(
            unique_key, prefect_subprocess_env, _refused(volcano_server, unique_key)
        )
    assert ours > held
    records: list[Any] = [r for r in caplog.records if r.name == "prefect_volcano.wake"]
    assert records == []  # no subscription was made


def _lock_requests(server: Any, key: str) -> list[dict[str, Any]]:
    return [r for r in server.requests() if r.get("path", "").startswith(f"/locks/{key}")]


def _renewed_while_waited_for(server: Any, key: str) -> bool:
    """The holder renewed after the waiter's first look: the expiry the waiter was told has moved."""
    calls = _lock_requests(server, key)
    looked = [r["mono"] for r in calls if r.get("op") == "get"]
    return bool(looked) and any(
        r.get("op") == "renew" and r.get("served") == 200 and r["mono"] > looked[0] for r in calls
    )


def _summary(calls: list[dict[str, Any]], since: float) -> list[tuple[str, object, str]]:
    return [(r.get("op", "?"), r.get("served"), f"{r['mono'] - since:+.2f}") for r in calls]


def test_a_killed_holder_is_taken_over_at_the_first_look_after_its_lease_ends(
    unique_key: str, prefect_subprocess_env: dict[str, str], volcano_server: Any
) -> None:
    """kill -9 of a holder that renews (TTL 6): no release, no event. The waiter, told of the holder's
    lease by its `acquired` event, looks when that lease would end unrenewed (and again at each
    renewed expiry), so the takeover is its first look after the lease's end plus the grace second,
    within TTL + 2 s of the kill, not on a backoff schedule."""
    ttl = 6
    won: list[int] = []
    with subprocess.Popen(
        [sys.executable, str(CRASH_HOLDER), unique_key, str(ttl)],
        env=prefect_subprocess_env,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None
            line = holder.stdout.readline()
            assert line.startswith("HOLDING"), line
            held = int(line.split()[1])
            waiter = threading.Thread(
                target=lambda: won.append(token_flow(unique_key, ttl=15, wait_timeout=120)())
            )
            waiter.start()
            ends = time.monotonic() + 60
            while not _renewed_while_waited_for(volcano_server, unique_key):
                assert time.monotonic() < ends, "the holder never renewed"
                time.sleep(0.2)
            holder.kill()
            killed = time.monotonic()
            holder.wait()
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
    waiter.join(timeout=180)
    assert won and won[0] > held
    calls = _lock_requests(volcano_server, unique_key)
    last_hold = max(
        (
            r
            for r in calls
            if r.get("op") in ("acquire", "renew")
            and r.get("served") in (200, 201)
            and r["answer"].get("fencing_token") == held
        ),
        key=lambda r: r["mono"],
    )
    lapse = last_hold["mono_end"] + ttl  # the killed lease ends here (server-side, as served), at most
    taken = next(
        r
        for r in calls
        if r.get("op") == "acquire" and r.get("served") == 201 and r["answer"].get("fencing_token") == won[0]
    )
    between = [r for r in calls if killed <= r["mono"] < taken["mono"]]
    # After the kill: at most a look at the expiry the waiter knew (the holder renewed since), a look
    # at the lease's real end that finds it free, and the acquisition; nothing on a backoff schedule.
    # The waiter's one look 6 s after it subscribed (alone in line, it heard no release) may land here too.
    assert len(between) <= 3, _summary(calls, killed)
    # Scheduled at the lease's end plus the grace (about 1.2 s past `lapse`); the bound leaves room for a
    # loaded machine and still tells a look at the lease's end from a backoff of up to a minute.
    assert taken["mono"] - lapse < 5.0, (taken["mono"] - lapse, _summary(calls, killed))
    print(
        f"takeover {taken['mono'] - killed:.2f} s after the kill (TTL {ttl} s);"
        f" lapse at +{lapse - killed:.2f} s"
    )


def _event(name: str, runner: str, second: int) -> Any:
    from datetime import UTC, datetime

    from prefect.events import Event

    return Event(
        event=f"volcano.lock.{name}",
        resource={"prefect.resource.id": "volcano.lock.k"},
        related=[{"prefect.resource.id": runner, "prefect.resource.role": "task-run"}],
        occurred=datetime(2026, 12, 1, 6, 0, second, tzinfo=UTC),
    )


def test_the_waiting_line_lets_the_first_waiter_go_first() -> None:
    from prefect_volcano._wake import WaitingLine

    a, b, c = "prefect.task-run.a", "prefect.task-run.b", "prefect.task-run.c"
    line_b = WaitingLine(me=b)
    assert line_b.first()  # knows of nobody (not even itself): tries, which is always safe
    for event in (_event("waiting", b, 2), _event("waiting", a, 1), _event("waiting", c, 3)):
        line_b.saw(event)
    assert not line_b.first()  # a came first
    line_b.saw(_event("acquired", a, 5))
    assert line_b.first()  # a got it; b is next, c after
    line_c = WaitingLine(me=c)
    # Replayed out of order: a's acquisition before its own waiting event must not put it back in line.
    for event in (
        _event("acquired", a, 5),
        _event("waiting", a, 1),
        _event("waiting", c, 3),
        _event("waiting", b, 2),
    ):
        line_c.saw(event)
    assert not line_c.first()
    line_c.saw(_event("skipped", b, 6))  # b left the line another way
    assert line_c.first()


def _listener(me: str, joined: int | None = None) -> Any:
    """A listener for `me`, which started waiting at second `joined` of the events' minute (if given)."""
    from datetime import UTC, datetime

    from prefect_volcano._wake import ReleaseListener

    at = None if joined is None else _event("waiting", me, joined).occurred
    listener = ReleaseListener("k", "http://127.0.0.1:1", "credential", "p", me=me, joined=at)
    listener._since = datetime(2026, 12, 1, 5, 0, 0, tzinfo=UTC)  # the events below are "since we listened"
    listener.line.patience = 0.05
    return listener


def _woke(caplog: pytest.LogCaptureFixture) -> list[str]:
    said = [r.getMessage() for r in caplog.records]
    return [message.split(": ", 1)[1] for message in said if "released elsewhere" in message]


async def test_a_release_ends_the_releasers_place_in_line(caplog: pytest.LogCaptureFixture) -> None:
    # a's acquired event never reached c (or reaches it later): its release alone says a left the line.
    a, c = "prefect.task-run.a", "prefect.task-run.c"
    listener = _listener(c)
    with caplog.at_level(logging.DEBUG, logger="prefect_volcano.wake"):
        for event in (_event("waiting", a, 1), _event("waiting", c, 3), _event("released", a, 7)):
            listener._on(event)
    assert _woke(caplog) == ["woke 0 waiter(s) at once (first in line)"]


async def test_a_deferred_wake_is_cancelled_only_by_a_later_acquisition(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import asyncio

    h, a, b, c = (f"prefect.task-run.{n}" for n in "habc")
    with caplog.at_level(logging.DEBUG, logger="prefect_volcano.wake"):
        listener = _listener(c)
        for event in (_event("waiting", a, 1), _event("waiting", b, 2), _event("waiting", c, 3)):
            listener._on(event)
        listener._on(_event("released", h, 7))  # a is first in line: c leaves it the patience
        listener._on(_event("acquired", h, 5))  # the releaser's own acquisition, delivered late
        await asyncio.sleep(0.3)
        assert _woke(caplog) == [f"woke 0 waiter(s) after 0.05 s (the first in line, {a}, did not take it)"]
        caplog.clear()
        listener._on(_event("released", h, 10))  # a left the line: b is first now
        listener._on(_event("acquired", b, 11))  # b took it after this release: wait for the next
        await asyncio.sleep(0.3)
    assert _woke(caplog) == []


def test_a_run_places_itself_by_its_own_waiting_event() -> None:
    # Its own event rarely reaches it (emitted before it subscribes, not yet persisted for the replay):
    # without it every run took itself for first and tried at once on every release.
    from prefect_volcano._wake import WaitingLine

    a, b, c = "prefect.task-run.a", "prefect.task-run.b", "prefect.task-run.c"
    blind = WaitingLine(me=c)
    blind.saw(_event("waiting", a, 1))
    assert blind.first()  # cannot tell its own place: tries, which is always safe
    line = WaitingLine(me=c)
    line.joined(_event("waiting", c, 3).occurred)
    line.saw(_event("waiting", a, 1))
    line.saw(_event("waiting", b, 4))  # came after c
    assert not line.first()
    line.saw(_event("acquired", a, 6))
    assert line.first()
    line.saw(_event("waiting", c, 3))  # its own event, late: the same place
    assert line.first()


async def test_a_first_in_line_that_lets_a_release_pass_leaves_the_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a crashed while it waited: it says nothing, and without this every later release would wait out
    # the patience for it and then send every run behind it to try at once.
    import asyncio

    h, a, c = (f"prefect.task-run.{n}" for n in "hac")
    listener = _listener(c, joined=3)
    with caplog.at_level(logging.DEBUG, logger="prefect_volcano.wake"):
        listener._on(_event("waiting", a, 1))
        listener._on(_event("released", h, 7))
        await asyncio.sleep(0.3)
        assert _woke(caplog) == [f"woke 0 waiter(s) after 0.05 s (the first in line, {a}, did not take it)"]
        caplog.clear()
        listener._on(_event("waiting", a, 1))  # a's event replayed late does not put it back in line
        listener._on(_event("released", h, 12))
    assert _woke(caplog) == ["woke 0 waiter(s) at once (first in line)"]


def _delivered(listener: Any, *events: Any) -> None:
    for event in events:
        listener._on(event)


async def test_a_read_release_the_subscription_missed_wakes_unless_an_acquisition_followed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h, a, c = (f"prefect.task-run.{n}" for n in "hac")
    with caplog.at_level(logging.DEBUG, logger="prefect_volcano.wake"):
        listener = _listener(c, joined=3)
        release = _event("released", h, 4)
        assert listener._missed([_event("waiting", a, 1), release]) is release
        _delivered(listener, _event("acquired", a, 5))
        assert listener._missed([release]) is None  # a took it after: nothing to wake for
        heard = _listener(c)
        _delivered(heard, release)
        assert heard._missed([release]) is None  # delivered already, and answered then
        assert _woke(caplog) == ["woke 0 waiter(s) at once (first in line)"]  # the delivered one


def test_a_waiter_looks_once_only_when_first_and_it_heard_nothing(caplog: pytest.LogCaptureFixture) -> None:
    a, c = "prefect.task-run.a", "prefect.task-run.c"

    def looked(*events: Any) -> bool:
        caplog.clear()
        listener = _listener(c, joined=3)
        _delivered(listener, *events)
        listener._look_if_nothing_heard()
        return any("one look, first in line" in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.DEBUG, logger="prefect_volcano.wake"):
        assert looked()  # alone, nothing heard: a release just before it listened has no event yet
        assert not looked(_event("waiting", a, 1))  # a is ahead: it listened earlier and heard it
        assert not looked(_event("acquired", a, 5))  # a change since it waited: the line moves
        assert looked(_event("acquired", a, 2))  # a change from before it waited says nothing


async def test_in_a_crowd_whose_line_is_unread_the_first_tries_after_a_draw(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 50 runs let go at once: each misses the runs that joined just before it subscribed, and many take
    # themselves for first. Until a read has put those runs in line, a run that knows of others (or heard
    # one it never saw waiting acquire) draws a delay within DRAW seconds instead of trying at once.
    import asyncio

    from prefect_volcano import _wake

    h, b, c, x = (f"prefect.task-run.{n}" for n in "hbcx")
    monkeypatch.setattr(_wake, "DRAW", 0.06)
    with caplog.at_level(logging.DEBUG, logger="prefect_volcano.wake"):
        crowd = _listener(c, joined=3)
        crowd._draw = lambda: 0.5
        _delivered(crowd, _event("waiting", b, 4), _event("released", h, 7))
        await asyncio.sleep(0.3)
        assert _woke(caplog) == [
            "woke 0 waiter(s) after a draw of 0.03 s (first as far as it knows, the line unread)"
        ]
        caplog.clear()
        crowd._read = True  # a read since: its place is known
        _delivered(crowd, _event("released", h, 9))
        assert _woke(caplog) == ["woke 0 waiter(s) at once (first in line)"]
        caplog.clear()

        heard = _listener(c, joined=3)
        heard._draw = lambda: 0.5
        monkeypatch.setattr(_wake, "DRAW", 0.8)
        _delivered(heard, _event("acquired", x, 5))  # x waited, and c never heard it join
        _delivered(heard, _event("released", x, 7), _event("acquired", b, 8))  # b drew less
        await asyncio.sleep(0.5)
        assert _woke(caplog) == []

        alone = _listener(c, joined=3)
        _delivered(alone, _event("released", h, 7))
    assert _woke(caplog) == ["woke 0 waiter(s) at once (first in line)"]  # a lone waiter never waits
