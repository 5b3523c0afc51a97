"""The attributes every lock metric carries: bounded, and never a secret.

The lock key is an attribute only where the operator allows it (:data:`ENV_LOCK_KEY`): a fleet can
use thousands of keys, each a time series, and a key may name a customer. The orchestrator is read
off the process (which integration is loaded), so the keeper's thread and the trigger's loop report
it alike without anything being passed down.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

__all__ = ["ENV_LOCK_KEY", "keys_allowed", "lock_attributes", "orchestrator"]

logger = logging.getLogger("volcano_locks.telemetry")

ENV_LOCK_KEY = "VOLCANO_METRICS_LOCK_KEY"
"""Set to ``1`` (``true``, ``yes``, ``on``) to put the lock key on each metric as ``volcano.lock.key``."""

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_warned: set[str] = set()


def keys_allowed() -> bool:
    """Whether lock keys may be metric attributes (:data:`ENV_LOCK_KEY`); an unknown value warns once."""
    raw = os.environ.get(ENV_LOCK_KEY, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw not in _FALSE and raw not in _warned:
        _warned.add(raw)
        logger.warning(
            "%s=%r is not one of 1/true/yes/on or 0/false/no/off: lock keys stay off the metrics",
            ENV_LOCK_KEY,
            raw,
        )
    return False


def orchestrator() -> str:
    """``airflow`` or ``prefect`` when that integration is in use in this process, else ``core``.

    Airflow's integration counts only beside Airflow itself: its package imports without Airflow (for
    its metadata, its docs), and a Prefect process that merely imported it is still a Prefect one.
    """
    modules = sys.modules
    if "airflow_provider_volcano" in modules and "airflow" in modules:
        return "airflow"
    if "prefect_volcano" in modules:
        return "prefect"
    return "core"


def lock_attributes(key: str | None, more: Mapping[str, str] | None = None) -> dict[str, str]:
    """The attributes of one record about ``key``: the orchestrator, ``more``, and the key if allowed."""
    attributes = {"volcano.orchestrator": orchestrator(), **(more or {})}
    if key is not None and keys_allowed():
        attributes["volcano.lock.key"] = key
    return attributes
