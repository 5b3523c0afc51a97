"""The Volcano locks plugin: a lock board page and a task instance's Lock tab in the Airflow UI."""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

__all__ = ["URL_PREFIX", "VolcanoLocksPlugin"]

URL_PREFIX = "/volcano-locks"


def _app() -> Any:
    from airflow_provider_volcano.plugins.app import app

    return app


class VolcanoLocksPlugin(AirflowPlugin):
    """Ships the lock board's FastAPI app, a "Volcano locks" page under Browse and a "Lock" tab."""

    name = "volcano_locks"
    fastapi_apps = [{"app": _app(), "url_prefix": URL_PREFIX, "name": "Volcano locks"}]  # noqa: RUF012
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
