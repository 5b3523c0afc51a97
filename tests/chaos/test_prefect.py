"""Prefect ``locked_task`` under fault injection: no task reports success after its lock was lost.

The scenario (``prefect_scenario.py``) runs in its own process, started early by ``conftest.py``. Whether a
lease was lost is decided from the lock server's own request log (``oracle.py``), not from the client.
"""

from __future__ import annotations

from typing import Any

import pytest

from .checker import check
from .oracle import lease_verdicts
from .test_chaos_run import LINES

pytestmark = pytest.mark.slow


def test_no_locked_task_reports_success_after_its_lock_was_lost(prefect_scenario: Any) -> None:
    result = prefect_scenario.result(timeout=280)
    ttl, max_delay = result["ttl"], result["max_delay"]
    thief_tokens = {t["token_sha256"] for t in result["thefts"] if t.get("stole")}
    bodies = {b["key"]: b for b in result["bodies"]}
    assert result["flow"]["type"] == "COMPLETED", result["flow"]  # a lost lock fails a task, not the flow
    assert len(result["tasks"]) == len(result["keys"])

    completed = lost_on_server = 0
    for task in result["tasks"]:
        key = task["key"]
        verdicts = [
            v
            for v in lease_verdicts(result["requests"], key, ttl, max_delay=max_delay).values()
            if v.token_sha256 not in thief_tokens
        ]
        lost = [v for v in verdicts if v.lost]
        lost_on_server += bool(lost)
        where = f"{task} {[(v.token_sha256, v.reasons) for v in verdicts]} body={bodies.get(key)}"
        if task["type"] == "COMPLETED":
            completed += 1
            assert not lost, "a task reported success after the server had taken its lease: " + where
            body = bodies[key]
            assert body["finished"] and body["rejected"] == 0, where
        else:
            assert task["type"] == "FAILED", where  # failed, never crashed

    for key, rows in result["writes"].items():
        assert check([], rows).stale_accepted == 0, key
    stolen = [t for t in result["thefts"] if t.get("stole")]
    # The run really attacked: some lease was provably lost while its task ran (force release, late renewal).
    assert lost_on_server >= 1, result["thefts"]
    LINES.append(
        f"prefect: tasks={len(result['tasks'])} completed={completed} "
        f"failed={len(result['tasks']) - completed} "
        f"lost_on_server={lost_on_server} completed_after_loss=0 stolen={len(stolen)} "
        f"(faults {result['faults']}; harness boot {result['boot_seconds']} s, run {result['run_seconds']} s)"
    )
