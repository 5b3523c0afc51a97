"""The lock board's plugin is loaded with Airflow's default configuration, exactly once either way.

Real parts: the ``airflow`` CLI and Airflow's plugins manager in fresh processes, each on a fresh
``AIRFLOW_HOME`` with no configuration file and no ``AIRFLOW__*`` variable (Airflow writes its defaults).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.airflow.helpers import airflow_bin

# What Airflow's own plugins manager loaded in that process: names (duplicates kept) and import errors.
LOADED = """
import json
from airflow import plugins_manager
plugins, errors = plugins_manager._get_plugins()
print(json.dumps({"names": [p.name for p in plugins], "errors": errors}))
"""


def _fresh_env(home: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    return {**env, "AIRFLOW_HOME": str(home), **settings}


def _run(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_airflow_plugins_lists_the_board_with_the_default_configuration(tmp_path: Path) -> None:
    out = _run([airflow_bin(), "plugins", "--output", "json"], _fresh_env(tmp_path))
    listed = [p for p in json.loads(out[out.index("[") :]) if p["name"] == "volcano_locks"]
    assert len(listed) == 1, out[-3000:]
    board = listed[0]
    assert [(a["url_prefix"], a["name"]) for a in board["fastapi_apps"]] == [
        ("/volcano-locks", "Volcano locks")
    ]
    views = {v["url_route"]: v for v in board["external_views"]}
    assert views["volcano-locks"]["href"] == "/volcano-locks/board"
    assert views["volcano-locks"]["category"] == "browse"
    assert views["volcano-lock"]["destination"] == "task_instance"


@pytest.mark.parametrize("lazy", ["True", "False"])
def test_the_plugin_loads_exactly_once_whatever_lazy_discover_providers_says(
    tmp_path: Path, lazy: str
) -> None:
    env = _fresh_env(tmp_path, AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS=lazy)
    loaded = json.loads(_run([sys.executable, "-c", LOADED], env).strip().splitlines()[-1])
    assert loaded["names"].count("volcano_locks") == 1, loaded
    assert not [e for e in loaded["errors"].values() if "volcano" in e], loaded["errors"]


def test_loading_the_plugin_does_not_build_the_board_app(tmp_path: Path) -> None:
    """Every Airflow process loads entry-point plugins (task processes too): the app is built on demand."""
    probe = (
        "import sys\n"
        "from airflow_provider_volcano.plugins import VolcanoLocksPlugin\n"
        "plugin = VolcanoLocksPlugin()\n"
        "APP = 'airflow_provider_volcano.plugins.app'\n"
        "print('before', APP in sys.modules)\n"
        "apps = plugin.fastapi_apps\n"
        "print('after', APP in sys.modules, apps is VolcanoLocksPlugin.fastapi_apps)\n"
    )
    out = _run([sys.executable, "-c", probe], _fresh_env(tmp_path)).splitlines()
    assert "before False" in out and "after True True" in out, out
