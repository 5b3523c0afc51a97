"""Lock metrics: OpenTelemetry instruments recorded by the core, for Airflow, Prefect and the CLI alike.

The core records what happens to every lock it touches through :mod:`~volcano_locks.telemetry.record`
(the one set of calls the client, the keeper, the wait engine, the release and the fences make), and
each *sink* turns those records into metrics: the OpenTelemetry sink (always on; it costs one cached
look-up when no OpenTelemetry API is installed, and the API's no-op instruments when no
``MeterProvider`` is set) and whatever an integration adds (the Airflow provider's ``Stats`` sink).

The instruments (OpenTelemetry names; :data:`INSTRUMENTS` holds each one's kind, unit and meaning):

================================  ==============  ============================================================
name                              kind            what it measures (attributes)
================================  ==============  ============================================================
``volcano.lock.wait.duration``    histogram, s    a ``wait_acquire`` from its start to its end (``outcome``)
``volcano.lock.hold.duration``    histogram, s    a tenure from its acquisition to its end (``ending``)
``volcano.lock.waiters``          up-down count   waiters waiting now, past their first refusal (``mode``)
``volcano.lock.leases``           up-down count   leases this process holds now
``volcano.lock.contentions``      counter         acquisitions refused because the lock was held
``volcano.lock.losses``           counter         leases lost while held (``reason``: the loss's code)
``volcano.lock.renewal.margin``   histogram, s    the lease left at each successful renewal
``volcano.lock.handoff.duration`` histogram, s    a release to the next acquisition of the key, in-process
``volcano.lock.requests``         counter         requests sent (``operation``, ``status``; 429 included)
``volcano.lock.budget.used``      gauge, 1        this process's share of the project's 600 this minute
``volcano.fence.refused``         counter         stale writes a fenced store refused (``store``)
================================  ==============  ============================================================

Attributes are bounded: ``volcano.orchestrator`` (``airflow``, ``prefect`` or ``core``: which
integration is loaded in the process), the outcome, ending, mode, reason, operation, status or store,
and the lock key (``volcano.lock.key``) only when :data:`ENV_LOCK_KEY` allows it (lock keys can be
many, and may name customers). Nothing secret is ever an attribute: no key, no token. A failing sink
is logged once and never fails the lock call that recorded.
"""

from __future__ import annotations

from volcano_locks.telemetry.attributes import ENV_LOCK_KEY, keys_allowed, orchestrator
from volcano_locks.telemetry.instruments import INSTRUMENTS, Instrument
from volcano_locks.telemetry.sinks import Sink, add_sink, remove_sink, route_through

__all__ = [
    "ENV_LOCK_KEY",
    "INSTRUMENTS",
    "Instrument",
    "Sink",
    "add_sink",
    "keys_allowed",
    "orchestrator",
    "remove_sink",
    "route_through",
]
