"""with_lock, sync and async, against the real local server: release, loss, interrupt, cancellation."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import httpx
import pytest

from volcano_locks import (
    AsyncVolcanoLocks,
    InvalidRequest,
    LockContention,
    OwnershipLost,
    ServerError,
    TransportError,
    VolcanoLocks,
    WaitTimeout,
)
from volcano_locks.errors import ErrorCode
from volcano_locks.server.harness import LocalServer


@pytest.fixture
def sync_client(volcano_server: LocalServer) -> Any:
    with VolcanoLocks(volcano_server.url, service_key=volcano_server.service_key) as client:
        yield client


@pytest.fixture
async def async_client(volcano_server: LocalServer) -> Any:
    async with AsyncVolcanoLocks(volcano_server.url, service_key=volcano_server.service_key) as client:
        yield client


# ------------------------------------------------------------------------------------------ sync


def test_releases_after_success_with_fresh_ids(
    admin_server: LocalServer, sync_client: VolcanoLocks, unique_key: str
) -> None:
    token, request_id = str(uuid.uuid4()), str(uuid.uuid4())
    with sync_client.with_lock(unique_key, 30, token=token, request_id=request_id) as guard:
        assert guard.acquired and not guard.lost and guard.lease is not None
        assert guard.fencing_token == sync_client.get(unique_key).fencing_token
        assert guard.lease.token == token
    assert sync_client.get(unique_key).held is False
    mine = [r for r in admin_server.requests() if r["path"].endswith(f"/{unique_key}/lease")]
    assert [r["op"] for r in mine] == ["acquire", "release"]
    assert mine[0]["request_id"] == request_id and mine[1]["request_id"] != request_id


def test_releases_after_exception(sync_client: VolcanoLocks, unique_key: str) -> None:
    with pytest.raises(KeyError, match="boom"), sync_client.with_lock(unique_key, 30):
        raise KeyError("boom")
    assert sync_client.get(unique_key).held is False


def test_contention_policies(sync_client: VolcanoLocks, unique_key: str) -> None:
    holder = sync_client.acquire(unique_key, 30)
    with pytest.raises(LockContention), sync_client.with_lock(unique_key, 30):
        pytest.fail("entered a held lock")
    with sync_client.with_lock(unique_key, 30, on_contention="skip") as guard:
        assert not guard.acquired and guard.lease is None and guard.fencing_token is None and not guard.lost
        assert guard.wait_lost(None) is False and guard.loss is None
    with (
        pytest.raises(WaitTimeout),
        sync_client.with_lock(unique_key, 30, on_contention="wait", wait_timeout=0.5),
    ):
        pytest.fail("entered a held lock")
    sync_client.release(unique_key, holder)
    with sync_client.with_lock(unique_key, 30, on_contention="wait", wait_timeout=5) as guard:
        assert (
            guard.acquired and guard.fencing_token is not None and guard.fencing_token > holder.fencing_token
        )


def test_bad_options_are_rejected_when_written(sync_client: VolcanoLocks) -> None:
    for kwargs in ({"on_contention": "later"}, {"wait_timeout": -1}, {"token": "nope"}, {"on_loss": 5}):
        with pytest.raises(InvalidRequest):
            sync_client.with_lock("k", 30, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        sync_client.with_lock("k", 3)
    assert sync_client.requests_sent == 0


def test_loss_on_force_release_mid_block(sync_client: VolcanoLocks, unique_key: str) -> None:
    seen: list[OwnershipLost] = []
    with (
        pytest.raises(OwnershipLost) as info,
        sync_client.with_lock(unique_key, 5, on_loss=seen.append) as guard,
    ):
        sync_client.force_release(unique_key)
        assert guard.wait_lost(10)
        assert guard.lost and guard.loss is not None and guard.loss.code == "lock_ownership_lost"
    assert info.value is guard.loss and seen == [guard.loss]  # raised after cleanup, reported once


def test_block_exception_takes_precedence_over_loss(sync_client: VolcanoLocks, unique_key: str) -> None:
    with pytest.raises(ZeroDivisionError), sync_client.with_lock(unique_key, 5) as guard:
        sync_client.force_release(unique_key)
        assert guard.wait_lost(10)
        _ = 1 / 0


def test_refused_release_is_retried_not_raised(
    admin_server: LocalServer, sync_client: VolcanoLocks, unique_key: str
) -> None:
    with sync_client.with_lock(unique_key, 30) as guard:
        admin_server.set_faults("status=500:count=1:op=release")
    assert guard.release_outcome is not None and guard.release_outcome.released
    assert isinstance(guard.release_outcome.error, ServerError)
    assert sync_client.get(unique_key).held is False
    admin_server.set_faults("status=500:count=1:op=release")
    with pytest.raises(KeyError), sync_client.with_lock(unique_key + "b", 30):
        raise KeyError("block wins")


def test_interrupt_raises_in_the_body(sync_client: VolcanoLocks, unique_key: str) -> None:
    steps = 0
    with pytest.raises(OwnershipLost) as info, sync_client.with_lock(unique_key, 5, interrupt=True) as guard:
        sync_client.force_release(unique_key)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # protected work that never checks guard.lost
            time.sleep(0.02)
            steps += 1
        pytest.fail("the body was not interrupted")
    assert info.value.code == "lock_ownership_lost" and guard.lost
    # Nothing fires later: the interpreter keeps running normally after the block.
    time.sleep(0.1)


def test_interrupt_not_delivered_after_normal_exit(sync_client: VolcanoLocks, unique_key: str) -> None:
    with sync_client.with_lock(unique_key, 30, interrupt=True) as guard:
        pass
    sync_client.force_release(unique_key)
    time.sleep(0.2)
    assert not guard.lost


def test_no_safe_window_renews_before_entering(
    admin_server: LocalServer, sync_client: VolcanoLocks, unique_key: str
) -> None:
    admin_server.set_faults(
        "delay=2.6:count=1:op=acquire:when=after"
    )  # TTL 5: the window closes 2.33 s after send
    with sync_client.with_lock(unique_key, 5) as guard:
        assert guard.lease is not None and not guard.lost
    ops = [r["op"] for r in admin_server.requests() if unique_key in r["path"]]
    assert ops[:3] == ["acquire", "renew", "release"]


def test_no_safe_window_at_all_refuses_to_enter(
    admin_server: LocalServer, sync_client: VolcanoLocks, unique_key: str
) -> None:
    admin_server.set_faults("delay=4.3:count=1:op=acquire:when=after")
    with pytest.raises(OwnershipLost) as info, sync_client.with_lock(unique_key, 5):
        pytest.fail("entered without a safe window")
    assert info.value.code == ErrorCode.NO_SAFE_WINDOW
    assert sync_client.get(unique_key).held is False


@pytest.mark.parametrize("how", ["kill", "delay"])
def test_loss_when_server_stops_answering(tmp_path: Any, unique_key: str, how: str) -> None:
    with (
        LocalServer(db=str(tmp_path / "s.sqlite3"), admin=True) as srv,
        VolcanoLocks(srv.url, service_key=srv.service_key) as client,
    ):
        declared: list[float] = []
        on_loss = lambda loss: declared.append(time.monotonic())  # noqa: E731 - stamped where loss is decided
        with pytest.raises(OwnershipLost) as info, client.with_lock(unique_key, 5, on_loss=on_loss) as guard:
            deadline = guard.lease.local_deadline  # type: ignore[union-attr]
            if how == "kill":
                srv.kill()
            else:
                srv.set_faults("delay=30:op=renew")
            assert guard.wait_lost(15)
        assert info.value is guard.loss
        assert info.value.code in (ErrorCode.RENEWAL_WINDOW_EXHAUSTED, ErrorCode.RENEWAL_STALLED)
        if info.value.code == ErrorCode.RENEWAL_WINDOW_EXHAUSTED:
            assert isinstance(info.value.__cause__, TransportError)  # the reason survives the exit
        assert len(declared) == 1 and declared[0] <= deadline  # decided before the local deadline passed


# ------------------------------------------------------------------------------------------ async


async def test_async_releases_after_success_and_exception(
    async_client: AsyncVolcanoLocks, unique_key: str
) -> None:
    async with async_client.with_lock(unique_key, 30) as guard:
        assert guard.acquired and (await async_client.get(unique_key)).fencing_token == guard.fencing_token
    assert (await async_client.get(unique_key)).held is False
    with pytest.raises(KeyError):
        async with async_client.with_lock(unique_key, 30):
            raise KeyError("boom")
    assert (await async_client.get(unique_key)).held is False


async def test_async_contention_skip_and_wait(async_client: AsyncVolcanoLocks, unique_key: str) -> None:
    holder = await async_client.acquire(unique_key, 30)
    async with async_client.with_lock(unique_key, 30, on_contention="skip") as guard:
        assert not guard.acquired and guard.lease is None
        assert await guard.wait_lost(None) is False
    with pytest.raises(LockContention):
        async with async_client.with_lock(unique_key, 30):
            pytest.fail("entered a held lock")
    await async_client.release(unique_key, holder)
    async with async_client.with_lock(unique_key, 30, on_contention="wait", wait_timeout=5) as guard:
        assert guard.acquired


async def test_async_loss_cancels_body_and_raises_ownership_lost(
    async_client: AsyncVolcanoLocks, unique_key: str
) -> None:
    seen: list[OwnershipLost] = []
    reached_end = False
    with pytest.raises(OwnershipLost) as info:
        async with async_client.with_lock(unique_key, 5, on_loss=seen.append) as guard:
            await async_client.force_release(unique_key)
            await asyncio.sleep(30)
            reached_end = True
    assert (
        not reached_end and info.value.code == "lock_ownership_lost" and guard.lost and seen == [info.value]
    )
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # our cancellation was withdrawn
    await asyncio.sleep(0.01)  # and nothing is pending


async def test_async_outer_cancellation_still_propagates(
    async_client: AsyncVolcanoLocks, unique_key: str
) -> None:
    entered = asyncio.Event()

    async def body() -> None:
        async with async_client.with_lock(unique_key, 30):
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await async_client.get(unique_key)).held is False


class _SlowToRelease(httpx.AsyncBaseTransport):
    """Loopback to the real server, but a release waits half a second before it is sent."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.release_pending = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE" and request.url.path.endswith("/lease"):
            self.release_pending.set()
            await asyncio.sleep(0.5)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_async_cancellation_during_cleanup_still_releases(
    volcano_server: LocalServer, unique_key: str
) -> None:
    transport = _SlowToRelease()
    async with AsyncVolcanoLocks(
        volcano_server.url, service_key=volcano_server.service_key, transport=transport
    ) as client:

        async def body() -> None:
            async with client.with_lock(unique_key, 30):
                pass

        task = asyncio.create_task(body())
        await transport.release_pending.wait()
        task.cancel()  # lands while the block's cleanup is releasing
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await client.get(unique_key)).held is False


