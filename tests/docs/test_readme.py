"""The README is the front door: short, its links resolve, and every command and snippet in it is run.

Each shell command of the README is listed in ``COMMANDS`` with the file that runs it and a string that
file must contain (so a command cannot stay listed after its test stopped running it); each Python block
in ``PYTHON_BLOCKS`` with the test file that executes it against the local server. A block or command not
listed fails here.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.cli.helpers import CLI, cli_env
from tests.docs.helpers import README, REPO, blocks, python_block, shell_commands
from volcano_locks import LockState, VolcanoLocks, __version__
from volcano_locks.server import LocalServer

# command in the README -> (the file that runs it, what that file must contain)
_WHEEL = f"dist/volcano_locks-{__version__}-py3-none-any.whl"
COMMANDS = {
    "make demo": ("tests/e2e/test_demo.py", '["make", "demo"]'),
    "make test": (".ci/run", "make test"),
    "make dist": ("tests/packaging/conftest.py", 'make("dist"'),
    "python3 -m venv .venv && . .venv/bin/activate": (
        "tests/packaging/test_install.py",
        "def test_the_readme_first_lock_path_from_a_fresh_venv",
    ),
    f"pip install '{_WHEEL}[server]'": (
        "tests/packaging/test_install.py",
        "def test_the_readme_first_lock_path_from_a_fresh_venv",
    ),
    "airflow dags test daily_rollup": ("tests/airflow/test_readme_example.py", "dag.test()"),
    f"pip install '{_WHEEL}[airflow]' -c dist/constraints-airflow.txt": (
        "tests/packaging/test_install.py",
        "def test_airflow_extra_installs_with_pip",
    ),
    f"pip install '{_WHEEL}[prefect]' -c dist/constraints-prefect.txt": (
        "tests/packaging/test_install.py",
        "def test_prefect_extra_installs_with_pip",
    ),
    "prefect block register -m prefect_volcano": (
        "tests/packaging/test_install.py",
        '"block", "register", "-m", "prefect_volcano"',
    ),
    "volcano-locks serve --port 8000 --db /tmp/locks.sqlite3": (
        "tests/docs/test_readme.py",
        "def test_serve",
    ),
}
COMMANDS_STARTING = {
    "export AIRFLOW_CONN_VOLCANO_DEFAULT=": ("tests/airflow/test_readme_example.py", "readme_connection("),
}
# a string only one Python block contains -> the test file that executes that block
PYTHON_BLOCKS = {
    "VolcanoLockOperator(": "tests/airflow/test_readme_example.py",
    "@locked_task(": "tests/prefect/test_readme_example.py",
    'client.with_lock("daily-report"': "tests/docs/test_readme.py",
}


def test_the_readme_is_a_front_door_of_150_to_250_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert 150 <= len(lines) <= 250, len(lines)


def _slug(heading: str) -> str:
    """GitHub's (and MyST's) anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_every_relative_link_in_the_readme_resolves() -> None:
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = REPO / path if path else README
        assert target.is_file(), f"README links to {link}: no such file"
        if anchor:
            assert target.suffix == ".md" and anchor in _anchors(target), (
                f"README links to {link}: no such heading"
            )


def test_every_readme_command_is_run_by_a_test_or_the_docs_build() -> None:
    commands = shell_commands()
    assert "make demo" in commands and "make test" in commands
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    for command in commands:
        prefix = next((p for p in COMMANDS_STARTING if command.startswith(p)), None)
        assert command in COMMANDS or prefix, (
            f"README command {command!r}: no test runs it (list it in COMMANDS)"
        )
        runner, needle = COMMANDS[command] if command in COMMANDS else COMMANDS_STARTING[prefix or ""]
        assert needle in (REPO / runner).read_text(encoding="utf-8"), f"{runner} no longer runs {command!r}"
        if command.startswith("make "):
            assert re.search(rf"^{command.split()[1]}:", makefile, flags=re.M), command


def test_every_readme_python_block_is_executed_by_a_test() -> None:
    for block in (b for b in blocks() if b.lang == "python"):
        owners = [needle for needle in PYTHON_BLOCKS if needle in block.code]
        assert len(owners) == 1, f"README line {block.line}: a Python block no test executes"
        runner = (REPO / PYTHON_BLOCKS[owners[0]]).read_text(encoding="utf-8")
        calls = {f"python_block({owners[0]!r})", f'python_block("{owners[0]}")'}
        assert any(call in runner for call in calls), f"{PYTHON_BLOCKS[owners[0]]} does not run it"
    assert {b.lang for b in blocks()} <= {"bash", "python"}


def test_the_readme_first_lock_holds_the_lock_while_it_prints_the_fencing_token(
    readme_server: LocalServer,
) -> None:
    seen: list[tuple[str, LockState]] = []

    def print(*args: object) -> None:  # the block's print, run while the lock is held
        with VolcanoLocks() as other:
            seen.append((" ".join(map(str, args)), other.get("daily-report")))

    exec(compile(python_block('client.with_lock("daily-report"'), "README.md", "exec"), {"print": print})

    ((printed, state),) = seen
    assert state.held and printed == f"holding daily-report with fencing token {state.fencing_token}"
    with VolcanoLocks() as client:
        assert not client.get("daily-report").held  # released on exit


def test_serve_prints_the_three_variables_the_readme_says(tmp_path: Path) -> None:
    # The README's `volcano-locks serve --port 8000 --db ...`, on a free port instead of 8000.
    command = next(c for c in shell_commands() if c.startswith("volcano-locks serve"))
    argv = command.replace("--port 8000", "--port 0").replace(
        "/tmp/locks.sqlite3", str(tmp_path / "l.sqlite3")
    )
    proc = subprocess.Popen(
        [*CLI, *argv.split()[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env()
    )
    try:
        printed = []
        assert proc.stdout is not None
        for line in proc.stdout:
            printed.append(line.strip())
            if line.strip() == "ready":
                break
        exported = {line.split("=", 1)[0] for line in printed if line.startswith("export ")}
        names = {"VOLCANO_API_URL", "VOLCANO_ANON_KEY", "VOLCANO_SERVICE_KEY"}
        assert exported == {f"export {name}" for name in names}, printed
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
