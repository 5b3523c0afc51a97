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
    return {
        "package-name": "volcano-locks",
        "name": "Volcano",
        "description": "Volcano project locks: run one task at a time across the fleet, with fencing tokens.",
        "integrations": [
            {
                "integration-name": "Volcano",
                "external-doc-url": "https://volcano.dev",
                "how-to-guide": [
                    "/docs/volcano-locks/operators.rst",
                    "/docs/volcano-locks/taskflow.rst",
                ],
                "tags": [
                    "service",
                ],
            },
        ],
        "hooks": [
            {
                "integration-name": "Volcano",
                "python-modules": [
                    "airflow_provider_volcano.hooks.volcano",
                ],
            },
        ],
        "operators": [
            {
                "integration-name": "Volcano",
                "python-modules": [
                    "airflow_provider_volcano.operators.lock",
                    "airflow_provider_volcano.operators.group",
                ],
            },
        ],
        "triggers": [
            {
                "integration-name": "Volcano",
                "python-modules": [
                    "airflow_provider_volcano.triggers.lock",
                ],
            },
        ],
        "task-decorators": [
            {
                "name": "volcano_lock",
                "class-name": "airflow_provider_volcano.decorators.volcano_lock.volcano_lock_task",
            },
        ],
        "connection-types": [
            {
                "connection-type": "volcano",
                "hook-class-name": "airflow_provider_volcano.hooks.volcano.VolcanoHook",
                "hook-name": "Volcano",
                "ui-field-behaviour": {
                    "hidden-fields": [
                        "schema",
                        "login",
                    ],
                    "relabeling": {
                        "host": "API URL",
                        "password": "Service key",
                        "port": "Port",
                    },
                    "placeholders": {
                        "host": "https://api.volcano.dev",
                        "password": "the project's service-role key",
                        "port": "443 (only for Airflow 3.3.2's Test icon)",
                    },
                },
                "conn-fields": {
                    "anon_key": {
                        "label": "Anon key",
                        "description": "The project's anon (public) key; optional, lock calls use the service key.",
                        "schema": {
                            "type": [
                                "string",
                                "null",
                            ],
                            "format": "password",
                        },
                    },
                    "timeout": {
                        "label": "Request timeout (seconds)",
                        "description": "Timeout of each request to the Volcano API.",
                        "schema": {
                            "type": [
                                "number",
                                "null",
                            ],
                            "minimum": 0.1,
                            "default": 10,
                        },
                    },
                    "wait_budget": {
                        "label": "Waiting budget (requests a minute)",
                        "description": "Lock requests a minute one process (a worker, the triggerer) may spend waiting for locks, shared by every lock it waits on; empty means VOLCANO_WAIT_BUDGET, else 120 (of the project's 600).",
                        "schema": {
                            "type": [
                                "integer",
                                "null",
                            ],
                            "minimum": 1,
                            "maximum": 600,
                        },
                    },
                    "previous_service_keys": {
                        "label": "Previous service keys",
                        "description": "During a service key rotation, the keys this connection held before, separated by commas or spaces (in the Extra JSON, a list): records sealed under them stay trusted and leases acquired under them keep their tokens. Remove them once no task, trigger or lock group of the old key is left.",
                        "schema": {
                            "type": [
                                "string",
                                "null",
                            ],
                            "format": "password",
                        },
                    },
                },
            },
        ],
    }
