"""The docs say what the code does: facts the pages list come from the code they describe.

The site itself is built by ``make docs`` (warnings are errors, every reference resolves), which
``make test`` runs beside the suites.
"""

from __future__ import annotations

import dataclasses
import re

from readme_blocks import REPO

from volcano_locks import LeaseFacts

PROVIDER_DOCS = REPO / "providers" / "volcano" / "docs"


def test_the_operator_page_and_the_airflow_guide_list_every_lease_fact() -> None:
    facts = [field.name for field in dataclasses.fields(LeaseFacts)]
    assert len(facts) == 5, facts
    for page in (PROVIDER_DOCS / "operators.rst", REPO / "docs" / "airflow.md", REPO / "README.md"):
        text = page.read_text(encoding="utf-8")
        listed = re.search(r"volcano_lease\):\s*#\s*([\w, ]+)", text)
        assert listed, f"{page.name}: no callable comment listing the lease's facts"
        assert [f.strip() for f in listed.group(1).split(",")] == facts, page.name
