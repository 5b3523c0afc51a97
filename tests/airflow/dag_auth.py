"""An auth manager with per-DAG permissions, for the lock board's access tests (the api-server loads it).

Airflow's simple auth manager has only global roles and the FAB auth manager is not in the test
environment, so this is Airflow's own ``SimpleAuthManager`` (real login, tokens, roles for every other
resource) with one change: the DAG permissions of the users listed in ``VOLCANO_TEST_DAG_ACCESS``
(JSON: user -> {"GET": [dag ids], "PUT": [dag ids]}) are exactly those, as FAB's per-DAG permissions
would be; no listed user has access to "every DAG". Users not listed keep their role's permissions.
"""

from __future__ import annotations

import json
import os
from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

__all__ = ["ENV", "DagScopedAuthManager"]

ENV = "VOLCANO_TEST_DAG_ACCESS"


class DagScopedAuthManager(SimpleAuthManager):
    """``SimpleAuthManager`` whose listed users have per-DAG read (``GET``) and edit (``PUT``)."""

    def is_authorized_dag(
        self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None
    ) -> bool:
        scoped = json.loads(os.environ.get(ENV, "{}")).get(user.get_name())
        if scoped is None:
            return super().is_authorized_dag(
                method=method, user=user, access_entity=access_entity, details=details
            )
        dag_id = details.id if details is not None else None
        allowed = scoped.get("GET" if method == "GET" else "PUT", [])
        return dag_id is not None and dag_id in allowed
