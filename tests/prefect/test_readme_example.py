"""The README's Prefect example, as written there: the block saved from the environment, a locked task.

The block is the README's code in a module of its own, with the user's ``write_rollup`` defined above it
to record what it was handed; it runs on the session's Prefect test harness and local lock server.
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from prefect import flow

from prefect_volcano import VolcanoCredentials, is_skipped
from tests.docs.helpers import python_block
from volcano_locks import VolcanoLocks

pytestmark = pytest.mark.usefixtures("volcano_env")

_WRITE_ROLLUP = """\
WRITES = []


def write_rollup(day, fencing_token):  # the user's own write; here it records what it was handed
    WRITES.append((day, fencing_token))
    return fencing_token

"""


@pytest.fixture
def readme_flow(tmp_path: Path) -> Any:
    path = tmp_path / "readme_flow.py"
    path.write_text(_WRITE_ROLLUP + python_block("@locked_task("), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("readme_flow", path)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    sys.modules["readme_flow"] = module
    try:
        spec.loader.exec_module(module)  # saves the "volcano" block, as the README does
        yield module
    finally:
        del sys.modules["readme_flow"]


def test_the_readme_block_and_locked_task_run_and_skip_while_another_worker_holds(
    readme_flow: Any, volcano_server: Any
) -> None:
    saved = VolcanoCredentials.load("volcano")
    assert saved.api_url == volcano_server.url

    day = f"readme-{uuid.uuid4().hex[:8]}"
    readme_flow.nightly(day)
    ((written_day, token),) = readme_flow.WRITES
    assert written_day == day and token >= 1

    @flow
    def another_workers_run(day: str) -> tuple[bool, str, bool]:
        state = readme_flow.rollup(day, return_state=True)
        return is_skipped(state), state.message or "", state.is_completed()

    with VolcanoLocks() as other:
        held = other.acquire(f"rollup:{day}", 30)
        try:
            skipped, message, completed = another_workers_run(day)
        finally:
            other.release(f"rollup:{day}", held)
    assert skipped and completed and message.startswith("Skipped:"), message
    assert len(readme_flow.WRITES) == 1  # the body did not run
