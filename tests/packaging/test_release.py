"""A release a user can trust: one version everywhere, `twine check`, a complete sdist, a wheel without tests.

The artifacts are `make dist`'s (the session fixture ``dist``); test_install is what installs them.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib.metadata import version
from pathlib import PurePosixPath

import yaml

from tests.packaging.helpers import REPO, Dist
from volcano_locks import __version__

PACKAGES = ("volcano_locks", "airflow_provider_volcano", "prefect_volcano")


def _changelog_release() -> str:
    """The newest released version CHANGELOG.md names (the first heading after Unreleased)."""
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    return re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", text, flags=re.M)[0]


def test_the_version_is_written_once_and_named_the_same_everywhere(dist: Dist) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["hatch"]["version"]["path"] == "volcano_locks/__about__.py"
    provider = yaml.safe_load((REPO / "providers" / "volcano" / "provider.yaml").read_text(encoding="utf-8"))
    named = {
        "the installed distribution": version("volcano-locks"),
        "provider.yaml's current version": provider["versions"][0],
        "CHANGELOG.md's newest release": _changelog_release(),
        "the wheel": dist.wheel.name.split("-")[1],
        "the sdist": dist.sdist.name.removeprefix("volcano_locks-").removesuffix(".tar.gz"),
    }
    assert named == dict.fromkeys(named, __version__)
    # Nowhere else: no second literal to forget at the next release.
    literals = [
        str(path.relative_to(REPO))
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        if re.search(r"^__version__\s*=", path.read_text(encoding="utf-8"), flags=re.M)
    ]
    assert literals == ["volcano_locks/__about__.py"]


def test_twine_check_passes_on_the_wheel_and_the_sdist(dist: Dist) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(dist.wheel), str(dist.sdist)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_the_sdist_holds_what_a_build_needs(dist: Dist) -> None:
    with tarfile.open(dist.sdist) as sdist:
        names = {str(PurePosixPath(*PurePosixPath(m).parts[1:])) for m in sdist.getnames()}
    needed = {
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "CHANGELOG.md",
        "providers/volcano/provider.yaml",
        "volcano_locks/__about__.py",
        "airflow_provider_volcano/get_provider_info.py",
        *(f"{package}/{name}" for package in PACKAGES for name in ("__init__.py", "py.typed")),
    }
    assert needed <= names, sorted(needed - names)


def test_the_wheel_holds_the_three_packages_their_license_and_no_tests(dist: Dist) -> None:
    with zipfile.ZipFile(dist.wheel) as wheel:
        names = wheel.namelist()
    tops = {PurePosixPath(name).parts[0] for name in names}
    assert tops == {*PACKAGES, f"volcano_locks-{__version__}.dist-info"}, sorted(tops)
    tests = [
        name
        for name in names
        if "tests" in PurePosixPath(name).parts
        or PurePosixPath(name).name.startswith("test_")
        or PurePosixPath(name).name == "conftest.py"
    ]
    assert tests == []
    assert f"volcano_locks-{__version__}.dist-info/licenses/LICENSE" in names
