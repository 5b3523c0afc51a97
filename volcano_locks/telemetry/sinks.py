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


_PENDING_AT_MOST = 4096
"""Histogram values kept between two collections before they are recorded on the spot. A project's quota
(600 requests a minute) lets a process make at most a few values a request, so a reader collecting every
minute (the SDK's default) never reaches it; one that never collects costs this many values' memory."""


class OpenTelemetrySink:
    """Records through an OpenTelemetry ``MeterProvider``, by default the global one.

    The instruments are made, all at once, on first use from the API's meter, which forwards to whatever
    provider the application sets, even later; without the API installed this sink records nothing.

    A lock call pays a dictionary update or a list append here, not the SDK's per-measurement work (about
    30 µs a histogram value on a 2-core machine, its caches cold after the request). Counters, up-down
    counts and gauges are kept here per attribute set and handed to OpenTelemetry as *observable*
    instruments, which report the same sums and last values a synchronous one would. Histogram values
    wait in a list until a reader collects (in its own thread, for a periodic reader): the first callback
    of that collection records them, before the reader reads any instrument. Past
    :data:`_PENDING_AT_MOST` values with no collection (no reader, or one that rarely collects) they are
    recorded on the spot.

    Args:
        meter_provider: A provider of its own instead of the global one (a second pipeline, a benchmark).
    """

    def __init__(self, meter_provider: Any = None) -> None:
        self._provider = meter_provider
        self._lock = threading.Lock()
        self._made: dict[str, Any] | None = None
        self._absent = False
        self._kept: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        self._pending: list[tuple[str, float, Mapping[str, str]]] = []

    def _instruments(self) -> dict[str, Any] | None:
        if self._made is not None or self._absent:
            return self._made
        with self._lock:
            if self._made is None:
                try:
                    from opentelemetry import metrics
                except ImportError:
                    self._absent = True
                    return None
                from volcano_locks.__about__ import __version__
                from volcano_locks.telemetry.instruments import INSTRUMENTS

                provider = self._provider or metrics.get_meter_provider()
                meter = provider.get_meter("volcano_locks", __version__)
                self._kept = {i.name: {} for i in INSTRUMENTS.values() if i.kind != "histogram"}
                self._made = {i.name: self._make(meter, i) for i in INSTRUMENTS.values()}
        return self._made

    def _make(self, meter: Any, instrument: Instrument) -> Any:
        """The OpenTelemetry instrument (histograms synchronous, the rest observed from what is kept)."""
        name = instrument.name
        args = {"unit": instrument.unit, "description": instrument.description}
        if instrument.kind == "histogram":
            return meter.create_histogram(name, **args)
        factory = {
            "counter": meter.create_observable_counter,
            "updown": meter.create_observable_up_down_counter,
            "gauge": meter.create_observable_gauge,
        }[instrument.kind]
        return factory(name, callbacks=[self._observer(self._kept[name])], **args)

    def _observer(self, kept: dict[tuple[tuple[str, str], ...], float]) -> Any:
        from opentelemetry.metrics import Observation

        def observe(_options: Any) -> list[Any]:
            self._record_pending()
            with self._lock:
                now = list(kept.items())
            return [Observation(value, dict(attributes)) for attributes, value in now]

        return observe

    def _record_pending(self) -> None:
        """Record the histogram values kept since the last collection."""
        with self._lock:
            pending, self._pending = self._pending, []
        made = self._made or {}
        for name, value, attributes in pending:
            made[name].record(value, attributes)

    def record(self, instrument: Instrument, value: float, attributes: Mapping[str, str]) -> None:
        """Keep ``value``: added to (for a gauge: set as) its attribute set's, or pending for a histogram."""
        if self._instruments() is None:
            return
        if instrument.kind == "histogram":
            with self._lock:
                self._pending.append((instrument.name, value, attributes))
                full = len(self._pending) > _PENDING_AT_MOST
            if full:
                self._record_pending()
            return
        point = tuple(sorted(attributes.items()))
        with self._lock:
            kept = self._kept[instrument.name]
            kept[point] = value if instrument.kind == "gauge" else kept.get(point, 0) + value


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
