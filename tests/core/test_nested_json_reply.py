"""A reply body of deeply nested JSON (5 KB of `[`) is a typed error of the tree, never a RecursionError.

Python's JSON decoder gives up on deep nesting with RecursionError, which is not a ValueError; a correct
server never sends such a body, so a misbehaving one on loopback does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from volcano_locks import AsyncVolcanoLocks, LockContention, ProtocolError, VolcanoLocks

from .misbehaving import answer, misbehaving

SERVICE_KEY = "not-a-real-key-for-a-fake-server"
NESTED = b"[" * 5_000

CALLS: dict[str, Callable[[Any], Any]] = {
    "get": lambda c: c.get("job"),
    "acquire": lambda c: c.acquire("job", 30),
    "wait_acquire": lambda c: c.wait_acquire("job", 30, timeout=5),
}


@pytest.mark.parametrize(("status", "call"), [(200, "get"), (201, "acquire"), (201, "wait_acquire")])
def test_a_nested_success_body_is_a_protocol_error(status: int, call: str) -> None:
    with (
        misbehaving(answer(status, NESTED)) as url,
        VolcanoLocks(url, service_key=SERVICE_KEY) as client,
        pytest.raises(ProtocolError, match="not JSON") as caught,
    ):
        CALLS[call](client)
    assert caught.value.status == status


@pytest.mark.parametrize(("status", "call"), [(200, "get"), (201, "acquire"), (201, "wait_acquire")])
async def test_a_nested_success_body_is_a_protocol_error_for_the_async_client(status: int, call: str) -> None:
    with misbehaving(answer(status, NESTED)) as url:
        async with AsyncVolcanoLocks(url, service_key=SERVICE_KEY) as client:
            pending: Awaitable[object] = CALLS[call](client)
            with pytest.raises(ProtocolError, match="not JSON"):
                await pending


def test_a_nested_error_body_still_maps_by_status() -> None:
    with (
        misbehaving(answer(409, NESTED)) as url,
        VolcanoLocks(url, service_key=SERVICE_KEY) as client,
        pytest.raises(LockContention) as caught,
    ):
        client.acquire("job", 30)
    assert caught.value.status == 409 and "HTTP 409" in str(caught.value)
