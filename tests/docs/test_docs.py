"""The docs say what the code does: facts the pages list come from the code they describe.

The site itself is built by ``make docs`` (warnings are errors, every reference resolves), which
``make test`` runs beside the suites.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from tests.docs.helpers import REPO, python_block
from volcano_locks import LeaseFacts, VolcanoLocks
from volcano_locks.server import LocalServer

PROVIDER_DOCS = REPO / "providers" / "volcano" / "docs"


def test_the_operator_page_and_the_airflow_guide_list_every_lease_fact() -> None:
    facts = [field.name for field in dataclasses.fields(LeaseFacts)]
    assert len(facts) == 5, facts
    for page in (PROVIDER_DOCS / "operators.rst", REPO / "docs" / "airflow.md", REPO / "README.md"):
        text = page.read_text(encoding="utf-8")
        listed = re.search(r"volcano_lease\):\s*#\s*([\w, ]+)", text)
        assert listed, f"{page.name}: no callable comment listing the lease's facts"
        assert [f.strip() for f in listed.group(1).split(",")] == facts, page.name


def test_the_first_lock_of_getting_started_runs_against_the_local_server(
    readme_server: LocalServer, capsys: pytest.CaptureFixture[str]
) -> None:
    page = REPO / "docs" / "getting-started.md"
    exec(compile(python_block("VolcanoLocks()", page), str(page), "exec"), {})
    printed = capsys.readouterr().out
    assert re.fullmatch(r"holding daily-report with fencing token \d+\n", printed), printed
    with VolcanoLocks() as client:
        assert not client.get("daily-report").held
