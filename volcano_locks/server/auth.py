"""HS256 JWT keys: minting, and verifying a bearer key into the caller's project (401/403 rules); the
server's own admin key, which no project's key can stand in for."""

from __future__ import annotations

import functools
import hmac
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import jwt

from .clock import Clock, system_clock
from .errors import ApiError

__all__ = [
    "MIN_ADMIN_KEY_CHARS",
    "MIN_SECRET_BYTES",
    "AdminGate",
    "Authenticator",
    "Principal",
    "check_admin_key",
    "check_secret",
    "mint_key",
    "new_admin_key",
]

MIN_SECRET_BYTES = 32  # RFC 7518 section 3.2: an HS256 key at least as long as the hash output
MIN_ADMIN_KEY_CHARS = 32
_ALGORITHMS = ["HS256"]


def check_secret(secret: str) -> str:
    """Return `secret` if it is long enough for HS256, else raise ValueError (never showing it)."""
    if len(secret.encode("utf-8")) < MIN_SECRET_BYTES:
        raise ValueError(
            f"the signing secret must be at least {MIN_SECRET_BYTES} bytes (RFC 7518 3.2);"
            f" got {len(secret.encode('utf-8'))} bytes"
        )
    return secret


def check_admin_key(key: str) -> str:
    """Return `key` if it can serve as the admin key (>= 32 visible ASCII characters), else ValueError."""
    if len(key) < MIN_ADMIN_KEY_CHARS or not all("!" <= c <= "~" for c in key):
        raise ValueError(
            f"the admin key must be at least {MIN_ADMIN_KEY_CHARS} visible ASCII characters;"
            f" got {len(key)} characters (value not shown)"
        )
    return key


def new_admin_key() -> str:
    """A fresh random admin key (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def mint_key(
    secret: str,
    project: str = "local",
    role: str = "service",
    permissions: Sequence[str] | None = None,
    ttl_seconds: int | None = None,
    *,
    now: float | None = None,
) -> str:
    """Return an HS256 JWT with `project_id`, `role`, `iat`, and optional `permissions` and `exp`."""
    check_secret(secret)
    iat = int(system_clock() if now is None else now)
    claims: dict[str, object] = {"project_id": project, "role": role, "iat": iat}
    if permissions is not None:
        claims["permissions"] = list(permissions)
    if ttl_seconds is not None:
        claims["exp"] = iat + int(ttl_seconds)
    return jwt.encode(claims, secret, algorithm="HS256")


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated service caller: the project its locks are scoped to."""

    project: str
    role: str


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": 'Bearer realm="volcano"'})


class Authenticator:
    """Verify `Authorization: Bearer <jwt>` headers against one secret and the injected clock."""

    def __init__(self, secret: str, clock: Clock = system_clock) -> None:
        """Verify keys signed with `secret`; `exp`/`nbf` are checked against `clock`."""
        self._secret = check_secret(secret)
        self._clock = clock
        # Signature checks dominate a request's CPU time; a verified key's claims never change, so
        # keep them (time-dependent checks still run on every request). Only valid keys get cached.
        self._verified = functools.lru_cache(maxsize=1024)(self._verify_signature)

    def __repr__(self) -> str:
        return "Authenticator(secret=<hidden>)"

    def _verify_signature(self, token: str) -> Mapping[str, Any]:
        claims: dict[str, Any] = jwt.decode(
            token,
            self._secret,
            algorithms=_ALGORITHMS,
            # exp/nbf are checked by the caller against the server's clock, which tests may fake.
            options={"verify_exp": False, "verify_nbf": False, "verify_iat": False, "verify_aud": False},
        )
        return MappingProxyType(claims)

    def authenticate(self, authorization: str | None) -> Principal:
        """Return the caller's principal, or raise 401 (bad credentials) or 403 (not allowed locks)."""
        if not authorization:
            raise _unauthorized("missing Authorization: Bearer <service-role key> header")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise _unauthorized("Authorization header must be 'Bearer <service-role key>'")
        try:
            claims = self._verified(token)
        except jwt.InvalidTokenError as exc:
            raise _unauthorized(f"invalid key ({type(exc).__name__})") from None
        now = self._clock()
        exp = claims.get("exp")
        if exp is not None:
            # JSON numbers such as 1e400 parse as infinity: a key that never expires is not a valid key.
            if not _is_finite_number(exp):
                raise _unauthorized("invalid key (exp claim is not a finite number)")
            if now >= exp:
                raise _unauthorized("key expired")
        nbf = claims.get("nbf")
        if nbf is not None and (not _is_finite_number(nbf) or now < nbf):
            raise _unauthorized("key not yet valid (nbf)")
        project = claims.get("project_id")
        if not isinstance(project, str) or not project:
            raise _unauthorized("invalid key (no project_id claim)")
        role = claims.get("role")
        if role != "service":
            raise ApiError(
                403,
                "forbidden",
                f"role {role!r} cannot manage locks; lock calls need a service-role key",
            )
        permissions = claims.get("permissions")
        if permissions is not None:
            if not isinstance(permissions, list) or not all(isinstance(p, str) for p in permissions):
                raise _unauthorized("invalid key (permissions claim is not a list of strings)")
            if "locks.manage" not in permissions and "*" not in permissions:
                raise ApiError(403, "forbidden", "this service key lacks the 'locks.manage' permission")
        return Principal(project=project, role=role)

    def signed_here(self, authorization: str | None) -> bool:
        """Whether the bearer key was signed with this server's secret (whatever its claims say)."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        try:
            self._verified(token.strip())
        except jwt.InvalidTokenError:
            return False
        return scheme.lower() == "bearer"


class AdminGate:
    """The admin endpoints' door: `Authorization: Bearer <admin key>`, the server's own credential.

    A project's key, even a full-access one, is refused: it speaks for one project, and the admin
    endpoints (the request log of every project, server-wide faults) belong to whoever runs the server.
    """

    def __init__(self, admin_key: str, authenticator: Authenticator) -> None:
        """Open for `admin_key` only; `authenticator` tells a project's key (403) from a bad one (401)."""
        self._key = check_admin_key(admin_key).encode("ascii")
        self._authenticator = authenticator

    def __repr__(self) -> str:
        return "AdminGate(admin_key=<hidden>)"

    def check(self, authorization: str | None) -> None:
        """Pass the admin key; raise 401 for no key or a bad one, 403 for a project's key."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        given = token.strip().encode("utf-8", "replace")
        if scheme.lower() == "bearer" and hmac.compare_digest(given, self._key):
            return
        if self._authenticator.signed_here(authorization):
            raise ApiError(
                403,
                "forbidden",
                "the admin endpoints need this server's admin key ($VOLCANO_ADMIN_KEY, printed at start),"
                " not a project's key",
            )
        raise _unauthorized("the admin endpoints need 'Authorization: Bearer <the server's admin key>'")


def _is_finite_number(value: object) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
