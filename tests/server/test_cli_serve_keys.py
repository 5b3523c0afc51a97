"""`volcano-locks serve` / `keys`: defaults, printed keys, clean stops, and nothing secret in logs or db."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import jwt
import pytest

from tests.cli.helpers import CLI, cli_env, run_cli
from volcano_locks.cli import build_parser
from volcano_locks.server.harness import LocalServer, printed_variables

from .helpers import Raw, new_id

SECRET = "s" * 40


def claims(key: str) -> dict[str, object]:
    return dict(jwt.decode(key, SECRET, algorithms=["HS256"]))


def test_parser_has_serve_and_keys_subcommands() -> None:
    parser = build_parser()
    assert parser.parse_args(["serve"]).command == "serve"
    assert parser.parse_args(["keys", "--project", "p"]).project == "p"
    with pytest.raises(SystemExit):
        parser.parse_args([])


def test_keys_formats() -> None:
    plain = run_cli("keys", "--secret", SECRET, "--project", "proj")
    assert plain.returncode == 0, plain.stderr
    assert len(plain.stdout.splitlines()) == 1
    assert claims(plain.stdout.strip())["role"] == "service"
    assert claims(plain.stdout.strip())["project_id"] == "proj"
    assert "permissions" not in claims(plain.stdout.strip())

    anon = run_cli("keys", "--secret", SECRET, "--role", "anon").stdout.strip()
    assert claims(anon)["role"] == "anon" and claims(anon)["project_id"] == "local"

    env = run_cli("keys", "--secret", SECRET, "--format", "env", "--permissions", "locks.manage,storage.read")
    lines = dict(line.split("=", 1) for line in env.stdout.splitlines())
    assert set(lines) == {"VOLCANO_ANON_KEY", "VOLCANO_SERVICE_KEY"}
    assert claims(lines["VOLCANO_SERVICE_KEY"])["permissions"] == ["locks.manage", "storage.read"]

    doc = json.loads(run_cli("keys", "--secret", SECRET, "--format", "json", "--expires-in", "60").stdout)
    service = claims(doc["service_key"])
    assert doc["project_id"] == "local" and service["exp"] == service["iat"] + 60  # type: ignore[operator]


def test_keys_refuses_short_or_missing_secret(tmp_path: Path) -> None:
    short = run_cli("keys", "--secret", "short")
    assert short.returncode == 2 and "at least 32 bytes" in short.stderr and "short" not in short.stderr
    missing = run_cli("keys", env={"XDG_DATA_HOME": str(tmp_path)})  # and no VOLCANO_LOCAL_SECRET
    assert missing.returncode == 2 and "no --secret" in missing.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_defaults_print_keys_and_stop_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    env = cli_env({"XDG_DATA_HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"})  # no VOLCANO_LOCAL_SECRET
    keys_seen: list[str] = []
    for _ in range(2):  # the second start finds the kept secret: keys from the first still work
        with subprocess.Popen(
            [*CLI, "serve", "--port", "0"], stdout=subprocess.PIPE, text=True, env=env
        ) as proc:
            assert proc.stdout is not None
            printed: dict[str, str] = {}
            for line in proc.stdout:
                if line.strip() == "ready":
                    break
                printed.update(printed_variables(line))
            assert set(printed) == {"VOLCANO_API_URL", "VOLCANO_ANON_KEY", "VOLCANO_SERVICE_KEY"}
            keys_seen.append(printed["VOLCANO_SERVICE_KEY"])
            for key in keys_seen:
                raw = Raw(printed["VOLCANO_API_URL"], key)
                assert raw.get("job").status_code == 200
                raw.close()
            anon = Raw(printed["VOLCANO_API_URL"], printed["VOLCANO_ANON_KEY"])
            assert anon.get("job").status_code == 403
            anon.close()
            proc.send_signal(sig)
            assert proc.wait(timeout=15) == 0
            assert "stopped" in proc.stdout.read()
    data_dir = tmp_path / "volcano-locks"
    assert (data_dir / "locks.sqlite3").exists()
    secret_file = data_dir / "locks.sqlite3.secret"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600


def test_serve_refuses_unreachable_postgres() -> None:
    started = time.monotonic()
    r = run_cli("serve", "--port", "0", "--secret", SECRET, "--db", "postgresql://nobody@127.0.0.1:1/none")
    assert r.returncode == 2 and "PostgreSQL" in r.stderr
    assert time.monotonic() - started < 30


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "volcano-locks"
    r = subprocess.run([str(script), "keys", "--secret", SECRET], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and claims(r.stdout.strip())["role"] == "service"


def test_logs_and_database_hold_no_secrets() -> None:
    with LocalServer(admin=True) as srv:
        raw = Raw(srv.url, srv.service_key)
        token, rid = new_id(), new_id()
        raw.acquire("secret-check", token, request_id=rid)
        raw.renew("secret-check", token)
        raw.acquire("secret-check", "not-a-uuid-but-maybe-secret")
        raw.release("secret-check", token)
        raw.close()
        srv.stop()
        log = srv.stderr()
        lines = [line for line in log.splitlines() if "/locks/secret-check" in line]
        assert len(lines) == 4
        assert f"POST /locks/secret-check/lease 201 request_id={rid}" in lines[0]
        for secret in (srv.service_key, srv.admin_key, srv.secret, token, "not-a-uuid-but-maybe-secret"):
            assert secret not in log
        stored = b"".join(p.read_bytes() for p in Path(srv.db).parent.glob("locks.sqlite3*"))
        assert token.encode() not in stored and srv.secret.encode() not in stored
        srv.close()
