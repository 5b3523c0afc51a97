"""The Volcano locks plugin: a lock board page and a task instance's Lock tab in the Airflow UI.

Registered once, under the ``airflow.plugins`` entry point ``volcano_locks`` (``pyproject.toml``):
Airflow loads those in every component whatever ``[core] lazy_discover_providers`` says, while it
loads a provider's ``plugins:`` (``provider.yaml``) only when providers are discovered eagerly (off
by default in Airflow 3.3). Listing it in both places would load it twice when discovery is eager,
and Airflow would report the second as a plugin import error, so ``provider.yaml`` does not list it.

Every Airflow process loads entry-point plugins, task processes included, so the board's FastAPI app
(a few seconds of imports) is built only when something asks for ``fastapi_apps``: the api-server
and ``airflow plugins``.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

__all__ = ["URL_PREFIX", "VolcanoLocksPlugin"]

URL_PREFIX = "/volcano-locks"


class _BoardApps:
    """``fastapi_apps``, built on first read (on the class or an instance), then the same list."""

    def __init__(self) -> None:
        self._apps: list[dict[str, Any]] | None = None

    def __get__(self, instance: object, owner: type | None = None) -> list[dict[str, Any]]:
        if self._apps is None:
            from airflow_provider_volcano.plugins.app import app

            self._apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Volcano locks"}]
        return self._apps


class VolcanoLocksPlugin(AirflowPlugin):
    """Ships the lock board's FastAPI app, a "Volcano locks" page under Browse and a "Lock" tab."""

    name = "volcano_locks"
    fastapi_apps = _BoardApps()
    external_views = [  # noqa: RUF012
        {
            "name": "Volcano locks",
            "href": f"{URL_PREFIX}/board",
            "destination": "nav",
            "category": "browse",
            "url_route": "volcano-locks",
        },
        {
            "name": "Lock",
            "href": f"{URL_PREFIX}/ti/{{DAG_ID}}/{{RUN_ID}}/{{TASK_ID}}/{{MAP_INDEX}}",
            "destination": "task_instance",
            "url_route": "volcano-lock",
        },
    ]
