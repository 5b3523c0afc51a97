"""The exception tree: shape, attributes, aliases, pickling, no secrets."""

from __future__ import annotations

import pickle

import httpx
import pytest

import volcano_locks
from volcano_locks.errors import (
    AuthError,
    ConflictError,
    ErrorCode,
    InvalidRequest,
    LockContention,
    OwnershipLost,
    ProtocolError,
    RateLimited,
    ServerError,
    TransportError,
    Unavailable,
    VolcanoError,
    WaitTimeout,
    translate_transport_errors,
)
from volcano_locks.models import LockState


def test_tree() -> None:
    for cls in (
        LockContention,
        RateLimited,
        AuthError,
        InvalidRequest,
        Unavailable,
        ServerError,
        TransportError,
        ProtocolError,
    ):
        assert issubclass(cls, VolcanoError)
    assert issubclass(OwnershipLost, LockContention) and issubclass(WaitTimeout, LockContention)
    assert issubclass(InvalidRequest, ValueError)
    assert ConflictError is LockContention
    assert volcano_locks.ConflictError is LockContention
    assert set(volcano_locks.__all__) >= {
        "VolcanoLocks",
        "AsyncVolcanoLocks",
        "LockGuard",
        "AsyncLockGuard",
        "ConflictError",
    }


def test_attributes_and_text() -> None:
    exc = RateLimited(
        "acquire failed", status=429, code="lock_rate_limited", request_id="r-1", retry_after=3.0
    )
    assert (exc.status, exc.code, exc.request_id, exc.retry_after) == (429, "lock_rate_limited", "r-1", 3.0)
    assert str(exc) == "acquire failed (status 429, code lock_rate_limited, retry after 3 s, request id r-1)"
    assert VolcanoError("plain").status is None and str(VolcanoError("plain")) == "plain"


def test_pickle_keeps_attributes() -> None:
    holder = LockState(True, None, 4)
    exc = WaitTimeout("still held", code=ErrorCode.WAIT_TIMEOUT, holder=holder)
    back = pickle.loads(pickle.dumps(exc))
    assert (
        type(back) is WaitTimeout
        and back.holder == holder
        and back.code == ErrorCode.WAIT_TIMEOUT
        and str(back) == str(exc)
    )


@pytest.mark.parametrize(
    "raised", [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), httpx.RemoteProtocolError("closed")]
)
def test_transport_errors_translated_with_cause(raised: Exception) -> None:
    with pytest.raises(TransportError) as info, translate_transport_errors("renew", "rid"):
        raise raised
    assert info.value.__cause__ is raised and info.value.request_id == "rid"
    assert "renew" in str(info.value)
