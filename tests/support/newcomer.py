"""What a newcomer starts from: a shell without the suite's settings, and a fresh copy of the repository.

The demo test and the packaging tests run commands the way a user would, outside the suite's own
environment: the Prefect tests export PREFECT_HOME at import and other tests point PREFECT_/AIRFLOW_/
VOLCANO_ variables at their harnesses, none of which a newcomer's shell has.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_FOREIGN_PREFIXES = ("PREFECT_", "AIRFLOW_", "VOLCANO_")
_FOREIGN_NAMES = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT"}


def shell_env(**extra: str) -> dict[str, str]:
    """This process's environment minus the suite's settings and any virtual environment, plus ``extra``."""
    env = {
        k: v for k, v in os.environ.items() if k not in _FOREIGN_NAMES and not k.startswith(_FOREIGN_PREFIXES)
    }
    env.update(extra)
    return env


def fresh_clone(where: Path) -> Path:
    """The repository's files as a fresh clone of this working tree has them: tracked and new files that
    git would commit, none of the ignored ones (no environments, no .tools, no build output)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    clone = where / "clone"
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a file deleted but not yet committed is listed and absent
            target = clone / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return clone


def make(target: str, timeout: float, **variables: str) -> None:
    """Run ``make -s TARGET NAME=value...`` in the repository; fail the test with its output if it fails."""
    done = subprocess.run(
        ["make", "-s", target, *(f"{name}={value}" for name, value in variables.items())],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"make {target} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
