"""The lock spans: ``volcano.lock.wait`` around a wait, ``volcano.lock.hold`` from acquisition to its end.

Through the OpenTelemetry API's global tracer provider, each span a child of whatever span is current where
the wait starts or the lease is acquired (in an Airflow task, the task instance's span; in Prefect, the task
run's). The hold span gets an event for each renewal (``renewed``) and one for its end (``released``,
``lapsed`` or ``lost``, with the reason), each carrying the fencing token (public, unlike the ownership
token, which is never an attribute). Without the API installed, or without a provider, nothing is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["add_event", "end", "start"]

_STATE: dict[str, Any] = {}


def _tracer() -> Any:
    if "tracer" not in _STATE:
        try:
            from opentelemetry import trace
        except ImportError:
            _STATE["tracer"] = None
        else:
            from volcano_locks.__about__ import __version__

            _STATE["tracer"] = trace.get_tracer("volcano_locks", __version__)
    return _STATE["tracer"]


def start(name: str, attributes: Mapping[str, str | int]) -> Any:
    """Start span ``name`` under the current span (not made current itself); ``None`` without the API."""
    tracer = _tracer()
    return None if tracer is None else tracer.start_span(name, attributes=dict(attributes))


def add_event(span: Any, name: str, attributes: Mapping[str, str | int | float]) -> None:
    """Add event ``name`` to ``span`` (if there is one)."""
    if span is not None:
        span.add_event(name, attributes=dict(attributes))


def end(span: Any, attributes: Mapping[str, str | int] | None = None) -> None:
    """Set ``attributes`` on ``span`` and end it (if there is one)."""
    if span is not None:
        if attributes:
            span.set_attributes(dict(attributes))
        span.end()
