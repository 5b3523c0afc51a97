"""Fresh virtual environments installed with plain pip from what `make dist` built.

Each environment is made with ``python -m venv`` and filled with the venv's own pip from the package
index, the way the README tells a user to install: the built wheel with an extra, constrained by the
``constraints-<extra>.txt`` that `make dist` exports from uv.lock (so the resolution is the tested one
and pip never backtracks). pip's cache is left where the user has it. Nothing from the repository
leaks in: the commands run outside it, without PYTHONPATH or the suite's own PREFECT_/AIRFLOW_ settings.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Per extra, from a cold pip: ~30 s here; a slow mirror may take minutes, and a hang must still end.
INSTALL_TIMEOUT_S = 900
# The test property under which a test records its `Venv.install_line` (the packaging summary prints them).
PIP_INSTALL_PROPERTY = "pip_install"
# The suite's own settings (the Prefect tests export PREFECT_HOME at import) must not reach a user's shell.
_FOREIGN_PREFIXES = ("PREFECT_", "AIRFLOW_", "VOLCANO_")
_FOREIGN_NAMES = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT"}


@dataclass(frozen=True)
class Dist:
    """What `make dist` produced."""

    directory: Path
    wheel: Path
    sdist: Path

    def constraints(self, extra: str, orchestrator: str = "newest") -> Path:
        """The pip constraints file for one extra, with the newest or the oldest supported orchestrator."""
        suffix = "" if orchestrator == "newest" else f"-{orchestrator}"
        return self.directory / f"constraints-{extra}{suffix}.txt"


@dataclass(frozen=True)
class Venv:
    """A fresh virtual environment and the clean environment variables to run its commands with."""

    root: Path
    env: dict[str, str]
    workdir: Path
    install_line: str  # what `pip install` ran and how long it took, for the session summary

    def bin(self, name: str) -> str:
        """Absolute path of an executable in the environment."""
        return str(self.root / "bin" / name)

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run a command of this environment outside the repository; output captured, never raising."""
        return subprocess.run(
            args, cwd=self.workdir, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )


def clean_env(venv: Path, **extra: str) -> dict[str, str]:
    """The caller's environment minus the suite's settings, with the venv's bin first on PATH."""
    env = {
        k: v for k, v in os.environ.items() if k not in _FOREIGN_NAMES and not k.startswith(_FOREIGN_PREFIXES)
    }
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env.update(extra)
    return env


def install(dist: Dist, extra: str, where: Path, orchestrator: str = "newest", **env: str) -> Venv:
    """``python -m venv``, then ``pip install '<wheel>[extra]' -c <constraints>`` (timed).

    ``orchestrator``: ``newest`` or ``oldest``, which supported Airflow or Prefect the constraints pin.
    """
    constraints = dist.constraints(extra, orchestrator)
    root = where / f"venv-{extra}-{orchestrator}"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=120)
    workdir = where / "work"
    workdir.mkdir(exist_ok=True)
    venv = Venv(root, clean_env(root, **env), workdir, "")
    started = time.monotonic()
    done = venv.run(
        venv.bin("python"),
        "-m",
        "pip",
        "install",
        "--constraint",
        str(constraints),
        f"{dist.wheel}[{extra}]",
        timeout=INSTALL_TIMEOUT_S,
    )
    took = time.monotonic() - started
    assert done.returncode == 0, (
        f"pip install [{extra}] failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    line = f"pip install '{dist.wheel.name}[{extra}]' -c {constraints.name} into a fresh venv: {took:.1f} s"
    return dataclasses.replace(venv, install_line=line)
