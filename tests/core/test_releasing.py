"""A release never fails finished work: the decision (injected clock), with_lock on the real server."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from volcano_locks import (
    AsyncVolcanoLocks,
    AuthError,
    InvalidRequest,
    LeaseRef,
    OwnershipLost,
    RateLimited,
    TransportError,
    Unavailable,
    VolcanoLocks,
)
from volcano_locks._steps import Send, Wait
from volcano_locks.releasing import ReleaseOutcome, release_flow, release_or_lapse
from volcano_locks.server.harness import LocalServer

from .helpers import lease


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drive(
    answers: list[object], *, ttl: int = 30, timeout: float = 10.0, held: Any = None
) -> tuple[ReleaseOutcome[Any], list[Any]]:
    """Run the decision for ``held`` (default: a lease of ``ttl``) with scripted answers (None: released),
    moving the clock to every Wait."""
    clock = Clock()
    flow = release_flow(held if held is not None else lease(ttl=ttl), timeout, clock=clock, rng=lambda: 0.5)
    steps: list[Any] = []
    sent: object = None
    try:
        while True:
            step = flow.send(sent)
            steps.append(step)
            if isinstance(step, Wait):
                clock.now = step.until
                sent = None
            else:
                assert isinstance(step, Send) and step.op == "release"
                sent = answers.pop(0)
    except StopIteration as stop:
        return stop.value, steps


def test_released_at_once() -> None:
    done, steps = drive([None])
    assert done.released and done.attempts == 1 and done.error is None and len(steps) == 1


def test_rate_limited_release_waits_exactly_retry_after() -> None:
    done, steps = drive([RateLimited("spent", status=429, retry_after=7), None])
    assert done.released and done.attempts == 2 and isinstance(done.error, RateLimited)
    assert [type(s).__name__ for s in steps] == ["Send", "Wait", "Send"]
    assert steps[1].until == 7.0
    assert "released on attempt 2" in done.describe()


def test_unanswered_release_backs_off_until_the_lease_ends_then_lapses() -> None:
    done, steps = drive([TransportError("no answer")] * 50, ttl=10)
    sends = [s for s in steps if isinstance(s, Send)]
    waits = [s.until for s in steps if isinstance(s, Wait)]
    assert done.lapses and done.attempts == len(sends) >= 4
    assert waits == sorted(waits) and waits[-1] < 10.0  # every attempt started inside the lease
    assert all(s.timeout is not None and s.timeout <= 10.0 for s in sends)
    assert "left to lapse at its expiry" in done.describe()


def test_retry_after_beyond_the_lease_lapses_without_waiting() -> None:
    done, steps = drive([RateLimited("spent", status=429, retry_after=45)], ttl=30)
    assert done.lapses and done.attempts == 1 and len(steps) == 1


def test_unavailable_is_retried_and_auth_error_is_not() -> None:
    done, _ = drive([Unavailable("down", status=503), None])
    assert done.released and done.attempts == 2
    done, steps = drive([AuthError("key revoked", status=401)])
    assert done.lapses and done.attempts == 1 and len(steps) == 1


def test_release_that_finds_the_lease_lost_raises() -> None:
    with pytest.raises(OwnershipLost):
        drive([OwnershipLost("not yours", status=409)])


def test_nothing_is_sent_once_the_lease_has_ended() -> None:
    clock = Clock()
    clock.now = 31.0
    flow = release_flow(lease(ttl=30), 10.0, clock=clock)
    with pytest.raises(StopIteration) as stop:
        next(flow)
    assert stop.value.value.lapses and stop.value.value.attempts == 0


# ----------------------------------------------------------------------- the real server, with faults


@pytest.fixture
def sync_client(admin_server: LocalServer) -> Any:
    with VolcanoLocks(admin_server.url, service_key=admin_server.service_key) as client:
        yield client


def test_with_lock_rides_out_a_rate_limited_release(
    admin_server: LocalServer, sync_client: VolcanoLocks, unique_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    admin_server.set_faults("status=429:op=release:count=1")
    with (
        caplog.at_level(logging.WARNING, "volcano_locks.releasing"),
        sync_client.with_lock(unique_key, 30) as guard,
    ):
        done = "work"
    assert done == "work"
    outcome = guard.release_outcome
    assert outcome is not None and outcome.released and outcome.attempts == 2
    assert isinstance(outcome.error, RateLimited)
    assert sync_client.get(unique_key).held is False
    assert any("released on attempt 2" in r.getMessage() for r in caplog.records)


def test_with_lock_leaves_an_unanswered_release_to_lapse(
    admin_server: LocalServer, sync_client: VolcanoLocks, unique_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    admin_server.set_faults("drop:op=release")
    with (
        caplog.at_level(logging.WARNING, "volcano_locks.releasing"),
        sync_client.with_lock(unique_key, 5) as guard,
    ):
        fencing = guard.fencing_token
    outcome = guard.release_outcome
    assert outcome is not None and outcome.lapses and outcome.attempts >= 2
    assert isinstance(outcome.error, TransportError)
    (warning,) = [r.getMessage() for r in caplog.records if "left to lapse" in r.getMessage()]
    assert f"fencing token {fencing}" in warning
    admin_server.set_faults(None)
    # The lease was never released: it lapses on its own (no later than its TTL and the grace second).
    state = sync_client.get(unique_key)
    assert not state.held or state.fencing_token == fencing


def test_with_lock_raises_when_the_release_finds_the_lease_taken(
    sync_client: VolcanoLocks, unique_key: str
) -> None:
    with pytest.raises(OwnershipLost), sync_client.with_lock(unique_key, 30):
        sync_client.force_release(unique_key)
        sync_client.acquire(unique_key, 30)  # another holder now


def test_with_lock_body_exception_wins_over_a_taken_lease(sync_client: VolcanoLocks, unique_key: str) -> None:
    with pytest.raises(KeyError), sync_client.with_lock(unique_key, 30):
        sync_client.force_release(unique_key)
        sync_client.acquire(unique_key, 30)
        raise KeyError("the block's own error wins")


async def test_async_with_lock_rides_out_a_rate_limited_release(
    admin_server: LocalServer, unique_key: str
) -> None:
    admin_server.set_faults("status=429:op=release:count=1")
    async with AsyncVolcanoLocks(admin_server.url, service_key=admin_server.service_key) as client:
        async with client.with_lock(unique_key, 30) as guard:
            pass
        outcome = guard.release_outcome
        assert outcome is not None and outcome.released and outcome.attempts == 2
        assert (await client.get(unique_key)).held is False


async def test_async_unanswered_release_lapses(admin_server: LocalServer, unique_key: str) -> None:
    admin_server.set_faults("status=503:op=release")
    async with AsyncVolcanoLocks(admin_server.url, service_key=admin_server.service_key) as client:
        async with client.with_lock(unique_key, 5) as guard:
            pass
        outcome = guard.release_outcome
        assert outcome is not None and outcome.lapses and isinstance(outcome.error, Unavailable)


def test_release_or_lapse_takes_a_sleeper_and_a_clock(
    admin_server: LocalServer, sync_client: VolcanoLocks, unique_key: str
) -> None:
    held = sync_client.acquire(unique_key, 30)
    admin_server.set_faults("status=429:op=release:count=2")
    slept: list[float] = []
    done = release_or_lapse(sync_client, held, sleeper=slept.append)
    assert done.released and done.attempts == 3 and len(slept) == 2
    assert all(0.0 <= s <= 1.0 for s in slept)  # the local server's Retry-After for an injected 429


def drive_ref(answers: list[object], *, until: float | None) -> tuple[ReleaseOutcome[Any], list[Any]]:
    return drive(answers, held=LeaseRef("k", "t", 7, until=until))


def test_a_reference_without_a_deadline_gets_one_attempt_and_names_no_expiry() -> None:
    done, steps = drive_ref([Unavailable("down", status=503), None], until=None)
    assert not done.released and done.attempts == 1 and len(steps) == 1
    assert isinstance(done.lease, LeaseRef) and steps[0].lease == done.lease
    assert "release of lock 'k' (fencing token 7) did not go through after 1 attempt" in done.describe()
    assert "left to lapse at its expiry (the work" in done.describe()


def test_a_reference_with_a_deadline_is_retried_until_then() -> None:
    done, steps = drive_ref([Unavailable("down", status=503), None], until=30.0)
    assert done.released and done.attempts == 2 and [type(s) for s in steps] == [Send, Wait, Send]
    done, _ = drive_ref([Unavailable("down", status=503)] * 100, until=3.0)
    assert done.lapses and 1 < done.attempts < 100


def test_a_reference_releases_the_lease_it_names_and_no_other(
    client: Any, volcano_client: VolcanoLocks, unique_key: str
) -> None:
    held = volcano_client.acquire(unique_key, 30)
    shown = repr(held.ref())
    assert held.token not in shown and "token=" not in shown.replace("fencing_token=", "")
    with pytest.raises(OwnershipLost):  # a reference with another token: the server refuses it
        client.release(unique_key, LeaseRef(unique_key, "00000000-0000-4000-8000-000000000000"))
    assert volcano_client.get(unique_key).fencing_token == held.fencing_token
    client.release(unique_key, LeaseRef(unique_key, held.token))  # what a release needs: key and token
    assert not volcano_client.get(unique_key).held
    with pytest.raises(InvalidRequest, match="belongs to lock key"):
        client.release("other-key", LeaseRef(unique_key, held.token))


def test_release_or_lapse_takes_a_reference(sync_client: VolcanoLocks, unique_key: str) -> None:
    held = sync_client.acquire(unique_key, 30)
    done = release_or_lapse(sync_client, LeaseRef(unique_key, held.token, held.fencing_token))
    assert done.released and done.lease == LeaseRef(unique_key, held.token, held.fencing_token)
    assert not sync_client.get(unique_key).held
