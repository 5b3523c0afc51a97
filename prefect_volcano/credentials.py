"""The `VolcanoCredentials` block: where a Volcano project's API URL and keys live in Prefect."""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx
from prefect.blocks.core import Block
from pydantic import Field, SecretStr, field_validator

from volcano_locks import AsyncVolcanoLocks, InvalidRequest, VolcanoLocks
from volcano_locks.integration import api_url_from, validate_wait_budget

__all__ = ["DEFAULT_API_URL", "VolcanoCredentials", "async_client_for", "sync_client_for"]

DEFAULT_API_URL = "https://api.volcano.dev"


DOCS_URL = "https://github.com/volcano-locks/volcano-locks/blob/main/docs/prefect.md"
"""Where the block's "documentation" link points: this integration's own Prefect page."""


class VolcanoCredentials(Block):
    """Credentials for Volcano project locks: the API URL, the service key and the anon key.

    Locks are scoped to the project inside the service key. Lock calls use only the
    service key; the anon key is kept for completeness (the Volcano SDKs take both).

    Attributes:
        api_url: The Volcano API base URL.
        service_key: The project's service-role key (secret).
        anon_key: The project's anon key (secret, optional).
        timeout: Seconds allowed for each HTTP request to the locks API.
        wait_budget: Lock requests a minute one process may spend waiting for locks (1-600);
            None: `VOLCANO_WAIT_BUDGET`, else the core's default (120).

    Example:
        Load stored credentials and take a lock:
        ```python
        from prefect_volcano import VolcanoCredentials

        volcano_credentials = VolcanoCredentials.load("BLOCK_NAME")
        with volcano_credentials.get_client() as client:
            with client.with_lock("nightly-rollup", ttl=30) as guard:
                print(guard.fencing_token)
        ```
    """

    _block_type_name = "Volcano Credentials"
    _block_type_slug = "volcano-credentials"
    _documentation_url = DOCS_URL  # type: ignore[assignment]
    _description = "Volcano project lock credentials: API URL, service key and anon key."

    api_url: str = Field(
        default=DEFAULT_API_URL,
        title="API URL",
        description=(
            "Base URL of the Volcano API, e.g. https://api.volcano.dev or http://127.0.0.1:8000"
            " (without a scheme: https, or http for localhost)."
        ),
        # No `pattern`: neither of Prefect's block forms checks one (docs/prefect.md), so whatever the
        # form saves must load; the validator below takes a scheme-less URL as the core does.
    )
    service_key: SecretStr = Field(
        default=...,
        title="Service key",
        description="The project's service-role key; lock calls authenticate with it.",
    )
    anon_key: SecretStr | None = Field(
        default=None,
        title="Anon key",
        description="The project's anon (public) key; optional, lock calls do not use it.",
    )
    timeout: float = Field(
        default=10.0,
        # `ge`, not `gt`: Prefect 3.9's default (V2) form turns `minimum` into its number input's `min`,
        # which the browser enforces, and ignores `exclusiveMinimum`: a 0 would save and never load.
        ge=0.1,
        le=300,
        description="Seconds allowed for each HTTP request to the locks API.",
    )

    wait_budget: int | None = Field(
        default=None,
        title="Waiting budget",
        ge=1,
        le=600,
        description=(
            "Lock requests a minute one process may spend waiting for locks (1-600);"
            " empty: VOLCANO_WAIT_BUDGET, else 120."
        ),
    )

    @field_validator("wait_budget")
    @classmethod
    def _check_wait_budget(cls, value: int | None) -> int | None:
        """The core's rule for a waiting budget (one rule, one place)."""
        return None if value is None else validate_wait_budget(value)

    @field_validator("api_url")
    @classmethod
    def _check_api_url(cls, value: str) -> str:
        """The core's rule (one rule, one place): a scheme-less URL gets one; a URL no client could
        reach is refused, naming the value (it is not a secret)."""
        try:
            return api_url_from(value)
        except InvalidRequest as exc:
            raise ValueError(str(exc)) from None

    def _client_kwargs(self) -> dict[str, Any]:
        return {
            "api_url": self.api_url,
            "anon_key": self.anon_key.get_secret_value() if self.anon_key is not None else None,
            "service_key": self.service_key.get_secret_value(),
            "timeout": self.timeout,
            "wait_budget": self.wait_budget,
        }

    def get_client(self) -> VolcanoLocks:
        """Return a new synchronous locks client; close it (or use it as a context manager) when done."""
        return sync_client_for(self)

    def get_async_client(self) -> AsyncVolcanoLocks:
        """Return a new asynchronous locks client; `aclose()` it (or `async with` it) when done."""
        return async_client_for(self)


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Building a verifying context (loading the CA bundle) costs ~25 ms, far more than a lock
    # round trip; every client shares one, so a client per task run stays cheap.
    return httpx.create_ssl_context()


def sync_client_for(credentials: VolcanoCredentials | None) -> VolcanoLocks:
    """Build a sync client from a block, or from the VOLCANO_* environment when None."""
    kwargs = credentials._client_kwargs() if credentials is not None else {}
    return VolcanoLocks(**kwargs, transport=httpx.HTTPTransport(verify=_ssl_context()))


def async_client_for(credentials: VolcanoCredentials | None) -> AsyncVolcanoLocks:
    """Build an async client from a block, or from the VOLCANO_* environment when None."""
    kwargs = credentials._client_kwargs() if credentials is not None else {}
    return AsyncVolcanoLocks(**kwargs, transport=httpx.AsyncHTTPTransport(verify=_ssl_context()))
