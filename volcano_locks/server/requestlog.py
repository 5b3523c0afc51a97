"""A bounded in-memory record of recent lock requests (served by the admin endpoint to tests), optionally
also appended to a file as JSON lines (`serve --history FILE`), one flushed line per request, so that a
model checker can read every request a server answered even after the server was killed with SIGKILL.

An entry never holds a secret: the ownership token only as the first 12 hex digits of its SHA-256.
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from typing import IO, Any

__all__ = ["RequestLog"]


class RequestLog:
    """The last `maxlen` requests as dicts (method, path, op, status, request_id, token_sha256, ...)."""

    def __init__(self, maxlen: int = 10_000, history: str | None = None) -> None:
        """Keep at most `maxlen` entries, dropping the oldest; append every entry to `history` if given."""
        self._entries: deque[dict[str, Any]] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self._seq = 0
        self._pid = os.getpid()
        self._file: IO[str] | None = None
        if history is not None:
            fd = os.open(history, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._file = os.fdopen(fd, "a", encoding="utf-8")

    def add(self, entry: dict[str, Any]) -> None:
        """Append one entry, numbering it (and write it to the history file, flushed to the kernel)."""
        with self._lock:
            self._seq += 1
            entry["seq"] = self._seq
            self._entries.append(entry)
            if self._file is not None:
                self._file.write(json.dumps({**entry, "pid": self._pid}, separators=(",", ":")) + "\n")
                self._file.flush()

    def note(self, record: dict[str, Any]) -> None:
        """Write a record that is not a request (a clock change) to the history file only."""
        with self._lock:
            if self._file is not None:
                self._file.write(json.dumps({**record, "pid": self._pid}, separators=(",", ":")) + "\n")
                self._file.flush()

    def entries(self) -> list[dict[str, Any]]:
        """Return a copy of the entries, oldest first."""
        with self._lock:
            return [dict(e) for e in self._entries]

    def clear(self) -> None:
        """Forget every entry (numbering continues; the history file keeps what it has)."""
        with self._lock:
            self._entries.clear()

    def close(self) -> None:
        """Close the history file."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
