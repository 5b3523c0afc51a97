"""Two flows racing for one key, in two threads and in two processes: never both inside."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prefect import flow, task
from prefect.states import State

from prefect_volcano import current_lease, is_skipped, locked_task

pytestmark = pytest.mark.usefixtures("volcano_env")


def assert_exclusive(sections: list[tuple[float, float, int]]) -> None:
    """Critical sections never overlap, and a later holder always has a higher fencing token."""
    ordered = sorted(sections)
    for (_s1, end1, token1), (start2, _e2, token2) in itertools.pairwise(ordered):
        assert end1 <= start2, f"two holders inside at once: {ordered}"
        assert token1 < token2, f"fencing tokens not increasing with time: {ordered}"


@pytest.mark.parametrize("policy", ["wait", "skip"])
def test_two_flows_in_threads(policy: str, unique_key: str) -> None:
    guard = threading.Lock()
    inside = [0, 0]  # now, most ever
    sections: list[tuple[float, float, int]] = []
    turned_away = threading.Event()
    barrier = threading.Barrier(2)

    @task
    @locked_task(unique_key, ttl=5, on_contention=policy)  # type: ignore[arg-type]
    def critical() -> int:
        token = current_lease().fencing_token
        with guard:
            inside[0] += 1
            inside[1] = max(inside)
        start = time.monotonic()
        if policy == "skip":
            turned_away.wait(30)  # hold the lock until the other flow has been turned away
        else:
            time.sleep(0.4)
        end = time.monotonic()
        with guard:
            inside[0] -= 1
            sections.append((start, end, token))
        return token

    @flow
    def racer() -> State[Any]:
        barrier.wait(60)
        state = critical(return_state=True)
        if is_skipped(state):
            turned_away.set()
        return state

    with ThreadPoolExecutor(2) as pool:
        states = list(pool.map(lambda _: racer(), range(2)))

    assert inside[1] == 1
    assert_exclusive(sections)
    names = sorted("Skipped" if is_skipped(s) else str(s.name) for s in states)
    if policy == "wait":
        assert names == ["Completed", "Completed"] and len(sections) == 2
    else:
        assert names == ["Completed", "Skipped"] and len(sections) == 1


@pytest.mark.parametrize("policy", ["wait", "skip"])
def test_two_flows_in_two_processes(
    policy: str, unique_key: str, tmp_path: Path, prefect_subprocess_env: dict[str, str]
) -> None:
    worker = Path(__file__).with_name("race_worker.py")
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), unique_key, policy, str(tmp_path), name],
            env=prefect_subprocess_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready-{n}").exists() for n in "ab") and time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.05)
        (tmp_path / "go").touch()
        outputs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out + err
    results = sorted(
        line.split()[1] for out, _ in outputs for line in out.splitlines() if line.startswith("RESULT")
    )

    events = [line.split() for line in (tmp_path / "sections").read_text().splitlines()]
    enters = {(who, int(tok)): float(t) for ev, who, tok, t in events if ev == "enter"}
    exits = {(who, int(tok)): float(t) for ev, who, tok, t in events if ev == "exit"}
    assert enters.keys() == exits.keys()
    assert_exclusive([(enters[k], exits[k], k[1]) for k in enters])
    if policy == "wait":
        assert results == ["Completed", "Completed"] and len(enters) == 2
    else:
        assert results == ["Completed", "Skipped"] and len(enters) == 1
