"""The `volcano-locks` command itself: what it says about its version."""

from __future__ import annotations

from tests.cli.helpers import run_cli
from volcano_locks import __version__


def test_version_prints_the_distributions_version() -> None:
    done = run_cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"volcano-locks {__version__}\n"