async def test_async_loss_when_server_stops_answering(tmp_path: Any, unique_key: str) -> None:
    with LocalServer(db=str(tmp_path / "s.sqlite3"), admin=True) as srv:
        async with AsyncVolcanoLocks(srv.url, service_key=srv.service_key) as client:
            with pytest.raises(OwnershipLost) as info:
                async with client.with_lock(unique_key, 5) as guard:
                    deadline = guard.lease.local_deadline  # type: ignore[union-attr]
                    srv.set_faults("delay=30:op=renew")
                    await asyncio.sleep(30)
            assert time.monotonic() <= deadline + 2.0  # loss came by the deadline (+ the release)
            assert info.value.code in (ErrorCode.RENEWAL_WINDOW_EXHAUSTED, ErrorCode.RENEWAL_STALLED)
            assert (
                not isinstance(info.value.__context__, asyncio.CancelledError)
                or info.value.__suppress_context__
            )


def test_renewals_use_fresh_request_ids(
    admin_server: LocalServer, sync_client: VolcanoLocks, unique_key: str
) -> None:
    request_id = str(uuid.uuid4())
    with sync_client.with_lock(unique_key, 5, request_id=request_id) as guard:
        first = guard.lease
        deadline = time.monotonic() + 10
        while guard.lease is first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert guard.lease is not first and guard.lease is not None and first is not None
        assert (
            guard.lease.fencing_token == first.fencing_token
            and guard.lease.local_deadline > first.local_deadline
        )
    mine = [r for r in admin_server.requests() if r["path"].endswith(f"/{unique_key}/lease")]
    assert [r["op"] for r in mine][:2] == ["acquire", "renew"] and mine[-1]["op"] == "release"
    ids = [r["request_id"] for r in mine]
    assert ids[0] == request_id and len(set(ids)) == len(ids)


def test_interrupt_in_a_worker_thread(sync_client: VolcanoLocks, unique_key: str) -> None:
    outcome: list[BaseException] = []

    def task() -> None:
        try:
            with sync_client.with_lock(unique_key, 5, interrupt=True):
                sync_client.force_release(unique_key)
                end = time.monotonic() + 15
                while time.monotonic() < end:
                    sum(range(1000))  # CPU-bound work, never checks the guard
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=task)
    worker.start()
    worker.join(20)
    assert len(outcome) == 1 and isinstance(outcome[0], OwnershipLost)
    assert outcome[0].code == "lock_ownership_lost"
