"""Reading what the lock metrics recorded from OpenTelemetry's in-memory reader (``metric_reader``)."""

from __future__ import annotations

from typing import Any

__all__ = ["by", "points", "value"]


def points(reader: Any, name: str, key: str | None = None) -> list[Any]:
    """The data points of instrument ``name`` (only those carrying ``volcano.lock.key`` ``key``, if given)."""
    data = reader.get_metrics_data()
    found = []
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name != name:
                    continue
                for point in metric.data.data_points:
                    if key is None or point.attributes.get("volcano.lock.key") == key:
                        found.append(point)
    return found


def by(found: list[Any], attribute: str) -> dict[str, Any]:
    """The points by the value of ``attribute``."""
    return {p.attributes[attribute]: p for p in found}


def value(reader: Any, name: str, key: str) -> float:
    """The sum of a counter's (or up-down counter's) points for ``key``."""
    return sum(p.value for p in points(reader, name, key))
