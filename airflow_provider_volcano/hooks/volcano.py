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
from airflow.sdk.log import mask_secret

from airflow_provider_volcano._compat import amask_secret
from airflow_provider_volcano._tokens import derive_token
from airflow_provider_volcano.records.seal import Keyring
from volcano_locks import (
    AsyncVolcanoLocks,
    AuthError,
    InvalidRequest,
    ProtocolError,
    TransportError,
    VolcanoError,
    VolcanoLocks,
)
from volcano_locks.integration import api_url_from, validate_wait_budget

if TYPE_CHECKING:
    from airflow_provider_volcano._tokens import TaskIdentity
    from airflow_provider_volcano.records.seal import SealKey
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
    :param previous_service_keys: service keys whose seals are still honoured during a rotation
        (never in repr); tokens of leases sealed under one are derived with it.
    """

    api_url: str
    service_key: str = field(repr=False)
    anon_key: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT
    wait_budget: int | None = None
    previous_service_keys: tuple[str, ...] = field(default=(), repr=False)


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
    try:
        url = api_url_from(host)  # the core's rule: a scheme-less host gets https (http on loopback)
    except InvalidRequest as exc:
        raise VolcanoConnectionError(f"Volcano connection {conn_id!r}: {exc}") from None
    parts = urlsplit(url)
    url_port = parts.port
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

    try:
        return validate_wait_budget(raw, source="Waiting budget")
    except InvalidRequest as exc:
        raise VolcanoConnectionError(f"Volcano connection {conn_id!r}: {exc}") from None


def _previous_keys(conn_id: str, raw: Any) -> tuple[str, ...]:
    """The ``previous_service_keys`` extra: a JSON list of keys, or keys separated by commas or spaces.

    Errors name the position and the type found, never a key.
    """
    if raw is None or raw == "" or raw == []:
        return ()
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("["):
            try:
                raw = json.loads(text)
            except json.JSONDecodeError as exc:
                raise VolcanoConnectionError(
                    f"Volcano connection {conn_id!r}: previous_service_keys is not a valid JSON list "
                    f"({exc.msg} at {exc.pos})"
                ) from None
        else:
            raw = [part for part in text.replace(",", " ").split() if part]
    if not isinstance(raw, list):
        raise VolcanoConnectionError(
            f"Volcano connection {conn_id!r}: previous_service_keys must be a list of service keys, "
            f"got {type(raw).__name__}"
        )
    for index, key in enumerate(raw):
        if not isinstance(key, str) or not key.strip():
            raise VolcanoConnectionError(
                f"Volcano connection {conn_id!r}: previous_service_keys[{index}] must be a non-empty "
                f"string (a service key), got {type(key).__name__}"
            )
    return tuple(dict.fromkeys(key.strip() for key in raw))


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
        previous_service_keys=_previous_keys(conn_id, _extra_value(extra, "previous_service_keys")),
    )


class VolcanoHook(BaseHook):
    """Builds the core Volcano lock clients from an Airflow connection.

    The form's API URL is the connection's ``host``, its Service key the ``password``, its Port the
    optional ``port`` (only needed by Airflow 3.3.2's Test icon, apache/airflow#73298) and, in Extra,
    ``anon_key`` (secret), ``timeout`` (seconds), ``wait_budget`` (lock requests a minute one
    process may spend waiting) and ``previous_service_keys`` (secret: the keys still honoured for
    records sealed before a rotation). Every key is masked in task logs.

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

        config = parse_connection(self.get_connection(self.volcano_conn_id))
        for secret in (config.service_key, config.anon_key, *config.previous_service_keys):
            if secret:
                mask_secret(secret)
        return self._finish(config)

    async def aget_config(self) -> VolcanoConnectionConfig:
        """Fetch and parse the connection without blocking the event loop (for triggers)."""
        if self._config is not None:
            return self._config

        config = parse_connection(await self.aget_connection(self.volcano_conn_id))
        for secret in (config.service_key, config.anon_key, *config.previous_service_keys):
            if secret:
                await amask_secret(secret)
        return self._finish(config)

    # The service key keys every ownership token and record seal: read for them here, and only here.

    @property
    def keyring(self) -> Keyring:
        """The keys records are sealed under and opened with (the service key, then previous ones)."""
        c = self.config
        return Keyring.of(c.service_key, c.previous_service_keys)

    def ownership_token(self, owner: TaskIdentity, lock_key: str, key: SealKey | None = None) -> str:
        """The ownership token of the task try ``owner`` for ``lock_key`` (see ``_tokens.derive_token``).

        :param key: the key to derive it with: the one that sealed the record naming ``owner``
            (``Opened.key`` in ``airflow_provider_volcano.records``), so a lease acquired before a
            rotation keeps its token; default the current service key.
        """
        return derive_token(self.config.service_key if key is None else key.secret, owner, lock_key)

    def get_conn(self) -> VolcanoLocks:
        """Return a new sync client (same as :meth:`get_client`)."""
        return self.get_client()

    def get_client(self) -> VolcanoLocks:
        """Return a new sync core client (:class:`volcano_locks.VolcanoLocks`); close it after use."""
        c = self.config
        return VolcanoLocks(
            c.api_url, c.anon_key, c.service_key, timeout=c.timeout, wait_budget=c.wait_budget
        )

    def get_async_client(self) -> AsyncVolcanoLocks:
        """Return a new async core client; in async code call :meth:`aget_config` first."""
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
