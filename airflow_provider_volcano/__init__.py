"""Apache Airflow provider for Volcano project locks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["VolcanoHook", "VolcanoLockOperator", "VolcanoLockTrigger"]

if TYPE_CHECKING:
    from airflow_provider_volcano.hooks.volcano import VolcanoHook
    from airflow_provider_volcano.operators.lock import VolcanoLockOperator
    from airflow_provider_volcano.triggers.lock import VolcanoLockTrigger

# Lazy re-exports: importing the operator module must not pay for the trigger (airflow.triggers).
_LAZY = {
    "VolcanoHook": "airflow_provider_volcano.hooks.volcano",
    "VolcanoLockOperator": "airflow_provider_volcano.operators.lock",
    "VolcanoLockTrigger": "airflow_provider_volcano.triggers.lock",
}


def __getattr__(name: str) -> Any:
    """Import a re-exported class on first access."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
