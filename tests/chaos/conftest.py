"""Fixtures for the chaos suite."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def chaos_pg_dsn(pg_dsn: str) -> str:
    """The root ``pg_dsn`` (skips, or fails under VOLCANO_TEST_REQUIRE_POSTGRES=1, when unreachable)."""
    return pg_dsn


@pytest.fixture
def chaos_table() -> str:
    """A table name no other test or helper uses."""
    return f"chaos_t_{uuid.uuid4().hex[:12]}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the chaos checker's lines, so a ``make test`` log shows them."""
    from .test_chaos_run import LINES

    if LINES:
        terminalreporter.section("chaos checker")
        for line in LINES:
            terminalreporter.write_line(line)


PREFECT_SCENARIO_FILE = "test_prefect.py"


@pytest.fixture(scope="session", autouse=True)
def prefect_scenario(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """Start the Prefect chaos scenario in the background as soon as the chaos suite starts.

    Its Prefect test harness needs tens of seconds to boot on a busy machine; booting it while the other
    chaos tests run keeps the suite short. Only started when a test of ``test_prefect.py`` was
    selected; yields None otherwise.
    """
    if not any(item.path.name == PREFECT_SCENARIO_FILE for item in request.session.items):
        yield None
        return
    work = tmp_path_factory.mktemp("prefect-scenario")
    out, log = work / "result.json", work / "scenario.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.prefect_scenario", "--out", str(out)],
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    yield ScenarioRun(proc, out, log)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


class ScenarioRun:
    """A scenario subprocess and where it writes."""

    def __init__(self, proc: subprocess.Popen[bytes], out: Path, log: Path) -> None:
        self.proc, self.out, self.log = proc, out, log

    def result(self, timeout: float) -> dict[str, Any]:
        """Wait for the scenario and return its JSON result (fail with its log's tail if it broke)."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"scenario still running after {timeout} s; log {self.log}")
        tail = self.log.read_text(errors="replace")[-4000:]
        assert rc == 0 and self.out.exists(), f"scenario exited {rc}:\n{tail}"
        return dict(json.loads(self.out.read_text()))
