"""VolcanoHook: turns an Airflow connection into the core Volcano lock clients."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException

if TYPE_CHECKING:
    from collections.abc import Mapping

    from airflow_provider_volcano._tokens import TaskIdentity
    from volcano_locks import AsyncVolcanoLocks, VolcanoLocks

__all__ = ["VolcanoConnectionConfig", "VolcanoConnectionError", "VolcanoHook", "parse_connection"]

DEFAULT_TIMEOUT = 10.0
# A key nobody locks: test_connection reads it to prove the URL and the key's permissions.
_PROBE_KEY = "airflow-provider-volcano.connection-test"
_DEFAULT_PORTS = {"http": 80, "https": 443}


class VolcanoConnectionError(AirflowException, ValueError):
    """A Volcano connection is missing a field or holds an invalid value."""


@dataclass(frozen=True)
class VolcanoConnectionConfig:
    """What a Volcano connection holds, parsed once.

    :param api_url: the Volcano API base URL.
    :param service_key: the service-role key (never in repr).
    :param anon_key: the anon key, if given (never in repr).
    :param timeout: the request timeout in seconds.
    :param wait_budget: lock requests a minute one process may spend waiting (``None``: the core's
        default, ``VOLCANO_WAIT_BUDGET`` or 120).
    """

    api_url: str
    service_key: str = field(repr=False)
    anon_key: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT
    wait_budget: int | None = None


def _extra_dict(conn_id: str, extra: str | dict[str, Any] | None) -> dict[str, Any]:
    if not extra:
        return {}
    if isinstance(extra, dict):
        return extra
    try:
        value = json.loads(extra)
    except json.JSONDecodeError as exc:
        raise VolcanoConnectionError(
            f"Volcano connection {conn_id!r}: the Extra field is not valid JSON ({exc.msg} at {exc.pos})"
        ) from None
    if not isinstance(value, dict):
        raise VolcanoConnectionError(
            f"Volcano connection {conn_id!r}: the Extra field must be a JSON object, "
            f"got {type(value).__name__}"
        )
    return value


def _extra_value(extra: dict[str, Any], name: str) -> Any:
    # The declarative form stores bare names; older UIs stored the extra__<type>__ prefix.
    value = extra.get(name)
    if value in (None, ""):
        value = extra.get(f"extra__volcano__{name}")
    return None if value == "" else value


def _api_url(conn_id: str, host: str | None, port: int | None, schema: str | None) -> str:
    if not host:
        raise VolcanoConnectionError(
            f"Volcano connection {conn_id!r} has no API URL: set its API URL field "
            "(e.g. https://api.volcano.dev)"
        )
    url = host.strip().rstrip("/")
    if "://" not in url:
        url = f"https://{url}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise VolcanoConnectionError(
            f"Volcano connection {conn_id!r}: API URL {url!r} is not an http(s) URL with a host"
        )
    try:
        url_port = parts.port
    except ValueError:
        raise VolcanoConnectionError(
            f"Volcano connection {conn_id!r}: API URL {url!r} has an invalid port"
        ) from None
    if port is not None and port != 0:
        # The Port field exists so that Airflow 3.3.2's Test icon works (apache/airflow#73298); it
        # must name the same endpoint as the URL, never silently redirect the keys elsewhere.
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise VolcanoConnectionError(
                f"Volcano connection {conn_id!r}: Port must be a TCP port (1-65535), got {port!r}"
            )
        effective = url_port if url_port is not None else _DEFAULT_PORTS[parts.scheme]
        if url_port is not None and port != url_port:
            raise VolcanoConnectionError(
                f"Volcano connection {conn_id!r}: Port {port} differs from the port of API URL "
                f"{url!r}; leave Port empty or make them the same"
            )
        if port != effective:
            url = f"{parts.scheme}://{parts.netloc}:{port}{parts.path}"
    if schema:
        url = f"{url}/{schema.strip('/')}"
    return url


def _timeout(conn_id: str, raw: Any) -> float:
    if raw is None:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise VolcanoConnectionError(
            f"Volcano connection {conn_id!r}: timeout must be a number of seconds, got {raw!r}"
        ) from None
    if isinstance(raw, bool) or not math.isfinite(value) or value <= 0:
        raise VolcanoConnectionError(
            f"Volcano connection {conn_id!r}: timeout must be a positive number of seconds, got {raw!r}"
        )
    return value


def _wait_budget(conn_id: str, raw: Any) -> int | None:
    if raw is None or raw == "":
        return None
    from volcano_locks import InvalidRequest
    from volcano_locks.governor import validate_wait_budget

    try:
        return validate_wait_budget(raw, source="Waiting budget")
    except InvalidRequest as exc:
        raise VolcanoConnectionError(f"Volcano connection {conn_id!r}: {exc}") from None


def parse_connection(conn: Any) -> VolcanoConnectionConfig:
    """Parse an Airflow connection (UI, URI or JSON form) into a :class:`VolcanoConnectionConfig`.

    :param conn: an ``airflow.sdk.Connection`` (or anything with its attributes).
    :raises VolcanoConnectionError: naming the missing or invalid field (never a key).
    """
    conn_id = str(getattr(conn, "conn_id", None) or "<unnamed>")
    api_url = _api_url(conn_id, conn.host, conn.port, conn.schema)
    extra = _extra_dict(conn_id, conn.extra)
    service_key = conn.password or _extra_value(extra, "service_key")
    if not service_key:
        raise VolcanoConnectionError(
            f"Volcano connection {conn_id!r} has no service key: set its Service key field "
            "to the project's service-role key"
        )
    anon_key = _extra_value(extra, "anon_key")
    if anon_key is not None and not isinstance(anon_key, str):
        raise VolcanoConnectionError(f"Volcano connection {conn_id!r}: anon_key must be a string")
    return VolcanoConnectionConfig(
        api_url=api_url,
        service_key=str(service_key),
        anon_key=anon_key,
        timeout=_timeout(conn_id, _extra_value(extra, "timeout")),
        wait_budget=_wait_budget(conn_id, _extra_value(extra, "wait_budget")),
    )


class VolcanoHook(BaseHook):
    """Builds the core Volcano lock clients from an Airflow connection.

    The form's API URL is the connection's ``host``, its Service key the ``password``, its Port the
    optional ``port`` (only needed by Airflow 3.3.2's Test icon, apache/airflow#73298) and, in Extra,
    ``anon_key`` (secret), ``timeout`` (seconds) and ``wait_budget`` (lock requests a minute one
    process may spend waiting). Both keys are masked in task logs.

    :param volcano_conn_id: the connection id (default ``volcano_default``).
    :param timeout: overrides the connection's request timeout, in seconds.
    """

    conn_name_attr = "volcano_conn_id"
    default_conn_name = "volcano_default"
    conn_type = "volcano"
    hook_name = "Volcano"

    def __init__(self, volcano_conn_id: str = default_conn_name, timeout: float | None = None) -> None:
        super().__init__()
        self.volcano_conn_id = volcano_conn_id
        self._timeout_override = None if timeout is None else _timeout(volcano_conn_id, timeout)
        self._config: VolcanoConnectionConfig | None = None  # parsed once, by config or aget_config

    def _finish(self, config: VolcanoConnectionConfig) -> VolcanoConnectionConfig:
        if self._timeout_override is not None:
            config = dataclasses.replace(config, timeout=self._timeout_override)
        self._config = config
        return config

    @property
    def config(self) -> VolcanoConnectionConfig:
        """The parsed connection (fetched and parsed once; keys masked in logs)."""
        if self._config is not None:
            return self._config
        from airflow.sdk.log import mask_secret

        config = parse_connection(self.get_connection(self.volcano_conn_id))
        mask_secret(config.service_key)
        if config.anon_key:
            mask_secret(config.anon_key)
        return self._finish(config)

    async def aget_config(self) -> VolcanoConnectionConfig:
        """Fetch and parse the connection without blocking the event loop (for triggers)."""
        if self._config is not None:
            return self._config
        from airflow_provider_volcano._compat import amask_secret

        config = parse_connection(await self.aget_connection(self.volcano_conn_id))
        await amask_secret(config.service_key)
        if config.anon_key:
            await amask_secret(config.anon_key)
        return self._finish(config)

    # The service key keys every ownership token and group seal: read for them here, and only here.

    def ownership_token(self, owner: TaskIdentity, lock_key: str) -> str:
        """The ownership token of the task try ``owner`` for ``lock_key`` (see ``_tokens.derive_token``)."""
        from airflow_provider_volcano._tokens import derive_token

        return derive_token(self.config.service_key, owner, lock_key)

    def seal_group(self, group: Mapping[str, object]) -> str:
        """The MAC over a lock group's lease facts and owner (see ``_tokens.seal_group``)."""
        from airflow_provider_volcano._tokens import seal_group

        return seal_group(self.config.service_key, group)

    def group_owner(self, group: Mapping[str, object], **run: Any) -> TaskIdentity:
        """The owner of a lock group's XCom once its seal and run are checked (``_tokens.verify_group``).

        :raises ForgedGroup: naming what did not match.
        """
        from airflow_provider_volcano._tokens import verify_group

        return verify_group(self.config.service_key, group, **run)

    def get_conn(self) -> VolcanoLocks:
        """Return a new sync client (same as :meth:`get_client`)."""
        return self.get_client()

    def get_client(self) -> VolcanoLocks:
        """Return a new sync core client (:class:`volcano_locks.VolcanoLocks`); close it after use."""
        from volcano_locks import VolcanoLocks

        c = self.config
        return VolcanoLocks(
            c.api_url, c.anon_key, c.service_key, timeout=c.timeout, wait_budget=c.wait_budget
        )

    def get_async_client(self) -> AsyncVolcanoLocks:
        """Return a new async core client; in async code call :meth:`aget_config` first."""
        from volcano_locks import AsyncVolcanoLocks

        c = self.config
        return AsyncVolcanoLocks(
            c.api_url, c.anon_key, c.service_key, timeout=c.timeout, wait_budget=c.wait_budget
        )

    def test_connection(self) -> tuple[bool, str]:
        """Check that the API URL answers and that the key may manage locks.

        :return: ``(ok, message)``; the message names the reason for a failure.
        """
        try:
            config = self.config
        except VolcanoConnectionError as exc:
            return False, str(exc)
        from volcano_locks import AuthError, ProtocolError, TransportError, VolcanoError

        try:
            with self.get_client() as client:
                client.get(_PROBE_KEY)
        except AuthError as exc:
            if exc.status == 403:
                return False, (
                    f"The key is valid but may not manage locks at {config.api_url} (403): "
                    "use a service-role key with the locks.manage (or '*') permission"
                )
            return False, f"The service key was rejected by {config.api_url} ({exc.status}): check the key"
        except TransportError as exc:
            return False, f"Cannot reach the Volcano API at {config.api_url}: {exc}"
        except ProtocolError as exc:
            return False, f"{config.api_url} does not answer like the Volcano locks API: {exc}"
        except VolcanoError as exc:
            return False, f"The Volcano API at {config.api_url} answered with an error: {exc}"
        return True, f"Connected to {config.api_url}; the key may manage locks"
