"""A triggerer with 200 deferred tasks on 200 different keys, at the real quota, beside holders.

The triggerer runs every trigger's ``run()`` on one event loop; so does this test, with real
``VolcanoLockTrigger`` instances against a local server at Volcano's 600 requests a minute. Five holders
of the same connection keep their locks (``ttl=15``) all along: the triggers' waiting is governed by the
process's waiting budget, so no renewal is ever refused, and keys released meanwhile reach their
triggers.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from airflow_provider_volcano._tokens import TaskIdentity, new_nonce
from airflow_provider_volcano.triggers.lock import VolcanoLockTrigger
from tests.airflow.helpers import volcano_conn_json
from tests.support.fleet import hold_elsewhere, holders, release_elsewhere
from volcano_locks.server.harness import LocalServer

pytestmark = pytest.mark.slow

TRIGGERS = 200


@pytest.fixture
def quota_server(quota_server: LocalServer, monkeypatch: pytest.MonkeyPatch) -> LocalServer:
    """The root fixture's server at the real quota, which this module's Airflow connection points at."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_VOLCANO_DEFAULT", volcano_conn_json(quota_server.url, quota_server.service_key)
    )
    return quota_server


async def _first_event(trigger: VolcanoLockTrigger) -> dict[str, object]:
    async for event in trigger.run():
        return dict(event.payload)
    raise AssertionError("no event")


@pytest.mark.timeout(600)
async def test_two_hundred_deferred_tasks_cost_the_holders_nothing(
    quota_server: LocalServer, unique_key: str
) -> None:
    keys = [f"{unique_key}-{i}" for i in range(TRIGGERS)]
    other, held = hold_elsewhere(quota_server, keys)  # whoever holds them: same project, elsewhere
    nonce = new_nonce()
    triggers = [
        VolcanoLockTrigger(
            volcano_conn_id="volcano_default",
            lock_key=k,
            ttl=15,
            identity=TaskIdentity("fleet", f"t{i}", "r", -1, 1, nonce).as_dict(),
        )
        for i, k in enumerate(keys)
    ]
    since = time.time()
    with holders(quota_server, unique_key) as lost:  # holders of the same connection and project
        tasks = [asyncio.create_task(_first_event(t)) for t in triggers]
        started = time.monotonic()
        try:
            await asyncio.sleep(20)
            released = keys[::40]  # five keys are released while the others keep waiting
            release_elsewhere(quota_server, other, held, released)
            fired = [tasks[keys.index(k)] for k in released]
            # A released key is found by its trigger's first attempt or a later look, and the 200
            # first attempts are paced by the triggerer's waiting rate (it starts at 60 a minute and
            # climbs while it is busy and no 429 comes): the last one comes after about three minutes.
            done, _ = await asyncio.wait(fired, timeout=300)
            await asyncio.sleep(max(0.0, 70 - (time.monotonic() - started)))  # over a minute in all
            assert all(t in done for t in fired), "a released key never reached its trigger"
            events = [t.result() for t in fired]
            assert all(e["status"] == "acquired" for e in events), events
            assert sum(t.done() for t in tasks) == len(released)  # the others are still waiting
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = time.monotonic() - started

    assert lost == []
    refused = [
        r for r in quota_server.requests() if r.get("status") == 429 and r.get("op") in ("renew", "release")
    ]
    assert refused == []
    waiting = [
        r
        for r in quota_server.requests()
        if r.get("op") in ("get", "acquire")
        and unique_key in r["path"]
        and "-h" not in r["path"]
        and r["time"] >= since
    ]
    # 200 first attempts plus looks, all drawn from one waiting rate of at most 120 a minute (and its burst).
    assert len(waiting) <= 10 + 120 * elapsed / 60 + len(released), (len(waiting), elapsed)
