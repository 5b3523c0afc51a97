"""What the orchestrator integrations take from the core beyond its front door, declared in one place.

``airflow_provider_volcano`` and ``prefect_volcano`` import from exactly two places of the core: the
package itself (``volcano_locks``, its ``__all__``) and this module (its ``__all__``), never from the
modules behind them (the user-facing packages ``volcano_locks.once`` and ``volcano_locks.fencing``
excepted: their ``__all__`` is public API); ``tests/core/test_imports.py`` holds them to it. A name
the integrations need joins the list here, so what they rely on stays one short list, and the core's
modules can be rearranged behind it.

The names load on first use (PEP 562), as the package's clients do: a DAG file or a flow importing
this module for a validator does not import httpx.
"""

import typing as _typing

from volcano_locks._lazy import lazy_names as _lazy_names

if _typing.TYPE_CHECKING:
    from volcano_locks._steps import async_outcome as async_outcome
    from volcano_locks._steps import outcome as outcome
    from volcano_locks.clock import lease_clock as lease_clock
    from volcano_locks.config import api_url_from as api_url_from
    from volcano_locks.eta import Eta as Eta
    from volcano_locks.eta import duration as duration
    from volcano_locks.eta import estimate as estimate
    from volcano_locks.eta import expected_start as expected_start
    from volcano_locks.eta import reported as reported
    from volcano_locks.eta import reported_holder_age as reported_holder_age
    from volcano_locks.governor import validate_wait_budget as validate_wait_budget
    from volcano_locks.guard import AsyncLockContext as AsyncLockContext
    from volcano_locks.guard import LockContext as LockContext
    from volcano_locks.keeping import async_keep as async_keep
    from volcano_locks.keeping import keep as keep
    from volcano_locks.protocol import MAX_TTL as MAX_TTL
    from volcano_locks.protocol import validate_poll as validate_poll
    from volcano_locks.releasing import ReleaseOutcome as ReleaseOutcome
    from volcano_locks.releasing import async_release_or_lapse as async_release_or_lapse
    from volcano_locks.releasing import release_or_lapse as release_or_lapse
    from volcano_locks.telemetry import Instrument as Instrument
    from volcano_locks.telemetry import add_sink as add_sink
    from volcano_locks.telemetry import route_through as route_through
    from volcano_locks.waiting import GRACE as GRACE
    from volcano_locks.waiting import WaitPolicy as WaitPolicy
    from volcano_locks.waiting import inform as inform
    from volcano_locks.waiting import vouch as vouch
    from volcano_locks.waiting import wait_acquire as wait_acquire
    from volcano_locks.waiting import wake as wake

_FROM = {
    "GRACE": "volcano_locks.waiting",
    "AsyncLockContext": "volcano_locks.guard",
    "Eta": "volcano_locks.eta",
    "Instrument": "volcano_locks.telemetry",
    "LockContext": "volcano_locks.guard",
    "MAX_TTL": "volcano_locks.protocol",
    "ReleaseOutcome": "volcano_locks.releasing",
    "WaitPolicy": "volcano_locks.waiting",
    "add_sink": "volcano_locks.telemetry",
    "api_url_from": "volcano_locks.config",
    "async_keep": "volcano_locks.keeping",
    "async_outcome": "volcano_locks._steps",
    "async_release_or_lapse": "volcano_locks.releasing",
    "duration": "volcano_locks.eta",
    "estimate": "volcano_locks.eta",
    "inform": "volcano_locks.waiting",
    "keep": "volcano_locks.keeping",
    "lease_clock": "volcano_locks.clock",
    "outcome": "volcano_locks._steps",
    "release_or_lapse": "volcano_locks.releasing",
    "route_through": "volcano_locks.telemetry",
    "reported": "volcano_locks.eta",
    "reported_holder_age": "volcano_locks.eta",
    "expected_start": "volcano_locks.eta",
    "validate_poll": "volcano_locks.protocol",
    "validate_wait_budget": "volcano_locks.governor",
    "vouch": "volcano_locks.waiting",
    "wait_acquire": "volcano_locks.waiting",
    "wake": "volcano_locks.waiting",
}
"""Each name the integrations take from here, and the core module that defines it."""

__all__ = sorted(_FROM)

if not _typing.TYPE_CHECKING:  # the type checker sees the imports above; a misspelt name stays an error
    __getattr__ = _lazy_names(__name__, _FROM, globals())

    def __dir__() -> list[str]:
        return sorted({*globals(), *_FROM})
