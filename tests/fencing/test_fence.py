"""fence_of: the lease reaches a fenced write in whatever form user code has it, never with its secret."""

from __future__ import annotations

import pickle

import pytest

from volcano_locks import VolcanoLocks
from volcano_locks.fencing import Fence, StaleFencingToken, fence_of


def test_every_form_a_lease_reaches_user_code_gives_the_same_fence(
    volcano_client: VolcanoLocks, unique_key: str
) -> None:
    with volcano_client.with_lock(unique_key, 10) as guard:
        lease = guard.lease
        assert lease is not None
        expected = Fence(unique_key, lease.fencing_token)
        forms = [guard, lease, lease.facts(), lease.public_dict(), expected]  # the last: Airflow's XCom form
        assert [fence_of(f) for f in forms] == [expected] * len(forms)
        assert lease.token not in repr(fence_of(lease)) and lease.token not in repr(fence_of(guard))


def test_a_guard_that_holds_nothing_is_refused(volcano_client: VolcanoLocks, unique_key: str) -> None:
    with (
        volcano_client.with_lock(unique_key, 10),
        volcano_client.with_lock(unique_key, 10, on_contention="skip") as skipped,
        pytest.raises(TypeError, match="holds no lease"),
    ):
        fence_of(skipped)


def test_what_is_not_a_lease_is_named_by_its_type_only() -> None:
    with pytest.raises(TypeError, match="got str"):
        fence_of("orders:secret-looking-text")
    with pytest.raises(TypeError, match=r"got keys \['token'\]"):
        fence_of({"token": "x"})
    with pytest.raises(TypeError, match="non-negative 64-bit int, got True"):
        Fence("k", True)
    with pytest.raises(ValueError):
        Fence("bad key with spaces", 1)


def test_the_refusal_survives_a_process_boundary_with_its_facts() -> None:
    exc = StaleFencingToken("orders", 3, Fence("k", 9), lock_key="k")
    back = pickle.loads(pickle.dumps(exc))
    assert (back.resource, back.fencing_token, back.stored_token, back.code) == (
        "orders",
        3,
        9,
        "stale_fencing_token",
    )
    assert str(back) == str(exc) and "older than the stored fencing token 9" in str(exc)
