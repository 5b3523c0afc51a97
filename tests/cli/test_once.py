"""``volcano-locks once list | show | forget`` on real ledgers (SQLite, PostgreSQL, moto's S3)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fencing.s3_server import MotoServer
from volcano_locks.cli import main
from volcano_locks.fencing import Fence, FencedS3Prefix
from volcano_locks.once import S3Ledger, SQLLedger, Who

from .helpers import run_cli

WHO = Who.of("airflow", dag_id="rollup", run_id="manual__1", task_id="load", try_number=2)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def ledger_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, SQLLedger]]:
    """(URL, table, ledger) with two keys done."""
    postgres = request.param == "postgresql"
    url = request.getfixturevalue("pg_sqlalchemy_url") if postgres else f"sqlite:///{tmp_path / 'w.sqlite3'}"
    table = f"once_{uuid.uuid4().hex[:8]}"
    ledger = SQLLedger(sa.create_engine(url), table=table)
    for day, token in (("rollup:2026-12-01", 3), ("rollup:2026-12-02", 4), ("other:1", 5)):
        with ledger.begin(day, Fence("rollup-lock", token), who=WHO) as effect:
            effect.result = {"rows": token}
    yield url, table, ledger
    with ledger.fenced.engine.begin() as conn:
        for t in (ledger.tables.ledger, ledger.tables.audit, ledger.fenced.table):
            t.drop(conn, checkfirst=True)
    ledger.fenced.engine.dispose()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["once", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_list_show_forget_on_sql(
    ledger_db: tuple[str, str, SQLLedger], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, table, ledger = ledger_db
    monkeypatch.setenv("VOLCANO_ONCE_DB", url)  # the URL stays out of argv
    code, out, _ = _cli(capsys, "list", "--table", table, "--prefix", "rollup:", "--json")
    assert code == 0 and [r["business_key"] for r in json.loads(out)] == [
        "rollup:2026-12-02",
        "rollup:2026-12-01",
    ]
    code, out, _ = _cli(capsys, "show", "rollup:2026-12-01", "--table", table)
    assert code == 0 and "dag_id=rollup" in out and "try_number=2" in out and 'result: {"rows": 3}' in out
    code, out, _ = _cli(
        capsys, "forget", "rollup:2026-12-01", "--table", table, "--by", "ana", "--why", "fixed"
    )
    assert code == 0 and "forgot:" in out
    assert ledger.lookup("rollup:2026-12-01") is None
    (entry,) = ledger.audit("rollup:2026-12-01")
    assert (entry.by, entry.why) == ("ana", "fixed")
    code, out, _ = _cli(capsys, "show", "rollup:2026-12-01", "--table", table)
    assert code == 1 and "no record" in out and "forgotten" in out and "by ana: fixed" in out
    code, _, err = _cli(
        capsys, "forget", "rollup:2026-12-01", "--table", table, "--by", "ana", "--why", "again"
    )
    assert code == 1 and "nothing audited" in err
    assert len(ledger.audit("rollup:2026-12-01")) == 1


def test_bad_input_names_the_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'w.sqlite3'}"
    code, _, err = _cli(capsys, "show", " padded", "--db", db)
    assert code == 2 and "' padded'" in err
    code, _, err = _cli(capsys, "list", "--db", db, "--limit", "0")
    assert code == 2 and "limit" in err and "0" in err
    code, _, err = _cli(capsys, "list", "--db", db, "--table", "x; drop")
    assert code == 2 and "'x; drop'" in err
    code, _, err = _cli(capsys, "list", "--db", "not a url")
    assert code == 2 and "--db must be a SQLAlchemy URL" in err
    code, _, err = _cli(capsys, "list", "--db", "nosuchdialect://u:hunter2@h/db")
    assert code == 2 and "nosuchdialect://u:***@h/db" in err and "hunter2" not in err
    code, _, err = _cli(capsys, "list", "--s3", "bucket-only")
    assert code == 2 and "'bucket-only'" in err
    code, _, err = _cli(capsys, "forget", "k", "--db", db, "--by", "ana", "--why", " ")
    assert code == 2 and "'why'" in err


def test_no_ledger_given_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VOLCANO_ONCE_DB", raising=False)
    code, _, err = _cli(capsys, "list")
    assert code == 2 and "--db URL" in err


def test_an_unreachable_database_exits_4(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "list", "--db", "postgresql+psycopg://nobody:pw@127.0.0.1:1/none")
    assert code == 4 and "could not be reached" in err and "pw" not in err


def test_list_show_forget_on_s3(
    s3_server: MotoServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.fencing.s3_server import CREDENTIALS

    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    bucket = s3_server.bucket()
    prefix = f"marts/{uuid.uuid4().hex[:6]}"
    ledger = S3Ledger(FencedS3Prefix(s3_server.client(), bucket, prefix))
    ledger.publish("day-1", Fence("lake", 1), {"a": b"1"}, who=WHO, result=[1])
    where = ["--s3", f"s3://{bucket}/{prefix}", "--endpoint-url", s3_server.url]
    code, out, _ = _cli(capsys, "list", *where, "--json")
    assert code == 0 and json.loads(out)[0]["result"] == [1]
    code, out, _ = _cli(capsys, "forget", "day-1", *where, "--by", "ops", "--why", "re-run")
    assert code == 0 and ledger.lookup("day-1") is None
    code, out, _ = _cli(capsys, "show", "day-1", *where, "--json")
    body: dict[str, Any] = json.loads(out)
    assert code == 1 and body["record"] is None and body["audit"][0]["by"] == "ops"


def test_the_installed_command_runs_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'w.sqlite3'}"
    ledger = SQLLedger(sa.create_engine(url))
    with ledger.begin("k", Fence("lock", 1), who=WHO):
        pass
    ledger.fenced.engine.dispose()
    done = run_cli("once", "show", "k", "--json", env={"VOLCANO_ONCE_DB": url})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["record"]["who"]["orchestrator"] == "airflow"
