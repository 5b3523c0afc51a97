"""providers/volcano/provider.yaml is the single source; the generated provider info matches it,
is valid against Airflow's own schemas, and Airflow reads it."""

from __future__ import annotations

import importlib.util
import json
from importlib import import_module
from importlib.metadata import version
from pathlib import Path
from types import ModuleType

import airflow
import jsonschema
import yaml

import airflow_provider_volcano.get_provider_info as generated_module
from airflow_provider_volcano.get_provider_info import get_provider_info

AIRFLOW_DIR = Path(airflow.__file__).parent
PROVIDER_DIR = Path(__file__).resolve().parents[2] / "providers" / "volcano"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "generate_provider_info", PROVIDER_DIR / "generate_provider_info.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _provider_yaml() -> dict[str, object]:
    return dict(yaml.safe_load((PROVIDER_DIR / "provider.yaml").read_text(encoding="utf-8")))


def test_generated_module_is_what_provider_yaml_generates() -> None:
    # Edit provider.yaml, then run: .venv-airflow/bin/python providers/volcano/generate_provider_info.py
    gen = _generator()
    source = (PROVIDER_DIR / "provider.yaml").read_text(encoding="utf-8")
    assert Path(generated_module.__file__ or "").read_text(encoding="utf-8") == gen.render(source)
    assert get_provider_info() == gen.provider_info(source)


def test_provider_yaml_is_valid_against_airflows_provider_yaml_schema() -> None:
    schema = json.loads((AIRFLOW_DIR / "provider.yaml.schema.json").read_text())
    jsonschema.validate(_provider_yaml(), schema)


def test_provider_yaml_version_is_the_distributions() -> None:
    versions = _provider_yaml()["versions"]
    assert isinstance(versions, list) and versions[0] == version("volcano-locks")


def test_docs_pages_exist_for_connection_operator_trigger_and_taskflow() -> None:
    docs = PROVIDER_DIR / "docs"
    for page in ("index.rst", "connections/volcano.rst", "operators.rst", "triggers.rst", "taskflow.rst"):
        assert (docs / page).is_file(), page
    for integration in get_provider_info()["integrations"]:
        for guide in integration["how-to-guide"]:
            prefix = "/docs/volcano-locks/"
            assert guide.startswith(prefix) and (docs / guide.removeprefix(prefix)).is_file(), guide


def test_provider_info_is_valid_against_airflow_schema() -> None:
    schema = json.loads((AIRFLOW_DIR / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)


def test_connection_form_is_valid_against_provider_yaml_schema() -> None:
    # provider_info.schema.json leaves connection-types loose; provider.yaml's schema spells out
    # conn-fields and ui-field-behaviour, which the new UI reads.
    full = json.loads((AIRFLOW_DIR / "provider.yaml.schema.json").read_text())
    conn_schema = full["properties"]["connection-types"]
    jsonschema.validate(get_provider_info()["connection-types"], conn_schema)
    behaviour = json.loads((AIRFLOW_DIR / "customized_form_field_behaviours.schema.json").read_text())
    ui = get_provider_info()["connection-types"][0]["ui-field-behaviour"]
    jsonschema.validate(
        {
            "hidden_fields": ui["hidden-fields"],
            "relabeling": ui["relabeling"],
            "placeholders": ui["placeholders"],
        },
        behaviour,
    )


def test_every_listed_module_and_class_imports() -> None:
    info = get_provider_info()
    for section in ("hooks", "operators", "triggers"):
        for entry in info[section]:
            for module in entry["python-modules"]:
                import_module(module)
    for item in info["connection-types"] + [
        {"hook-class-name": d["class-name"]} for d in info["task-decorators"]
    ]:
        module, _, name = item["hook-class-name"].rpartition(".")
        assert callable(getattr(import_module(module), name))


def test_airflow_discovers_the_provider_through_the_entry_point() -> None:
    from airflow.providers_manager import ProvidersManager

    from tests.airflow.versions import DECLARATIVE_CONNECTION_FORM, runtime_hooks

    pm = ProvidersManager()
    assert "volcano-locks" in pm.providers
    hook = runtime_hooks()["volcano"]
    assert hook is not None
    assert hook.hook_class_name == "airflow_provider_volcano.hooks.volcano.VolcanoHook"
    assert hook.connection_id_attribute_name == "volcano_conn_id"
    if not DECLARATIVE_CONNECTION_FORM:
        # Airflow 3.1 builds connection forms from hook methods only: the generic form, the fields in
        # Extra (providers/volcano/docs/supported-versions.rst).
        assert "volcano" not in pm.field_behaviours
        assert not any(name.startswith("extra__volcano__") for name in pm.connection_form_widgets)
        return
    behaviour = pm.field_behaviours["volcano"]
    assert behaviour["relabeling"] == {"host": "API URL", "password": "Service key", "port": "Port"}
    assert behaviour["placeholders"]["host"] == "https://api.volcano.dev"
    # Port stays visible: a stored port is the workaround for Airflow 3.3.2's Test icon (#73298).
    assert set(behaviour["hidden_fields"]) == {"schema", "login"}
    widgets = pm.connection_form_widgets
    assert widgets["extra__volcano__anon_key"].is_sensitive
    assert widgets["extra__volcano__previous_service_keys"].is_sensitive  # keys, masked like the anon key
    assert not widgets["extra__volcano__timeout"].is_sensitive


def test_task_volcano_lock_decorator_is_registered() -> None:
    from airflow.sdk import task

    from airflow_provider_volcano.decorators.volcano_lock import volcano_lock_task

    assert task.volcano_lock is volcano_lock_task


def test_airflow_providers_list_shows_the_provider(airflow_db) -> None:
    import os
    import subprocess

    from tests.airflow.helpers import airflow_bin

    out = subprocess.run(
        [airflow_bin(), "providers", "list", "--output", "json"],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ.copy(),
        timeout=120,
    ).stdout
    listed = {p["package_name"]: p for p in json.loads(out[out.index("[") :])}
    assert listed["volcano-locks"]["description"].startswith("Volcano project locks")
