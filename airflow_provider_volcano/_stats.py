"""The lock metrics through Airflow's own ``Stats``, so ``[metrics]`` decides where they go.

The core records every lock metric once (:mod:`volcano_locks.telemetry`); in an Airflow process this sink
hands each record to Airflow's ``Stats`` (3.3: ``airflow.sdk.observability.stats``; 3.1 and 3.2:
``airflow.stats.Stats``): StatsD, Datadog or OpenTelemetry as ``[metrics]`` says, under its prefix, with
its allow and block lists applied to the names. A StatsD name cannot carry attributes, so, as Airflow does
for its pool metrics (``pool.open_slots.<pool>``), each name is the instrument's name followed by the
values of its attributes (``volcano.lock.wait.duration.acquired``, ``volcano.lock.requests.acquire.409``,
and the lock key last where keys are allowed); the attributes also go as tags for backends that take them.
Histograms are timers (milliseconds), up-down counts are gauge deltas.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta

from volcano_locks.integration import Instrument

__all__ = ["StatsSink", "stat_name"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _part(value: str) -> str:
    """One part of a stat name: what StatsD and Airflow's name check accept (dots kept, others ``_``)."""
    return _UNSAFE.sub("_", value)


def stat_name(instrument: Instrument, attributes: Mapping[str, str]) -> str:
    """The StatsD name of a record: the instrument's name, its attributes' values, then the key if given."""
    parts = [instrument.name]
    parts += [attributes[name] for name in instrument.attributes if name in attributes]
    if "volcano.lock.key" in attributes:
        parts.append(attributes["volcano.lock.key"])
    return ".".join(_part(p) for p in parts)


class StatsSink:
    """A :class:`volcano_locks.telemetry.Sink` that records through Airflow's ``Stats``."""

    def record(self, instrument: Instrument, value: float, attributes: Mapping[str, str]) -> None:
        """Send one record: a counter increment, a gauge (or its delta), or a timer."""
        from airflow_provider_volcano._compat import stats  # Airflow's conf and Stats: at the first record

        front, name, tags = stats(), stat_name(instrument, attributes), dict(attributes)
        if instrument.kind == "counter":
            front.incr(name, count=int(value), tags=tags)
        elif instrument.kind == "updown":
            front.gauge(name, value, delta=True, tags=tags)
        elif instrument.kind == "histogram":
            front.timing(name, timedelta(seconds=value), tags=tags)
        else:
            front.gauge(name, value, tags=tags)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StatsSink)

    def __hash__(self) -> int:
        return hash(StatsSink)
