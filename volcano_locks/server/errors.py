"""The server's error type: an HTTP status, a stable machine code and a human message."""

from __future__ import annotations

__all__ = ["ApiError", "StoreUnavailable"]


class ApiError(Exception):
    """A request that ends in a contract error response `{"error": message, "code": code}`."""

    def __init__(
        self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None
    ) -> None:
        """Create an error answered with `status` and the JSON body `{"error", "code"}`."""
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


class StoreUnavailable(Exception):
    """The lock store cannot be reached or failed; lock operations fail closed with 503."""
