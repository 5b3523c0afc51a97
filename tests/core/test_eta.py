"""The waiter's ETA: the estimate from observed tenures, and the wait engine handing it to ``on_waiting``."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from volcano_locks import VolcanoLocks
from volcano_locks.eta import Eta, estimate, reported
from volcano_locks.server.harness import LocalServer
from volcano_locks.waiting import WaitPolicy


def test_no_tenure_seen_gives_no_estimate() -> None:
    assert estimate([], holder_elapsed=3.0) is None


def test_steady_tenures_give_a_sure_estimate_of_what_is_left() -> None:
    eta = estimate([10.0] * 8, holder_elapsed=4.0)
    assert eta == Eta(expected=6.0, earliest=6.0, latest=6.0, confidence="high", position=1, tenures=8)


def test_each_waiter_ahead_adds_a_typical_tenure() -> None:
    tenures = [8.0, 10.0, 12.0, 9.0, 11.0]
    first, third = estimate(tenures, 0.0, 1), estimate(tenures, 0.0, 3)
    assert first is not None and third is not None
    assert third.expected == pytest.approx(first.expected + 2 * 10.0)
    assert third.earliest < third.expected < third.latest
    assert first.confidence == third.confidence == "medium"  # five tenures: not yet "high"


def test_a_holder_past_every_tenure_seen_is_a_low_confidence_guess() -> None:
    eta = estimate([5.0, 6.0, 5.5, 6.5, 5.0, 6.0, 5.5, 6.0], holder_elapsed=30.0)
    assert eta is not None and eta.confidence == "low"
    assert eta.earliest == 0.0 and eta.latest == pytest.approx(5.75)


def test_spread_out_tenures_lower_the_confidence() -> None:
    eta = estimate([1.0, 30.0, 2.0, 60.0, 1.5, 45.0, 3.0, 50.0], holder_elapsed=0.0)
    assert eta is not None and eta.confidence == "low"
    assert "low confidence" in eta.describe() and "8 tenures seen" in eta.describe()


@pytest.mark.parametrize(
    ("tenures", "position"), [([1.0], 0), ([1.0], True), ([-1.0], 1), ([float("nan")], 1)]
)
def test_bad_input_is_refused_with_the_value(tenures: list[float], position: Any) -> None:
    with pytest.raises(ValueError, match=r"position|tenures") as info:
        estimate(tenures, 0.0, position)
    assert repr(position) in str(info.value) or repr(tenures[0]) in str(info.value)


def test_the_engine_reports_the_eta_to_on_waiting(volcano_server: LocalServer, unique_key: str) -> None:
    """A line of short holds passes while a waiter waits: its reports carry an ETA once tenures are seen."""
    url, service_key = volcano_server.url, volcano_server.service_key
    seen: list[Eta | None] = []
    stop = threading.Event()

    def line(client: VolcanoLocks) -> None:
        while not stop.is_set():
            with client.with_lock(unique_key, 5, on_contention="wait", wait_timeout=30):
                stop.wait(0.4)

    # The line holds under a credential of its own: this waiter does not queue with it, it looks.
    other_key = volcano_server.mint_key(ttl_seconds=3600)
    with (
        VolcanoLocks(url, service_key=other_key) as holders,
        VolcanoLocks(url, service_key=service_key) as me,
    ):
        holders.release(unique_key, holders.acquire(unique_key, 5))  # warm: the line starts at once
        holder = threading.Thread(target=line, args=(holders,), name="eta-line")
        holder.start()  # holds again and again, each time under a new fencing token
        until_held = threading.Event()
        while not holders.get(unique_key).held:
            until_held.wait(0.05)

        def on_waiting(state: object, waited: float) -> None:
            seen.append(reported())
            if sum(e is not None for e in seen) >= 2:
                stop.set()

        # The waiter looks every 0.2 s while the line passes and reports every 0.3 s.
        # If it slips in between two holds of the line, it waits again (its reports go on).
        for _ in range(20):
            lease = me.wait_acquire(
                unique_key,
                5,
                timeout=30,
                on_waiting=on_waiting,
                policy=WaitPolicy(poll=0.2, report_every=0.3),
            )
            me.release(unique_key, lease)
            if stop.is_set():
                break
        stop.set()
        holder.join(30)
    etas = [e for e in seen if e is not None]
    assert seen[0] is None  # nothing seen change hands yet when the wait starts
    assert etas and all(e.tenures >= 1 and e.expected >= 0 for e in etas)
