"""Apache Airflow provider for Volcano project locks."""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from airflow_provider_volcano._stats import StatsSink
from volcano_locks import __version__ as __version__
from volcano_locks.integration import route_through

# The lock metrics go through Airflow's Stats (and only there) in every Airflow process that loads the
# provider (the worker's task, the triggerer, the scheduler), so [metrics] decides where they go, once
# (airflow_provider_volcano._stats). The lock spans stay on the OpenTelemetry API, as Airflow's own do.
# Where Airflow is not installed (the package read for its metadata or its docs, in a Prefect or plain
# process) there is no Stats: the metrics stay on OpenTelemetry instead of going nowhere.
if find_spec("airflow") is not None:
    route_through(StatsSink())

__all__ = ["VolcanoHook", "VolcanoLockOperator", "VolcanoLockTrigger"]

if TYPE_CHECKING:
    from airflow_provider_volcano.hooks.volcano import VolcanoHook
    from airflow_provider_volcano.operators.lock import VolcanoLockOperator
    from airflow_provider_volcano.triggers.lock import VolcanoLockTrigger


def __getattr__(name: str) -> Any:
    """Import a re-exported class on first access.

    Importing the operator module must not pay for the trigger (``airflow.triggers``) nor the hook.
    """
    value: Any
    if name == "VolcanoHook":
        from airflow_provider_volcano.hooks.volcano import VolcanoHook as value
    elif name == "VolcanoLockOperator":
        from airflow_provider_volcano.operators.lock import VolcanoLockOperator as value
    elif name == "VolcanoLockTrigger":
        from airflow_provider_volcano.triggers.lock import VolcanoLockTrigger as value
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
