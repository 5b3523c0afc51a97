"""The client's wall clock steps while it holds a lock (libfaketime in the holder's process only): the
lease keeper times renewals and the local deadline on the monotonic lease clock, so a step back changes
nothing, and a step forward can only make it give the lease up early (it compares the server's expires_at
with its own wall clock and keeps the earlier deadline), never hold longer.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from volcano_locks.server.harness import LocalServer

from .events import read_events

pytestmark = pytest.mark.slow  # it holds for three TTLs, for real

REPO = Path(__file__).resolve().parents[2]


def _libfaketime() -> Path:
    spec = importlib.util.find_spec("libfaketime")
    assert spec is not None and spec.submodule_search_locations, (
        "libfaketime (the test group) is not installed"
    )
    return (
        Path(next(iter(spec.submodule_search_locations)))
        / "vendor"
        / "libfaketime"
        / "src"
        / "libfaketime.so.1"
    )


def test_a_wall_clock_step_back_changes_nothing_and_a_step_forward_only_ends_the_lease_early(
    tmp_path: Path, unique_key: str
) -> None:
    ttl = 5
    control = tmp_path / "faketime"
    control.write_text("+0\n")
    out = tmp_path / "holder.json"
    with LocalServer(admin=True, history=str(tmp_path / "history.jsonl")) as srv:
        env = {
            **os.environ,
            **srv.env(),
            "LD_PRELOAD": str(_libfaketime()),
            "FAKETIME_TIMESTAMP_FILE": str(control),
            "FAKETIME_NO_CACHE": "1",
            "DONT_FAKE_MONOTONIC": "1",  # the monotonic and boot-time clocks stay true
        }
        env.pop("FAKETIME", None)
        proc = subprocess.run(
            [sys.executable, "-m", "tests.chaos.wall_clock_holder", "--key", unique_key, "--ttl", str(ttl),
             "--out", str(out)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        seen = json.loads(out.read_text())
        renewals = [
            e
            for e in read_events(tmp_path / "history.jsonl")
            if e.get("op") == "renew" and e.get("key") == unique_key
        ]
    # The step really happened in the holder's process, and only there.
    assert seen["back_step"] == pytest.approx(-3600, abs=5) and seen["forward_step"] == pytest.approx(
        7200, abs=5
    )
    # An hour back: nothing changes. The keeper went on renewing every third of the TTL, on its clock.
    assert seen["lost_after_back"] is False and seen["fencing_after_back"] == seen["fencing_token"]
    assert seen["deadline_after_back"] > seen["back_at"] + ttl / 2  # renewed since, on the monotonic clock
    back = [r for r in renewals if seen["back_at"] <= r["mono"] < seen["forward_at"]]
    assert len(back) >= 4 and all(r["status"] == 200 for r in back), back
    # An hour forward: the server's expires_at now lies an hour in the holder's past, and the keeper keeps
    # the earlier deadline: it reports the loss at its next renewal instead of holding on.
    assert seen["lost_after_forward"] is True and seen["loss_after_s"] < ttl, seen
    assert seen["loss_codes"] == [seen["raised_on_exit"]] and seen["raised_on_exit"] is not None, seen
