"""A raw HTTP client for the server tests: the contract's headers, nothing hidden."""

from __future__ import annotations

import uuid
from typing import Any

import httpx


def new_id() -> str:
    """A fresh UUID string (request ids and ownership tokens)."""
    return str(uuid.uuid4())


class Raw:
    """Speak the wire contract directly with httpx, over one keep-alive connection."""

    def __init__(self, url: str, key: str | None) -> None:
        self.key = key
        self.http = httpx.Client(base_url=url, timeout=10.0)

    def close(self) -> None:
        self.http.close()

    def headers(
        self, token: str | None = None, request_id: str | None = None, key: str | None = None
    ) -> dict[str, str]:
        h = {"X-Volcano-Request-Id": request_id or new_id()}
        bearer = key if key is not None else self.key
        if bearer is not None:
            h["Authorization"] = f"Bearer {bearer}"
        if token is not None:
            h["X-Volcano-Lock-Token"] = token
        return h

    def acquire(self, lock: str, token: str, ttl: Any = 30, **kw: Any) -> httpx.Response:
        return self.http.post(
            f"/locks/{lock}/lease", json={"ttl_seconds": ttl}, headers=self.headers(token, **kw)
        )

    def renew(self, lock: str, token: str, ttl: Any = 30, **kw: Any) -> httpx.Response:
        return self.http.patch(
            f"/locks/{lock}/lease", json={"ttl_seconds": ttl}, headers=self.headers(token, **kw)
        )

    def release(self, lock: str, token: str, **kw: Any) -> httpx.Response:
        return self.http.delete(f"/locks/{lock}/lease", headers=self.headers(token, **kw))

    def get(self, lock: str, **kw: Any) -> httpx.Response:
        return self.http.get(f"/locks/{lock}", headers=self.headers(**kw))

    def force_release(self, lock: str, **kw: Any) -> httpx.Response:
        return self.http.delete(f"/locks/{lock}", headers=self.headers(**kw))


def with_schema(dsn: str, schema: str) -> str:
    """Add the server's `schema=` parameter to a PostgreSQL DSN."""
    return f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"


def drop_schema(dsn: str, schema: str) -> None:
    """Drop a test schema and everything in it."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
