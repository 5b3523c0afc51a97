"""The example DAGs' fenced table on SQLite and PostgreSQL: stale writes are refused and recorded."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "dags"))
import volcano_fenced_store as store


@pytest.fixture(params=["sqlite", "postgres"])
def database(request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    db = str(tmp_path / "fenced.sqlite") if request.param == "sqlite" else request.getfixturevalue("pg_dsn")
    monkeypatch.setenv("VOLCANO_EXAMPLES_DB", db)
    return db


def test_newer_tokens_win_and_stale_writes_are_refused(database: str) -> None:
    resource = f"res-{uuid.uuid4().hex}"
    store.fenced_write(resource, "k", 5, "first")
    store.fenced_write(resource, "k", 5, "same lease again")
    store.fenced_write(resource, "k", 9, "newer holder")
    with pytest.raises(store.StaleFencingToken, match="fencing token 5 of lock 'k' is older"):
        store.fenced_write(resource, "k", 5, "stale")
    assert store.read(resource) == (9, "newer holder")
    assert store.history(resource) == [
        (5, "first", True),
        (5, "same lease again", True),
        (9, "newer holder", True),
        (5, "stale", False),
    ]


def test_tokens_of_another_lock_key_never_overwrite(database: str) -> None:
    resource = f"res-{uuid.uuid4().hex}"
    store.fenced_write(resource, "k1", 1, "a")
    with pytest.raises(store.StaleFencingToken):
        store.fenced_write(resource, "k2", 100, "b")
    assert store.read(resource) == (1, "a")
