"""HS256 JWT keys: minting, and verifying a bearer key into the caller's project (401/403 rules)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import jwt

from .clock import Clock, system_clock
from .errors import ApiError

__all__ = ["MIN_SECRET_BYTES", "Authenticator", "Principal", "check_secret", "mint_key"]

MIN_SECRET_BYTES = 32  # RFC 7518 section 3.2: an HS256 key at least as long as the hash output
_ALGORITHMS = ["HS256"]


def check_secret(secret: str) -> str:
    """Return `secret` if it is long enough for HS256, else raise ValueError (never showing it)."""
    if len(secret.encode("utf-8")) < MIN_SECRET_BYTES:
        raise ValueError(
            f"the signing secret must be at least {MIN_SECRET_BYTES} bytes (RFC 7518 3.2);"
            f" got {len(secret.encode('utf-8'))} bytes"
        )
    return secret


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

    def authenticate_admin(self, authorization: str | None) -> Principal:
        """Principal of a full-access service key (no `permissions` claim, or `*`), else 401/403."""
        principal = self.authenticate(authorization)
        token = authorization.strip().partition(" ")[2].strip() if authorization else ""
        permissions = self._verified(token).get("permissions")
        if permissions is not None and "*" not in permissions:
            raise ApiError(403, "forbidden", "the admin endpoints need a full-access service key")
        return principal


def _is_finite_number(value: object) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
