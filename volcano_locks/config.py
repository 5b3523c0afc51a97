"""Client settings from arguments or the environment, checked when the client is built."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import math
import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from volcano_locks.errors import InvalidRequest

__all__ = [
    "ENV_ANON_KEY",
    "ENV_API_URL",
    "ENV_SERVICE_KEY",
    "ClientConfig",
    "api_url_from",
    "resolve_config",
]

ENV_API_URL = "VOLCANO_API_URL"
ENV_ANON_KEY = "VOLCANO_ANON_KEY"
ENV_SERVICE_KEY = "VOLCANO_SERVICE_KEY"


@dataclass(frozen=True)
class ClientConfig:
    """Resolved client settings; keys are hidden from the repr."""

    api_url: str
    service_key: str = field(repr=False)
    anon_key: str | None = field(repr=False)
    timeout: float

    @property
    def credential_id(self) -> str:
        """A one-way fingerprint of the service key, to tell credentials apart without holding them."""
        return hashlib.sha256(self.service_key.encode()).hexdigest()

    @property
    def project(self) -> str:
        """The Volcano project the service key is scoped to: its ``project_id`` claim (public, not secret).

        Locks are scoped to a project, so two projects may use the same lock name; whatever keeps a
        record per lock (Prefect's events and views) keys it by this and the lock name. A key that is
        not a JWT with a string ``project_id`` gives ``key-`` and 12 hex digits of its fingerprint.
        """
        claim = _project_claim(self.service_key)
        return claim if claim is not None else f"key-{self.credential_id[:12]}"


def _project_claim(jwt: str) -> str | None:
    """The ``project_id`` claim of a JWT's payload, read without verifying it (it only names)."""
    parts = jwt.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return None
    project = payload.get("project_id") if isinstance(payload, dict) else None
    return project if isinstance(project, str) and project else None


def api_url_from(typed: str) -> str:
    """The API URL the client uses for one a user typed: the one rule for the core, the Airflow
    connection and the Prefect block (neither orchestrator's form can check a URL's shape).

    Without a scheme (``api.volcano.dev``, ``127.0.0.1:8000``) it gets ``https://``, or ``http://``
    for a loopback host (the local server), as a browser's address bar does; the service key never
    goes in clear text to another machine because a scheme was left out. The trailing ``/`` goes.

    Raises:
        InvalidRequest: Not an http(s) URL with a host, a port out of range, or whitespace inside;
            the message names the value as typed (a URL is not a secret).
    """
    url = typed.strip()
    if url and "://" not in url:
        url = f"{'http' if _loopback(urlsplit(f'//{url}').hostname) else 'https'}://{url}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(ch.isspace() for ch in url):
        raise InvalidRequest(
            f"API URL {typed!r} is not an http(s) URL with a host: expected http(s)://host[:port][/path]"
        )
    try:
        parts.port  # noqa: B018 (urlsplit checks the port only when asked)
    except ValueError:
        raise InvalidRequest(f"API URL {typed!r} has an invalid port (expected 1-65535)") from None
    return url.rstrip("/")


def _loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _setting(value: str | None, env: str) -> str | None:
    if value is None:
        value = os.environ.get(env)
    if value is not None:
        value = value.strip()
    return value or None


def resolve_config(
    api_url: str | None,
    anon_key: str | None,
    service_key: str | None,
    timeout: float,
) -> ClientConfig:
    """Resolve and check the settings; ``None`` falls back to ``VOLCANO_*`` environment variables.

    Raises:
        InvalidRequest: A setting is missing or malformed (the message names it, never a key's value).
    """
    url = _setting(api_url, ENV_API_URL)
    if url is None:
        raise InvalidRequest(f"missing API URL: pass api_url= or set {ENV_API_URL}")
    url = api_url_from(url)
    skey = _setting(service_key, ENV_SERVICE_KEY)
    if skey is None:
        raise InvalidRequest(f"missing service key: pass service_key= or set {ENV_SERVICE_KEY}")
    if any(ch.isspace() for ch in skey):
        raise InvalidRequest("invalid service key: it contains whitespace (value not shown)")
    akey = _setting(anon_key, ENV_ANON_KEY)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise InvalidRequest(f"invalid timeout {timeout!r}: expected a positive number of seconds")
    return ClientConfig(api_url=url, service_key=skey, anon_key=akey, timeout=float(timeout))
