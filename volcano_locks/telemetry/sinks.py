"""Where records go: the OpenTelemetry sink (always), and the sinks integrations add (Airflow's ``Stats``).

A sink gets ``(instrument, value, attributes)`` for each record. :func:`emit` hands a record to every
sink and swallows (and logs once per sink) what a sink raises: a metrics failure never fails a lock
call.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from volcano_locks.telemetry.instruments import Instrument

__all__ = ["OpenTelemetrySink", "Sink", "add_sink", "emit", "remove_sink", "route_through"]

logger = logging.getLogger("volcano_locks.telemetry")


class Sink(Protocol):
    """Takes each record: the instrument, its value (a delta for counters and up-down counts), attributes."""

    def record(self, instrument: Instrument, value: float, attributes: Mapping[str, str]) -> None:
        """Record ``value`` for ``instrument`` with ``attributes``."""


class OpenTelemetrySink:
    """Records through an OpenTelemetry ``MeterProvider``, by default the global one.

    The instruments are made on first use from the API's meter, which forwards to whatever provider the
    application sets, even later; without the API installed this sink records nothing at all.

    Args:
        meter_provider: A provider of its own instead of the global one (a second pipeline, a benchmark).
    """

    def __init__(self, meter_provider: Any = None) -> None:
        self._provider = meter_provider
        self._lock = threading.Lock()
        self._meter: Any = None
        self._made: dict[str, Any] = {}
        self._absent = False

    def _instrument(self, instrument: Instrument) -> Any:
        made = self._made.get(instrument.name)
        if made is not None or self._absent:
            return made
        with self._lock:
            if self._meter is None:
                try:
                    from opentelemetry import metrics
                except ImportError:
                    self._absent = True
                    return None
                from volcano_locks.__about__ import __version__

                provider = self._provider or metrics.get_meter_provider()
                self._meter = provider.get_meter("volcano_locks", __version__)
            meter, name = self._meter, instrument.name
            args = {"unit": instrument.unit, "description": instrument.description}
            factory = {
                "counter": meter.create_counter,
                "histogram": meter.create_histogram,
                "updown": meter.create_up_down_counter,
                "gauge": meter.create_gauge,
            }[instrument.kind]
            made = self._made.setdefault(name, factory(name, **args))
        return made

    def record(self, instrument: Instrument, value: float, attributes: Mapping[str, str]) -> None:
        """Add, record or set ``value`` on the OpenTelemetry instrument."""
        made = self._instrument(instrument)
        if made is None:
            return
        if instrument.kind in ("counter", "updown"):
            made.add(value, attributes)
        elif instrument.kind == "histogram":
            made.record(value, attributes)
        else:
            made.set(value, attributes)


_DEFAULT = OpenTelemetrySink()


class _Sinks:
    """The sinks in force: copied on write, read without a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.all: tuple[Sink, ...] = (_DEFAULT,)
        self.failed: set[int] = set()


_SINKS = _Sinks()


def add_sink(sink: Sink) -> None:
    """Send every record to ``sink`` too (once, however often it is added)."""
    with _SINKS.lock:
        if sink not in _SINKS.all:
            _SINKS.all = (*_SINKS.all, sink)


def route_through(sink: Sink) -> None:
    """Send every record to ``sink`` *instead of* the default OpenTelemetry sink.

    For an orchestrator whose own metrics front already reaches OpenTelemetry when so configured (Airflow's
    ``Stats`` with ``[metrics] otel_on`` sets the global ``MeterProvider``): the records go one way, not
    twice. Sinks added with :func:`add_sink` stay.
    """
    with _SINKS.lock:
        kept = tuple(s for s in _SINKS.all if s is not _DEFAULT)
        _SINKS.all = kept if sink in kept else (*kept, sink)


def remove_sink(sink: Sink) -> None:
    """Stop sending records to ``sink``."""
    with _SINKS.lock:
        _SINKS.all = tuple(s for s in _SINKS.all if s is not sink)


def emit(instrument: Instrument, value: float, attributes: Mapping[str, str]) -> None:
    """Hand one record to every sink; a sink that fails is logged (once) and skipped."""
    for sink in _SINKS.all:
        try:
            sink.record(instrument, value, attributes)
        except Exception:
            if id(sink) not in _SINKS.failed:
                _SINKS.failed.add(id(sink))
                logger.warning(
                    "lock metrics sink %s failed; the lock call goes on", type(sink).__name__, exc_info=True
                )
