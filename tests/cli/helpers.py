"""Run the ``volcano-locks`` command line as a real subprocess, for the CLI and server tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

CLI = [sys.executable, "-m", "volcano_locks"]


def cli_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any VOLCANO_* variable, plus ``env``.

    A VOLCANO_* setting in the developer's shell must not leak into a test of what the CLI reads.
    """
    base = {k: v for k, v in os.environ.items() if not k.startswith("VOLCANO_")}
    return {**base, **(env or {})}


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, stdin_fd: int | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m volcano_locks ARGS`` with exactly the given VOLCANO_* environment (see cli_env)."""
    return subprocess.run(
        [*CLI, *args],
        env=cli_env(env),
        stdin=stdin_fd if stdin_fd is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
