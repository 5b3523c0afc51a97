"""``VolcanoClient``: the entry point Volcano's Python SDK users know, with our lock clients as ``.locks``.

Volcano's SDK is used as ``VolcanoClient(anon_key=..., service_key=..., api_url=...)`` and then
``client.locks.acquire(...)``, ``client.locks.with_lock(...)``. Here ``client.locks`` is a
:class:`~volcano_locks.VolcanoLocks` (or, for :class:`AsyncVolcanoClient`, an
:class:`~volcano_locks.AsyncVolcanoLocks`), so the SDK's lock snippets run with only the import changed::

    from volcano_locks import VolcanoClient   # instead of: from volcano_sdk import VolcanoClient

Only locks are offered: the rest of Volcano's platform is not this project's.
"""

from __future__ import annotations

from typing import Generic, TypedDict, TypeVar, Unpack

from volcano_locks.client import AsyncClosing, AsyncVolcanoLocks, Closing, VolcanoLocks

__all__ = ["AsyncVolcanoClient", "VolcanoClient"]


_LocksT = TypeVar("_LocksT", VolcanoLocks, AsyncVolcanoLocks)


class _Options(TypedDict, total=False):
    """The lock client's settings the SDK's constructor passes on, keyword-only (defaults: the client's)."""

    timeout: float
    wait_budget: int | None


class _Front(Generic[_LocksT]):
    """The SDK's constructor, shared by both entry points; ``locks`` is the lock client."""

    _locks_type: type[_LocksT]

    def __init__(
        self,
        anon_key: str | None = None,
        service_key: str | None = None,
        api_url: str | None = None,
        **options: Unpack[_Options],
    ) -> None:
        self.locks: _LocksT = self._locks_type(api_url, anon_key, service_key, **options)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(api_url={self.locks.api_url!r})"


class VolcanoClient(Closing, _Front[VolcanoLocks]):
    """Volcano's SDK entry point, for locks: ``client.locks`` is a :class:`~volcano_locks.VolcanoLocks`.

    Args:
        anon_key: The project's anon key (``VOLCANO_ANON_KEY`` when ``None``).
        service_key: A service-role key with ``locks.manage`` (``VOLCANO_SERVICE_KEY`` when ``None``).
        api_url: The API base URL (``VOLCANO_API_URL`` when ``None``).
        timeout: Total time a request may take, in seconds.
        wait_budget: Requests a minute this process may spend waiting for locks.

    Example:
        >>> client = VolcanoClient(service_key=key, api_url=url)            # doctest: +SKIP
        >>> with client.locks.with_lock("daily-report", ttl=30) as guard:  # doctest: +SKIP
        ...     print("Current fence", guard.lease.fencing_token)
    """

    _locks_type = VolcanoLocks

    def close(self) -> None:
        """Close the lock client's connections."""
        self.locks.close()


class AsyncVolcanoClient(AsyncClosing, _Front[AsyncVolcanoLocks]):
    """The async twin of :class:`VolcanoClient`: ``client.locks`` is an ``AsyncVolcanoLocks``."""

    _locks_type = AsyncVolcanoLocks

    async def aclose(self) -> None:
        """Close the lock client's connections."""
        await self.locks.aclose()
