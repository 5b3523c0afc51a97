"""`make demo` is the newcomer's first look: it runs end to end and its table tells the truth."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AIRFLOW = REPO / ".venv-airflow" / "bin" / "airflow"


@pytest.mark.slow
def test_demo_shows_one_holder_a_waiter_a_skip_and_a_rejected_stale_write() -> None:
    if not AIRFLOW.exists():
        pytest.skip(f"the demo needs the Airflow environment at {AIRFLOW.parent.parent} (make envs)")
    before = _demo_processes()
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo.py")],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "orchestrator" not in line]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    by_who = {(c[0], c[2]): c for c in cells}

    airflow = [c for c in cells if c[0] == "Airflow"]
    assert len(airflow) == 2
    first, second = airflow
    assert first[3].startswith("held the lock first") and first[4] == "1"
    assert "waited deferred in the triggerer" in second[3] and int(second[4]) > int(first[4])

    prefect = sorted(c[3].split(":")[0].split(",")[0] for c in cells if c[0] == "Prefect")
    assert prefect == ["held the lock", "skipped"]

    fence = by_who[("fence", f"{first[2]}, late")]
    assert "rejected by the fencing check" in fence[3] and fence[4] == first[4]
    assert proc.stdout.rstrip().endswith("The protected table rejected the stale write.")
    # The demo leaves nothing running: no locks server, no Airflow run, no Prefect flow of its own.
    assert _demo_processes() - before == set()


def _demo_processes() -> set[str]:
    """PIDs and command lines of the kinds of process the demo starts."""
    found = subprocess.run(
        ["pgrep", "-af", "volcano_locks serve|dags test volcano_migration|leader_rollup"],
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    return {line for line in found if "pgrep" not in line}
