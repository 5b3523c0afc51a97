"""Edge validation of keys, UUID headers and request bodies; every failure is a 400 naming the value."""

from __future__ import annotations

import json
import re

from .errors import ApiError

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_TTL_SECONDS",
    "MIN_TTL_SECONDS",
    "load_json_body",
    "parse_ttl_body",
    "validate_key",
    "validate_request_id",
    "validate_token",
]

MIN_TTL_SECONDS = 5
MAX_TTL_SECONDS = 7_776_000
# Bodies are `{"ttl_seconds": N}`: 64 KiB is orders of magnitude more than any valid request needs.
MAX_BODY_BYTES = 64 * 1024

_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _show(value: str, limit: int = 80) -> str:
    """Quote a caller-supplied value for an error message, shortened so messages stay small."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def validate_key(key: str) -> str:
    """Return `key` if it matches the contract's key pattern, else raise a 400 `invalid_key`."""
    if _KEY_RE.fullmatch(key) is None:
        raise ApiError(
            400,
            "invalid_key",
            f"invalid lock key {_show(key)} ({len(key)} chars): use 1-128 of letters, digits, '.', '_', ':',"
            " '-', starting with a letter or digit",
        )
    return key


def validate_request_id(value: str | None) -> str:
    """Return the X-Volcano-Request-Id value if it is a UUID, else raise a 400 `invalid_request_id`."""
    if value is None:
        raise ApiError(400, "invalid_request_id", "missing X-Volcano-Request-Id header (a UUID)")
    if _UUID_RE.fullmatch(value) is None:
        raise ApiError(400, "invalid_request_id", f"X-Volcano-Request-Id {_show(value, 60)} is not a UUID")
    return value


def validate_token(value: str | None) -> str:
    """Return the X-Volcano-Lock-Token value if it is a UUID, else raise a 400 `invalid_token`.

    The token is a secret, so the message never repeats it.
    """
    if value is None:
        raise ApiError(400, "invalid_token", "missing X-Volcano-Lock-Token header (a UUID)")
    if _UUID_RE.fullmatch(value) is None:
        raise ApiError(
            400, "invalid_token", f"X-Volcano-Lock-Token is not a UUID ({len(value)} chars; value not shown)"
        )
    return value


def load_json_body(body: bytes, code: str = "invalid_body") -> object:
    """Decode a JSON request body strictly (UTF-8, no NaN/Infinity, any depth), else raise a 400 `code`.

    Every JSON body the server reads goes through here: a deeply nested one (100,000 `[` fit in the
    64 KiB body limit) makes the decoder raise RecursionError, which must be the client's 400, not a
    request that dies without an answer.
    """
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except RecursionError:
        raise ApiError(400, code, "body is not valid JSON: nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, code, f"body is not valid JSON: {exc}") from None


def parse_ttl_body(body: bytes) -> int:
    """Parse an acquire/renew body `{"ttl_seconds": N}` strictly and return N, else raise a 400."""
    if not body.strip():
        raise ApiError(400, "invalid_body", 'missing JSON body {"ttl_seconds": N}')
    doc = load_json_body(body)
    if not isinstance(doc, dict):
        raise ApiError(
            400, "invalid_body", f'body must be a JSON object {{"ttl_seconds": N}}, got {type(doc).__name__}'
        )
    unknown = sorted(k for k in doc if k != "ttl_seconds")
    if unknown:
        raise ApiError(400, "invalid_body", f"unknown body field(s) {', '.join(map(_show, unknown))}")
    if "ttl_seconds" not in doc:
        raise ApiError(400, "invalid_ttl", "missing body field 'ttl_seconds'")
    ttl = doc["ttl_seconds"]
    # bool is an int subclass in Python; JSON `true` is not an integer.
    if isinstance(ttl, bool) or not isinstance(ttl, int):
        raise ApiError(
            400,
            "invalid_ttl",
            f"ttl_seconds must be a JSON integer, got {_show(json.dumps(ttl), 40)} ({_json_type(ttl)})",
        )
    if not MIN_TTL_SECONDS <= ttl <= MAX_TTL_SECONDS:
        raise ApiError(
            400,
            "invalid_ttl",
            f"ttl_seconds {ttl} is out of range {MIN_TTL_SECONDS}..{MAX_TTL_SECONDS}",
        )
    return ttl


def _reject_constant(name: str) -> object:
    """Refuse NaN and Infinity, which are not JSON."""
    raise ValueError(f"{name} is not valid JSON")


def _json_type(value: object) -> str:
    """Name the JSON type of a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"
