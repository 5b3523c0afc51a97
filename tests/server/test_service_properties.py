"""Property test of the lock rules (sans-I/O LockService, manual clock): random histories keep invariants."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from volcano_locks.server.clock import ManualClock
from volcano_locks.server.errors import ApiError
from volcano_locks.server.service import LockService
from volcano_locks.server.store_sqlite import SqliteStore

TOKENS = ["00000000-0000-4000-8000-00000000000" + str(i) for i in range(2)]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.sampled_from(TOKENS), st.sampled_from([5, 6, 10])),
        st.tuples(st.just("renew"), st.sampled_from(TOKENS), st.sampled_from([5, 6, 10])),
        st.tuples(st.just("release"), st.sampled_from(TOKENS), st.just(0)),
        st.tuples(st.just("force"), st.just(""), st.just(0)),
        st.tuples(st.just("wait"), st.just(""), st.sampled_from([0.001, 0.5, 1, 4, 4.5, 5, 6, 30])),
    ),
    max_size=40,
)


@dataclass
class Live:
    """What the test believes: the lease last granted, by whom, until when."""

    token: str
    fencing: int
    expires: float


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(history=ops)
def test_random_histories_keep_the_invariants(history: list[tuple[str, str, float]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(f"{tmp}/locks.sqlite3")
        clock = ManualClock(1_800_000_000.0)
        svc = LockService(store, clock)
        live: Live | None = None
        last_fencing = 0
        for op, token, arg in history:
            now = clock()
            blocking = live is not None and now < live.expires + 1
            try:
                if op == "acquire":
                    lease = svc.acquire("p", "k", token, int(arg))
                    if blocking and live is not None:
                        # only the owner's idempotent re-acquire can succeed, early enough, same fencing
                        assert live.token == token and now < live.expires - 1
                        assert lease.fencing_token == live.fencing
                    else:
                        assert lease.fencing_token > last_fencing
                    live = Live(token, lease.fencing_token, lease.expires_us / 1e6)
                    last_fencing = max(last_fencing, lease.fencing_token)
                elif op == "renew":
                    lease = svc.renew("p", "k", token, int(arg))
                    assert live is not None and live.token == token and now < live.expires - 1
                    assert lease.fencing_token == live.fencing
                    live = Live(token, lease.fencing_token, lease.expires_us / 1e6)
                elif op == "release":
                    svc.release("p", "k", token)
                    assert not blocking or (live is not None and live.token == token)
                    if blocking:
                        live = None
                elif op == "force":
                    svc.force_release("p", "k")
                    live = None
                else:
                    clock.advance(arg)
            except ApiError as exc:
                assert exc.status == 409
                if op == "acquire":
                    assert blocking and live is not None
                    expected = "lock_ownership_lost" if live.token == token else "lock_held"
                    assert exc.code == expected
                    assert live.token != token or now >= live.expires - 1
                elif op == "release":
                    assert blocking and live is not None and live.token != token
                else:
                    assert op == "renew" and exc.code == "lock_ownership_lost"
                    assert live is None or live.token != token or now >= live.expires - 1
            view = svc.read("p", "k")
            held_now = live is not None and clock() < live.expires + 1
            assert view.held == held_now
            if held_now and live is not None:
                assert view.fencing_token == live.fencing
        store.close()
