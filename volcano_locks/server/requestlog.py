"""A bounded in-memory record of recent lock requests, served by the admin endpoint to tests."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

__all__ = ["RequestLog"]


class RequestLog:
    """The last `maxlen` requests as dicts (method, path, op, status, request_id, token_sha256, ...)."""

    def __init__(self, maxlen: int = 10_000) -> None:
        """Keep at most `maxlen` entries, dropping the oldest."""
        self._entries: deque[dict[str, Any]] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self._seq = 0

    def add(self, entry: dict[str, Any]) -> None:
        """Append one entry, numbering it."""
        with self._lock:
            self._seq += 1
            entry["seq"] = self._seq
            self._entries.append(entry)

    def entries(self) -> list[dict[str, Any]]:
        """Return a copy of the entries, oldest first."""
        with self._lock:
            return [dict(e) for e in self._entries]

    def clear(self) -> None:
        """Forget every entry (numbering continues)."""
        with self._lock:
            self._entries.clear()
