"""What the Airflow tests import differently on the oldest supported Airflow (3.1) and the newest.

The provider's own differences are in ``airflow_provider_volcano._compat``; these are the ones only
the tests use. Each name comes from where the newest Airflow keeps it, else from where 3.1 kept it.

Apart from ``helpers.py`` because it imports Airflow: the conftest imports the helpers before it points
AIRFLOW_HOME at the session's private home, and Airflow reads its configuration on first import.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import airflow
from packaging.version import Version

from airflow_provider_volcano._compat import AirflowFailException, AirflowSkipException

try:  # Airflow 3.2+
    from airflow.sdk.exceptions import AirflowNotFoundException, TaskDeferred
except ImportError:  # Airflow 3.1
    from airflow.exceptions import AirflowNotFoundException, TaskDeferred

__all__ = [
    "AIRFLOW_VERSION",
    "DECLARATIVE_CONNECTION_FORM",
    "AirflowFailException",
    "AirflowNotFoundException",
    "AirflowSkipException",
    "TaskDeferred",
    "bundle_dag_bag",
    "runtime_hooks",
]

AIRFLOW_VERSION = Version(Version(airflow.__version__).base_version)
# Airflow 3.2 reads the connection form (conn-fields, ui-field-behaviour) from the provider info.
DECLARATIVE_CONNECTION_FORM = Version("3.2") <= AIRFLOW_VERSION


def bundle_dag_bag(folder: Path) -> Any:
    """A DagBag of ``folder`` with the folder on sys.path, as the dag processor and workers have it."""
    try:  # Airflow 3.2+
        from airflow.dag_processing.dagbag import BundleDagBag
    except ImportError:  # Airflow 3.1: the plain DagBag, the path added here
        from airflow.models.dagbag import DagBag

        if str(folder) not in sys.path:
            sys.path.append(str(folder))
        return DagBag(dag_folder=str(folder), bundle_path=folder, include_examples=False)
    return BundleDagBag(dag_folder=str(folder), bundle_path=folder, bundle_name="dags-folder")


def runtime_hooks() -> Any:
    """The hooks a task's runtime discovers (Airflow 3.2's task-SDK providers manager, else the core's)."""
    try:  # Airflow 3.2+
        from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime
    except ImportError:  # Airflow 3.1
        from airflow.providers_manager import ProvidersManager

        return ProvidersManager().hooks
    return ProvidersManagerTaskRuntime().hooks
