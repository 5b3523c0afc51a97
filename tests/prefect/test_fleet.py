"""A Prefect flow that maps 50 locked tasks over 50 held keys, beside holders, at the real quota.

The mapped task runs are threads of one process: their waits share the process's one wait engine and
waiting budget, so the holders of the same project (``ttl=15``) never have a renewal refused, and
every task gets its lock once the key is released.
"""

from __future__ import annotations

import threading
import time

import pytest
from prefect import flow, task

from prefect_volcano import VolcanoCredentials, current_lease, locked_task
from tests.support.fleet import hold_elsewhere, holders, release_elsewhere
from volcano_locks.server.harness import LocalServer

pytestmark = pytest.mark.slow

KEYS = 50


def test_fifty_mapped_locked_tasks_wait_without_costing_the_holders(
    quota_server: LocalServer, unique_key: str
) -> None:
    url, key = quota_server.url, quota_server.service_key
    keys = [f"{unique_key}-{i}" for i in range(KEYS)]
    other, held = hold_elsewhere(quota_server, keys)  # the keys' holders: another credential
    creds = VolcanoCredentials(api_url=url, service_key=key)

    @locked_task("{lock}", ttl=15, credentials=creds, on_contention="wait", wait_timeout=240)
    @task
    def refresh(lock: str) -> int:
        return current_lease().fencing_token

    @flow
    def fan_out(locks: list[str]) -> list[int]:
        return refresh.map(locks).result()  # type: ignore[no-any-return]

    def release_later() -> None:
        time.sleep(30)  # the mapped tasks wait on held keys for a while, then the keys come free
        release_elsewhere(quota_server, other, held, keys)

    releaser = threading.Thread(target=release_later)
    started = time.monotonic()
    with holders(quota_server, unique_key) as lost:
        releaser.start()
        try:
            tokens = fan_out(keys)
        finally:
            releaser.join(60)
    elapsed = time.monotonic() - started

    assert len(tokens) == KEYS and all(t > held[k].fencing_token for t, k in zip(tokens, keys, strict=True))
    assert lost == []
    refused = [r for r in quota_server.requests() if r.get("status") == 429]
    assert refused == [], refused[:3]
    spent = [
        r
        for r in quota_server.requests()
        if r.get("op") in ("get", "acquire") and unique_key in r["path"] and "-h" not in r["path"]
    ]
    # The 50 held keys' own acquisitions; the waiters' first attempts and looks from one budget of
    # 120 a minute (+ its burst of 10); and one acquisition per key seen free, which goes ahead of the
    # budget's reads (the reads after it pay for it).
    assert len(spent) <= KEYS + (10 + 120 * elapsed / 60) + KEYS, (len(spent), elapsed)
