"""The Volcano locks plugin: a lock board page and a task instance's Lock tab in the Airflow UI.

Registered once, under the ``airflow.plugins`` entry point ``volcano_locks`` (``pyproject.toml``):
Airflow loads those in every component whatever ``[core] lazy_discover_providers`` says, while it
loads a provider's ``plugins:`` (``provider.yaml``) only when providers are discovered eagerly (off
by default in Airflow 3.3). Listing it in both places would load it twice when discovery is eager,
and Airflow would report the second as a plugin import error, so ``provider.yaml`` does not list it.

Every Airflow process loads entry-point plugins, task processes included, so the board's FastAPI app
and the API server's middleware (a few seconds of imports) are built only when something asks for
``fastapi_apps`` or ``fastapi_root_middlewares``: the api-server and ``airflow plugins``.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from airflow.plugins_manager import AirflowPlugin

__all__ = ["URL_PREFIX", "VolcanoLocksPlugin"]

URL_PREFIX = "/volcano-locks"


class _Built:
    """A plugin attribute built from the board's app module, imported on first read (on the class or an
    instance); then the same list."""

    def __init__(self, build: Callable[[ModuleType], list[dict[str, Any]]]) -> None:
        self._build = build
        self._built: list[dict[str, Any]] | None = None

    def __get__(self, instance: object, owner: type | None = None) -> list[dict[str, Any]]:
        if self._built is None:
            from airflow_provider_volcano.plugins import app

            self._built = self._build(app)
        return self._built


class VolcanoLocksPlugin(AirflowPlugin):
    """Ships the lock board's FastAPI app, a "Volcano locks" page under Browse and a "Lock" tab, and the
    API server's middleware that frees the handoff lease of a task try a user cleared or marked
    (:mod:`airflow_provider_volcano.plugins.actions`)."""

    name = "volcano_locks"
    fastapi_apps = _Built(lambda app: [{"app": app.app, "url_prefix": URL_PREFIX, "name": "Volcano locks"}])
    fastapi_root_middlewares = _Built(
        lambda app: [
            {"middleware": app.UserActions, "name": "Volcano locks: free the handoff a user's action ended"}
        ]
    )
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
