"""The docs' locked Prefect snippets, run as their users run them, end clean (issue 34).

Each Python block of the README and of docs/prefect.md that takes a lock is taken from the page itself,
given the user's own functions it calls (``write_rollup``, an engine, ``extract``...), and run as a
script in a process of its own against the session's Prefect harness and lock server: free, and then
the way its other runs end (held elsewhere and skipped, or a duplicate of a key already done). Its
output must carry no ERROR line and no traceback, and no `lapsed` event may name its locks: the rule of
``test_endings.py``, which runs the examples of ``flows/`` and every way a run ends. The oldest supported
Prefect runs it too (the Makefile's ``PREFECT_OLDEST_TESTS``).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs.helpers import README, REPO, python_block
from tests.prefect.test_endings import _lapsed_under, _noise

pytestmark = pytest.mark.slow  # each snippet runs flows in a process of its own

PREFECT_PAGE = REPO / "docs" / "prefect.md"

_SAVED_BLOCK = """\
import os

from prefect_volcano import VolcanoCredentials

VolcanoCredentials(
    api_url=os.environ["VOLCANO_API_URL"], service_key=os.environ["VOLCANO_SERVICE_KEY"]
).save("volcano", overwrite=True)  # the block the snippet names, saved as the docs' form would
"""

_WRITE_ROLLUP = """\
def write_rollup(day, fencing_token):  # the user's own write
    print(f"WROTE {day} {fencing_token}")
    return fencing_token
"""

_ENGINE = """\
import os

import sqlalchemy as sa

engine = sa.create_engine(f"sqlite:///{os.environ['SNIPPET_DB']}")
with engine.begin() as c:
    c.execute(sa.text("CREATE TABLE IF NOT EXISTS rollups (day TEXT, token INTEGER)"))
insert_rollup = sa.text("INSERT INTO rollups (day, token) VALUES (:day, :token)")
"""

_PIPELINE = """\
from prefect import task


@task
def extract(day):
    return [day]


@task
def transform(rows):
    return rows


@task
def publish(rows):
    print(f"PUBLISHED {rows}")
"""

_HELD_ELSEWHERE = """

if __name__ == "__main__":
    import sys

    from volcano_locks import VolcanoLocks

    DAY = sys.argv[1]
    {flow}(DAY)  # free: it runs
    with VolcanoLocks() as other, other.with_lock({held!r}.format(day=DAY), 30):
        {flow}(DAY)  # held by another worker: skipped
    print("DONE")
"""

_TWICE = """

if __name__ == "__main__":
    import sys

    from prefect import flow

    DAY = sys.argv[1]

    @flow
    def snippet_flow(day: str) -> dict:
        return rollup(day)

    print("FIRST", snippet_flow(DAY))
    print("DUPLICATE", snippet_flow(DAY))  # the key is done: the first run's result, no second effect
    print("DONE")
"""


SKIPPED = "Skipped: the body did not run"


@dataclass(frozen=True)
class Snippet:
    page: Path
    needle: str  # what picks the one block out of its page
    prelude: str  # the user's own code the block calls
    epilogue: str  # how its users run it
    did: str  # what the run that did the work prints (once: the other run did not do it)
    other: str  # what the other run ends with


SNIPPETS = {
    "readme-locked-task": Snippet(
        README,
        "@locked_task(",
        _WRITE_ROLLUP,
        _HELD_ELSEWHERE.format(flow="nightly", held="rollup:{day}"),
        "WROTE",
        SKIPPED,
    ),
    "prefect-locked-task": Snippet(
        PREFECT_PAGE,
        '@locked_task("rollup:{day}"',
        _SAVED_BLOCK + _WRITE_ROLLUP,
        _HELD_ELSEWHERE.format(flow="nightly", held="rollup:{day}"),
        "WROTE",
        SKIPPED,
    ),
    "prefect-run-once": Snippet(
        PREFECT_PAGE, "once_key=", _ENGINE, _TWICE, "FIRST", "Skipped: duplicate run"
    ),
    "prefect-locked-flow": Snippet(
        PREFECT_PAGE,
        "@locked_flow(",
        _SAVED_BLOCK + _PIPELINE,
        _HELD_ELSEWHERE.format(flow="nightly", held="nightly:{day}"),
        "PUBLISHED",
        SKIPPED,
    ),
}


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_every_locked_snippet_of_the_docs_runs_clean(
    name: str, prefect_subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    snippet = SNIPPETS[name]
    block = python_block(snippet.needle, snippet.page)
    script = tmp_path / f"{name.replace('-', '_')}.py"
    script.write_text(
        "from __future__ import annotations\n\n" + snippet.prelude + "\n\n" + block + snippet.epilogue,
        encoding="utf-8",
    )
    day = f"snippet-{uuid.uuid4().hex[:10]}"
    proc = subprocess.run(
        [sys.executable, str(script), day],
        env=dict(prefect_subprocess_env, SNIPPET_DB=str(tmp_path / "snippet.sqlite3")),
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "DONE" in proc.stdout, output
    assert proc.stdout.count(snippet.did) == 1 and snippet.other in output, output
    assert _noise(output) == [], output
    assert _lapsed_under(day) == []
