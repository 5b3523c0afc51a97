"""Fresh virtual environments: a user's orchestrator, then what `make dist` built, with plain pip.

Each environment is made with ``python -m venv`` and filled from the package index: first the
orchestrator alone (what a user already runs; put in by the project's uv from its cache), then, with the
venv's own pip, the built wheel with an extra the way the README tells a user to install it, both
constrained by the ``constraints-<extra>.txt`` that `make dist` exports from uv.lock (so the resolution
is the tested one and pip never backtracks). What the second step added is what volcano-locks brings to a
user's scheduler, worker or triggerer. pip's cache is left where the user has it (so a second run
installs from it). Nothing from the repository leaks in: the commands run outside it, without PYTHONPATH
or the suite's own PREFECT_/AIRFLOW_ settings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.newcomer import shell_env

REPO = Path(__file__).resolve().parents[2]
UV = REPO / ".tools" / "bin" / "uv"  # what `make envs` installs (the Makefile's pinned uv)
# Per extra, from a cold pip: ~30 s here; a slow mirror may take minutes, and a hang must still end.
INSTALL_TIMEOUT_S = 900
# The test property under which a test records its `Venv.install_line` (the packaging summary prints them).
PIP_INSTALL_PROPERTY = "pip_install"


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
    added: frozenset[str] = frozenset()  # the distributions installing volcano-locks added (normalised names)

    def bin(self, name: str) -> str:
        """Absolute path of an executable in the environment."""
        return str(self.root / "bin" / name)

    def installed(self) -> set[str]:
        """The distributions installed in the environment, by normalised name (``pip list``)."""
        done = self.run(
            self.bin("python"), "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"
        )
        assert done.returncode == 0, done.stderr
        return {re.sub(r"[-_.]+", "-", d["name"]).lower() for d in json.loads(done.stdout)}

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run a command of this environment outside the repository; output captured, never raising."""
        return subprocess.run(
            args, cwd=self.workdir, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )


def clean_env(venv: Path, **extra: str) -> dict[str, str]:
    """A newcomer's shell (``tests.support.newcomer.shell_env``) with the venv's bin first on PATH."""
    env = shell_env()
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env.update(extra)
    return env


ORCHESTRATOR_DISTRIBUTION = {"airflow": "apache-airflow", "prefect": "prefect"}
"""The distribution each orchestrator extra installs."""


def install(dist: Dist, extra: str, where: Path, orchestrator: str = "newest", **env: str) -> Venv:
    """A user's environment, then volcano-locks added to it, with plain pip (each step timed).

    ``python -m venv``; for an orchestrator extra, ``pip install <orchestrator>==<pinned>`` (what the user
    already runs: Airflow or Prefect at the version the constraints pin, with its own dependencies), then
    the README's ``pip install '<wheel>[extra]' -c <constraints>``; for ``server``, the README's
    ``pip install '<wheel>[server]'`` alone, unconstrained. ``Venv.added`` is what the wheel's step
    installed. ``orchestrator``: ``newest`` or ``oldest``, which supported Airflow or Prefect to pin.
    """
    constrained = extra in ORCHESTRATOR_DISTRIBUTION
    constraints = dist.constraints(extra, orchestrator) if constrained else None
    root = where / f"venv-{extra}-{orchestrator}"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=120)
    workdir = where / "work"
    workdir.mkdir(exist_ok=True)
    venv = Venv(root, clean_env(root, **env), workdir, "")
    steps = [f"{dist.wheel}[{extra}]"]
    if constrained:
        steps.insert(0, f"{ORCHESTRATOR_DISTRIBUTION[extra]}=={pinned(dist, extra, orchestrator)}")
    pins = ["--constraint", str(constraints)] if constraints else []
    pinned_by = f" -c {constraints.name}" if constraints else ""
    took: list[str] = []  # each step's command and time, for the session summary
    before: set[str] = set()
    for what in steps:
        before = venv.installed()
        pip = [venv.bin("python"), "-m", "pip", "install"]
        if what != steps[-1]:
            # The orchestrator's step stands for an installation the user already has: uv puts it in
            # from the cache `make envs` filled (the same pins), in seconds instead of pip's minutes of
            # downloads on a fresh machine; without uv, pip does not byte-compile its thousands of modules
            # (a third of its CPU here). The README's step runs with pip, as written.
            pip = (
                [str(UV), "pip", "install", "--python", venv.bin("python")]
                if UV.exists()
                else [*pip, "--no-compile"]
            )
        started = time.monotonic()
        done = venv.run(*pip, *pins, what, timeout=INSTALL_TIMEOUT_S)
        shown = ("uv " if pip[0] == str(UV) else "") + f"pip install {Path(what).name}{pinned_by}"
        took.append(f"{shown} ({time.monotonic() - started:.1f} s)")
        assert done.returncode == 0, (
            f"pip install {what} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        )
    line = f"{' then '.join(took)} into a fresh venv"
    return dataclasses.replace(venv, install_line=line, added=frozenset(venv.installed() - before))


def pinned(dist: Dist, extra: str, orchestrator: str) -> str:
    """The orchestrator's version in one constraints file (`make dist` exports them from uv.lock)."""
    name = ORCHESTRATOR_DISTRIBUTION[extra]
    pins = dist.constraints(extra, orchestrator).read_text().splitlines()
    return next(line.removeprefix(f"{name}==") for line in pins if line.startswith(f"{name}=="))


@contextlib.contextmanager
def prefect_server(venv: Venv, timeout: float = INSTALL_TIMEOUT_S) -> Iterator[Venv]:
    """``prefect server start`` from the venv on a free port, and the venv with ``PREFECT_API_URL`` at it.

    One server for all of a test's Prefect commands: without ``PREFECT_API_URL`` each command would
    start a temporary server of its own (about 36 s of CPU each here). No UI and no background services:
    the commands need the API alone.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/api"
    argv = [venv.bin("prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    log = (venv.workdir / f"prefect-server-{port}.log").open("w")
    proc = subprocess.Popen(
        [*argv, "--no-ui", "--no-services"],
        env=venv.env,
        cwd=venv.workdir,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while not _answers(f"{url}/health"):
            output = Path(log.name).read_text(errors="replace")[-3000:]
            assert proc.poll() is None, f"prefect server start exited:\n{output}"
            assert time.monotonic() < deadline, f"prefect server start not ready in {timeout} s:\n{output}"
            time.sleep(0.5)
        yield dataclasses.replace(venv, env={**venv.env, "PREFECT_API_URL": url})
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
