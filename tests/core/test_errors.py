"""The exception tree: shape, attributes, aliases, pickling, no secrets."""

from __future__ import annotations

import json
import pickle

import httpx
import pytest

import volcano_locks
from volcano_locks import errors
from volcano_locks.errors import ConflictError, ErrorCode, LockContention, OwnershipLost, VolcanoError
from volcano_locks.models import LockState
from volcano_locks.transport import translate_transport_errors


def test_tree() -> None:
    classes = [getattr(errors, name) for name in errors.__all__ if name != "ErrorCode"]
    assert len(classes) == 12 and all(issubclass(cls, VolcanoError) for cls in classes)
    # The package re-exports the tree from its one list, errors.__all__.
    assert all(getattr(volcano_locks, name) is getattr(errors, name) for name in errors.__all__)
    assert set(errors.__all__) <= set(volcano_locks.__all__)
    # `except LockContention:` means contention; `except ConflictError:` (the SDK's name) any 409.
    assert issubclass(LockContention, ConflictError) and issubclass(OwnershipLost, ConflictError)
    assert not issubclass(OwnershipLost, LockContention) and not issubclass(errors.WaitTimeout, ConflictError)
    assert issubclass(errors.WaitTimeout, VolcanoError) and issubclass(ConflictError, VolcanoError)
    assert issubclass(errors.InvalidRequest, ValueError)
    assert volcano_locks.ConflictError is ConflictError
    assert set(volcano_locks.__all__) >= {
        "VolcanoLocks",
        "AsyncVolcanoLocks",
        "LockGuard",
        "AsyncLockGuard",
        "ConflictError",
    }


def test_attributes_and_text() -> None:
    exc = errors.RateLimited(
        "acquire failed", status=429, code="lock_rate_limited", request_id="r-1", retry_after=3.0
    )
    assert (exc.status, exc.code, exc.request_id, exc.retry_after) == (429, "lock_rate_limited", "r-1", 3.0)
    assert str(exc) == "acquire failed (status 429, code lock_rate_limited, retry after 3 s, request id r-1)"
    assert VolcanoError("plain").status is None and str(VolcanoError("plain")) == "plain"


def test_pickle_keeps_attributes() -> None:
    holder = LockState(True, None, 4)
    exc = errors.WaitTimeout("still held", code=ErrorCode.WAIT_TIMEOUT, holder=holder)
    back = pickle.loads(pickle.dumps(exc))
    assert (
        type(back) is errors.WaitTimeout
        and back.holder == holder
        and back.code == ErrorCode.WAIT_TIMEOUT
        and str(back) == str(exc)
    )


@pytest.mark.parametrize(
    "raised", [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), httpx.RemoteProtocolError("closed")]
)
def test_transport_errors_translated_with_cause(raised: Exception) -> None:
    with pytest.raises(errors.TransportError) as info, translate_transport_errors("renew", "rid"):
        raise raised
    assert info.value.__cause__ is raised and info.value.request_id == "rid"
    assert "renew" in str(info.value)


def test_an_acquisition_refused_either_way_is_a_conflict_as_the_sdk_says() -> None:
    from volcano_locks.protocol import Call, Reply, error_from_reply

    call = Call("acquire", "POST", "/locks/k/lease", "r-1", {})
    for code, cls in (("lock_held", LockContention), ("lock_ownership_lost", OwnershipLost)):
        body = json.dumps({"error": "no", "code": code}).encode()
        exc = error_from_reply(call, Reply(409, {}, body, 0.0, None))  # type: ignore[arg-type]
        assert type(exc) is cls and isinstance(exc, ConflictError) and exc.code == code
