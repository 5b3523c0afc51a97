"""`volcano-locks get / force-release / quota` against the real local server, run as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.helpers import run_cli
from volcano_locks import LockLease, VolcanoLocks
from volcano_locks.server.auth import mint_key
from volcano_locks.server.harness import LocalServer


@pytest.fixture
def held(volcano_client: VolcanoLocks, unique_key: str) -> Iterator[LockLease]:
    """``unique_key`` held by ``volcano_client`` (TTL 60 s) for the test; released after, unless freed."""
    lease = volcano_client.acquire(unique_key, 60)
    yield lease
    state = volcano_client.get(unique_key)
    if state.held and state.fencing_token == lease.fencing_token:
        volcano_client.release(unique_key, lease)


def assert_no_secret(result: subprocess.CompletedProcess[str], *secrets: str) -> None:
    for secret in secrets:
        assert secret not in result.stdout and secret not in result.stderr


def test_get_free_lock(volcano_server: LocalServer, unique_key: str) -> None:
    result = run_cli("get", unique_key, env=volcano_server.env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{unique_key}: free (an acquire would succeed now)"


def test_get_held_lock_shows_token_and_countdown(
    volcano_server: LocalServer, held: LockLease, unique_key: str
) -> None:
    result = run_cli("get", unique_key, env=volcano_server.env())
    assert result.returncode == 0, result.stderr
    assert f"{unique_key}: held" in result.stdout
    assert f"fencing token  {held.fencing_token}" in result.stdout
    assert "(in " in result.stdout and " s)" in result.stdout
    assert_no_secret(result, held.token, volcano_server.service_key)

    as_json = run_cli("get", unique_key, "--json", env=volcano_server.env())
    body = json.loads(as_json.stdout)
    assert body["held"] is True and body["fencing_token"] == held.fencing_token
    assert body["key"] == unique_key and body["expires_at"].startswith(str(held.expires_at.year))


def test_force_release_with_yes_frees_the_lock_and_warns(
    volcano_server: LocalServer, volcano_client: VolcanoLocks, held: LockLease, unique_key: str
) -> None:
    result = run_cli("force-release", unique_key, "--yes", env=volcano_server.env())
    assert result.returncode == 0, result.stderr
    assert "fencing tokens" in result.stderr  # the safety warning is always printed
    assert volcano_client.get(unique_key).held is False
    assert_no_secret(result, held.token, volcano_server.service_key)


@pytest.mark.usefixtures("held")
def test_force_release_without_terminal_or_yes_changes_nothing(
    volcano_server: LocalServer, volcano_client: VolcanoLocks, unique_key: str
) -> None:
    result = run_cli("force-release", unique_key, env=volcano_server.env())
    assert result.returncode == 1
    assert "--yes" in result.stderr
    assert volcano_client.get(unique_key).held is True


@pytest.mark.usefixtures("held")
@pytest.mark.parametrize(("answer", "released"), [("wrong-key", False), (None, True)])
def test_force_release_confirmation_on_a_terminal(
    volcano_server: LocalServer,
    volcano_client: VolcanoLocks,
    unique_key: str,
    answer: str | None,
    released: bool,
) -> None:
    master, slave = os.openpty()
    try:
        os.write(master, f"{answer or unique_key}\n".encode())
        result = run_cli("force-release", unique_key, env=volcano_server.env(), stdin_fd=slave)
        assert result.returncode == (0 if released else 1), result.stderr
        assert volcano_client.get(unique_key).held is not released
    finally:
        os.close(master)
        os.close(slave)


def test_missing_settings_are_usage_errors(volcano_server: LocalServer) -> None:
    no_url = run_cli("get", "k", env={"VOLCANO_SERVICE_KEY": volcano_server.service_key})
    assert no_url.returncode == 2 and "VOLCANO_API_URL" in no_url.stderr
    no_key = run_cli("get", "k", env={"VOLCANO_API_URL": volcano_server.url})
    assert no_key.returncode == 2 and "VOLCANO_SERVICE_KEY" in no_key.stderr


def test_bad_url_and_bad_lock_key_are_usage_errors(volcano_server: LocalServer) -> None:
    # (a URL without a scheme is taken as https, or http on loopback: the core's rule, tests/core)
    bad_url = run_cli("get", "k", env={**volcano_server.env(), "VOLCANO_API_URL": "ftp://not-a-url"})
    assert bad_url.returncode == 2 and "ftp://not-a-url" in bad_url.stderr
    bad_key = run_cli("get", "a/b", env=volcano_server.env())
    assert bad_key.returncode == 2 and "a/b" in bad_key.stderr


def test_unreachable_server(volcano_server: LocalServer, tmp_path: Path) -> None:
    with LocalServer(db=str(tmp_path / "gone.sqlite3")) as gone:
        env = gone.env()
    result = run_cli("get", "k", "--timeout", "2", env=env)
    assert result.returncode == 4
    assert "no response" in result.stderr


def test_refused_keys(volcano_server: LocalServer) -> None:
    anon = run_cli("get", "k", env={**volcano_server.env(), "VOLCANO_SERVICE_KEY": volcano_server.anon_key})
    assert anon.returncode == 3 and "403" in anon.stderr
    forged = mint_key("a-different-secret-of-at-least-32-bytes", "local", "service", None, None)
    bad = run_cli("get", "k", env={**volcano_server.env(), "VOLCANO_SERVICE_KEY": forged})
    assert bad.returncode == 3 and "401" in bad.stderr
    assert_no_secret(bad, forged)


def test_rate_limited(tmp_path: Path) -> None:
    # Quota 1 a minute: of three calls at least two share a clock minute, so one must be refused.
    with LocalServer(db=str(tmp_path / "quota.sqlite3"), quota=1) as small:
        results = [run_cli("get", "k", env=small.env()) for _ in range(3)]
    assert results[0].returncode == 0, results[0].stderr
    refused = [r for r in results if r.returncode != 0]
    assert refused, "a quota of 1 a minute let three requests through"
    result = refused[0]
    assert result.returncode == 5
    assert "429" in result.stderr and "retry after" in result.stderr


def test_quota_table_matches_the_contract() -> None:
    result = run_cli("quota", "--holders", "150", env={})
    assert result.returncode == 0
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert rows == ["| 10 | 18.00 | 33 |", "| 30 | 6.00 | 100 |", "| 60 | 3.00 | 200 |"]
    assert "150 holders need a TTL of at least 45 s" in result.stdout


def test_quota_rejects_bad_numbers() -> None:
    result = run_cli("quota", "--ttl", "4", env={})
    assert result.returncode == 2 and "4" in result.stderr
    result = run_cli("quota", "--reserve", "600", env={})
    assert result.returncode == 2 and "reserve" in result.stderr


def test_quota_budgets_for_waiting_processes() -> None:
    result = run_cli("quota", "--waiters", "50", "--holders", "100", env={})
    assert result.returncode == 0, result.stderr
    # 50 waiting processes on one key each settle at one look per 20 s: 150 requests a minute.
    assert "150 kept in reserve (150 for 50 waiting process(es) on 1 key(s) each)" in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert rows == ["| 10 | 18.00 | 25 |", "| 30 | 6.00 | 75 |", "| 60 | 3.00 | 150 |"]
    assert "100 holders need a TTL of at least 40 s" in result.stdout
    many_keys = run_cli("quota", "--waiters", "2", "--keys-per-waiter", "1000", env={})
    assert "240 kept in reserve" in many_keys.stdout  # each capped at its waiting budget (120)


def test_quota_checks_holders_before_printing() -> None:
    result = run_cli("quota", "--holders", "0", env={})
    assert result.returncode == 2 and "--holders must be at least 1" in result.stderr
    assert result.stdout == ""
