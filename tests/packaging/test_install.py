"""Install as users do: `make dist`, then the wheel with plain pip into fresh venvs, one per orchestrator
and per supported end of its range (the oldest and the newest Airflow and Prefect that uv.lock pins), each
beside the orchestrator already installed there: it adds itself and nothing else (no part of the local
server), and Airflow lists the provider or Prefect registers the block.

Slow (about a minute per install from pip's cache: pip installs Airflow or Prefect), so marked ``slow``.
"""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.docs.helpers import python_block
from tests.packaging.helpers import PIP_INSTALL_PROPERTY, Dist, Venv, install, pinned, prefect_server
from volcano_locks.extras import EXTRA_MODULES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

RecordProperty = Callable[[str, object], None]

PACKAGES = ("volcano_locks", "airflow_provider_volcano", "prefect_volcano")
# The supported range's two ends (pyproject's airflow-/prefect-oldest groups; the newest is what the
# extra resolves to): the wheel must install and register on both.
ORCHESTRATORS = ("oldest", "newest")


def test_dist_holds_all_three_packages_typed_with_both_entry_points(dist: Dist) -> None:
    with zipfile.ZipFile(dist.wheel) as wheel:
        names = set(wheel.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        text = wheel.read(entry_points).decode()
    for package in PACKAGES:
        assert f"{package}/__init__.py" in names and f"{package}/py.typed" in names
    assert not any(name.startswith(("tests/", "dags/", "flows/")) for name in names)
    assert "[apache_airflow_provider]" in text and "[prefect.collections]" in text
    # The listener that builds a triggerer's Execution API at its start (loaded whatever lazy discovery).
    assert "[airflow.plugins]" in text and "runtime.execution_api:TriggererPrebuildPlugin" in text
    assert "volcano-locks = volcano_locks.cli:main" in text
    with tarfile.open(dist.sdist) as sdist:
        members = sdist.getnames()
    assert any(m.endswith("/pyproject.toml") for m in members)
    assert any(m.endswith("/airflow_provider_volcano/get_provider_info.py") for m in members)
    for extra in ("airflow", "prefect"):
        for orchestrator in ORCHESTRATORS:
            pins = dist.constraints(extra, orchestrator).read_text().splitlines()
            assert not any(line.startswith(("-e", "volcano-locks")) for line in pins), "it pins itself"
        assert pinned(dist, extra, "oldest") != pinned(dist, extra, "newest")


def _imports_from_the_venv(venv: Venv, *modules: str) -> None:
    """The packages import from the installed wheel, not from the checkout."""
    code = (
        "import importlib, json, sys; "
        "print(json.dumps({m: importlib.import_module(m).__file__ for m in sys.argv[1:]}))"
    )
    done = venv.run(venv.bin("python"), "-c", code, *modules)
    assert done.returncode == 0, done.stderr
    for module, path in json.loads(done.stdout).items():
        assert Path(path).is_relative_to(venv.root), f"{module} imported from {path}, not the new venv"


def _json_out(stdout: str) -> Any:
    """The JSON document in a CLI's stdout (Airflow and Prefect may print log lines before it)."""
    start = min(i for i in (stdout.find("["), stdout.find("{")) if i >= 0)
    return json.loads(stdout[start:])


def _brings_only_itself_and_no_server(venv: Venv, wheel_version: str) -> None:
    """volcano-locks added nothing to the orchestrator's environment but itself: none of the local
    server's libraries; so the server is not there, and saying so names the extra that brings it."""
    assert venv.added == {"volcano-locks"}, sorted(venv.added)
    missing = set(EXTRA_MODULES["server"].values()) - venv.installed()
    assert "psycopg" in missing, "the orchestrator itself installs every library of the local server"
    version = venv.run(venv.bin("volcano-locks"), "--version")
    assert version.stdout == f"volcano-locks {wheel_version}\n", version.stderr
    serve = venv.run(venv.bin("volcano-locks"), "serve", "--port", "0", timeout=120)
    assert serve.returncode == 2, serve.stdout + serve.stderr
    assert "pip install 'volcano-locks[server]'" in serve.stderr and "psycopg" in serve.stderr, serve.stderr


def _version_in(venv: Venv, distribution: str) -> str:
    """The version of an installed distribution in the venv."""
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    done = venv.run(venv.bin("python"), "-c", code)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("orchestrator", ORCHESTRATORS)
def test_airflow_extra_installs_with_pip_and_airflow_lists_the_provider(
    dist: Dist, tmp_path: Path, record_property: RecordProperty, orchestrator: str
) -> None:
    venv = install(dist, "airflow", tmp_path, orchestrator, AIRFLOW_HOME=str(tmp_path / "airflow-home"))
    record_property(PIP_INSTALL_PROPERTY, venv.install_line)
    _imports_from_the_venv(venv, "volcano_locks", "airflow_provider_volcano")
    assert _version_in(venv, "apache-airflow") == pinned(dist, "airflow", orchestrator)
    wheel_version = dist.wheel.name.split("-")[1]
    assert _version_in(venv, "volcano-locks") == wheel_version
    _brings_only_itself_and_no_server(venv, wheel_version)

    providers = venv.run(venv.bin("airflow"), "providers", "list", "--output", "json")
    assert providers.returncode == 0, providers.stderr
    listed = {p["package_name"]: p for p in _json_out(providers.stdout)}
    assert "volcano-locks" in listed, sorted(listed)
    assert listed["volcano-locks"]["version"] == wheel_version

    # The connection type: Airflow imported the hook from the wheel, so the UI's Volcano form is there.
    hooks = venv.run(venv.bin("airflow"), "providers", "hooks", "--output", "json")
    assert hooks.returncode == 0, hooks.stderr
    volcano = [h for h in _json_out(hooks.stdout) if h.get("connection_type") == "volcano"]
    assert volcano and volcano[0]["class"] == "airflow_provider_volcano.hooks.volcano.VolcanoHook"
    assert volcano[0]["package_name"] == "volcano-locks"


@pytest.mark.parametrize("orchestrator", ORCHESTRATORS)
def test_prefect_extra_installs_with_pip_and_block_register_registers(
    dist: Dist, tmp_path: Path, record_property: RecordProperty, orchestrator: str
) -> None:
    # The installed Prefect's own server, on a database under this throwaway home (it also shows that the
    # server starts with the FastAPI the constraints pin). Its start-up would register every installed
    # collection's blocks itself, so that is switched off: what is in the database afterwards was put
    # there by `prefect block register`.
    installed = install(
        dist,
        "prefect",
        tmp_path,
        orchestrator,
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        PREFECT_API_BLOCKS_REGISTER_ON_START="false",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
    )
    record_property(PIP_INSTALL_PROPERTY, installed.install_line)
    _imports_from_the_venv(installed, "volcano_locks", "prefect_volcano")
    assert _version_in(installed, "prefect") == pinned(dist, "prefect", orchestrator)
    _brings_only_itself_and_no_server(installed, dist.wheel.name.split("-")[1])
    with prefect_server(installed) as venv:
        _registers_the_block(venv)


def _registers_the_block(venv: Venv) -> None:
    """`prefect block register -m prefect_volcano` registers the block type with its fields and secrets."""
    prefect = venv.bin("prefect")
    before = venv.run(prefect, "block", "type", "inspect", "volcano-credentials")
    # Prefect 3.9 says "not found"; 3.7 only "An exception occurred.": either way, no such block type yet.
    assert before.returncode != 0, before.stdout

    registered = venv.run(prefect, "block", "register", "-m", "prefect_volcano")
    assert registered.returncode == 0, registered.stdout + registered.stderr
    assert "Successfully registered 1 block" in registered.stdout

    after = venv.run(prefect, "block", "type", "inspect", "volcano-credentials", "--output", "json")
    assert after.returncode == 0, after.stdout + after.stderr
    found = _json_out(after.stdout)
    assert found["block_type"]["slug"] == "volcano-credentials"
    assert {"api_url", "service_key", "anon_key", "timeout"} <= set(found["schema"]["fields"]["properties"])
    assert "service_key" in found["schema"]["fields"]["secret_fields"]


def test_the_readme_first_lock_path_from_a_fresh_venv(
    dist: Dist, tmp_path: Path, record_property: RecordProperty
) -> None:
    """README "A first lock": the wheel with `[server]` in a fresh venv, `volcano-locks serve`, the export
    lines it printed pasted into a second shell, and the README's snippet run there with `python`."""
    venv = install(dist, "server", tmp_path)
    record_property(PIP_INSTALL_PROPERTY, venv.install_line)
    argv = [venv.bin("volcano-locks"), "serve", "--port", "0", "--db", str(tmp_path / "locks.sqlite3")]
    serve = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=venv.env, cwd=venv.workdir
    )
    try:
        assert serve.stdout is not None
        printed = []
        for (
            line
        ) in serve.stdout:  # the server prints `ready` within a second or two; the test timeout bounds it
            printed.append(line.rstrip("\n"))
            if line.strip() == "ready":
                break
        exports = [line for line in printed if line.startswith("export VOLCANO_")]
        assert len(exports) == 3, printed
        snippet = python_block('client.with_lock("daily-report"')
        second_shell = "\n".join([*exports, "python - <<'EOF'", snippet.rstrip("\n"), "EOF", ""])
        done = venv.run("bash", "-c", second_shell)
        assert done.returncode == 0, done.stderr
        assert re.fullmatch(r"holding daily-report with fencing token \d+\n", done.stdout), done.stdout
    finally:
        serve.terminate()
        serve.communicate(timeout=30)
