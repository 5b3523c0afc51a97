"""Generate ``airflow_provider_volcano/get_provider_info.py`` from ``provider.yaml``.

Airflow reads provider metadata at runtime from the ``apache_airflow_provider`` entry point, so the
wheel carries a generated Python module rather than the YAML file (as Airflow's own providers do).

Usage: .venv-airflow/bin/python providers/volcano/generate_provider_info.py [--check]
(``--check`` exits 1 when the committed module differs from what this would write.)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
PROVIDER_YAML = HERE / "provider.yaml"
TARGET = HERE.parents[1] / "airflow_provider_volcano" / "get_provider_info.py"

# Release bookkeeping that Airflow's own generator also leaves out of get_provider_info().
_NOT_AT_RUNTIME = (
    "state",
    "source-date-epoch",
    "versions",
    "lifecycle",
    "build-system",
    "excluded-python-versions",
    "excluded-platforms",
    "extra-project-metadata",
)

_HEADER = '''\
# NOTE! THIS FILE IS GENERATED from providers/volcano/provider.yaml; edit that file, then run
#     .venv-airflow/bin/python providers/volcano/generate_provider_info.py
# tests/airflow/test_provider_info.py fails when this file and provider.yaml disagree.
# ruff: noqa: E501
"""Provider info for Airflow's providers manager (the ``apache_airflow_provider`` entry point)."""

from __future__ import annotations

from typing import Any

__all__ = ["get_provider_info"]


def get_provider_info() -> dict[str, Any]:
    """Return the provider's metadata: hooks, operators, triggers, decorator and connection form."""
    return '''


def _literal(value: Any, indent: int) -> str:
    # Expanded, with trailing commas, so that `ruff format` leaves the output exactly as written.
    pad, inner = " " * indent, " " * (indent + 4)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = "".join(f"{inner}{json.dumps(k)}: {_literal(v, indent + 4)},\n" for k, v in value.items())
        return "{\n" + items + pad + "}"
    if isinstance(value, list):
        if not value:
            return "[]"
        items = "".join(f"{inner}{_literal(v, indent + 4)},\n" for v in value)
        return "[\n" + items + pad + "]"
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int | float | str):
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"provider.yaml holds a {type(value).__name__}, which get_provider_info cannot carry")


def provider_info(yaml_text: str) -> dict[str, Any]:
    """Return what ``get_provider_info()`` must return for the given provider.yaml text."""
    data = yaml.safe_load(yaml_text)
    if not isinstance(data, dict):
        raise ValueError("provider.yaml must hold a mapping")
    info = {k: v for k, v in data.items() if k not in _NOT_AT_RUNTIME}
    if isinstance(info.get("description"), str):
        info["description"] = info["description"].strip()
    return info


def render(yaml_text: str) -> str:
    """Return the source of ``get_provider_info.py`` for the given provider.yaml text."""
    return _HEADER + _literal(provider_info(yaml_text), 4) + "\n"


def main() -> int:
    """Write (or with ``--check`` compare) the generated module."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether the module is current")
    args = parser.parse_args()
    source = render(PROVIDER_YAML.read_text(encoding="utf-8"))
    if args.check:
        if TARGET.read_text(encoding="utf-8") != source:
            print(f"{TARGET} is out of date: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(source, encoding="utf-8")
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
