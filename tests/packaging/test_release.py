"""A release a user can trust: one version everywhere, `twine check`, a complete sdist, a wheel without tests.

The artifacts are `make dist`'s (the session fixture ``dist``); test_install is what installs them.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email import message_from_bytes
from email.message import Message
from importlib.metadata import version
from pathlib import PurePosixPath

import yaml

from tests.packaging.helpers import REPO, Dist
from volcano_locks import __version__
from volcano_locks.extras import EXTRA_MODULES

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


def _metadata(dist: Dist) -> Message:
    with zipfile.ZipFile(dist.wheel) as wheel:
        name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        return message_from_bytes(wheel.read(name))


def _requirements_of(metadata: Message, extra: str) -> dict[str, set[str]]:
    """Requires-Dist entries of one extra: distribution name -> the extras it asks of that distribution."""
    found: dict[str, set[str]] = {}
    for line in metadata.get_all("Requires-Dist") or []:
        requirement, _, marker = line.partition(";")
        if re.search(rf"""extra\s*==\s*['"]{re.escape(extra)}['"]""", marker):
            match = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", requirement)
            assert match, line
            found[match.group(1).lower()] = {
                e.strip() for e in (match.group(2) or "").split(",") if e.strip()
            }
    return found


def test_the_wheel_tells_indexes_and_tools_what_it_is(dist: Dist) -> None:
    metadata = _metadata(dist)
    assert metadata["Name"] == "volcano-locks" and metadata["Version"] == __version__
    classifiers = set(metadata.get_all("Classifier") or [])
    assert {
        "Framework :: Apache Airflow",
        "Framework :: Apache Airflow :: Provider",
        "Programming Language :: Python :: 3.11",
        "Typing :: Typed",
    } <= classifiers, sorted(classifiers)
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL") or [])
    assert urls and all(url.startswith("https://") for url in urls.values()), urls
    keywords = set(metadata["Keywords"].split(","))
    assert {"airflow", "prefect", "lock", "fencing-token"} <= keywords, keywords
    assert metadata["Requires-Python"] == ">=3.11"


def test_the_orchestrator_extras_bring_no_part_of_the_local_server(dist: Dist) -> None:
    metadata = _metadata(dist)
    assert _requirements_of(metadata, "airflow") == {"apache-airflow": set()}
    assert _requirements_of(metadata, "prefect") == {"prefect": set()}
    # The server's extra is what volcano_locks.extras checks for before the server starts (one list each,
    # held together here): every distribution it names, psycopg's pool included. psycopg's binary is
    # installed too, but psycopg can use a system libpq instead, so its absence is not checked.
    server = _requirements_of(metadata, "server")
    installed = set(server) | {f"{name}-{extra}" for name, extras in server.items() for extra in extras}
    assert set(EXTRA_MODULES["server"].values()) == installed - {"psycopg-binary"}


def test_each_package_has_the_distributions_version() -> None:
    # The Airflow provider's package imports without Airflow: everything else in it is imported lazily.
    for package in PACKAGES:
        assert importlib.import_module(package).__version__ == __version__, package
