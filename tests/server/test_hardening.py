"""Credentials and private files: admin needs the server's admin key, secrets and databases are the owner's,
ambiguous headers and never-expiring keys are refused, PostgreSQL connections stay within the pool."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg import sql

from volcano_locks.server.harness import InProcessServer, LocalServer, printed_variables
from volcano_locks.server.runner import load_or_create_secret

from .helpers import Raw, drop_schema, exchange, new_id, serve_until_exit, with_schema

HANG_BOUND = 20.0
SERVE = [sys.executable, "-m", "volcano_locks", "serve", "--port", "0"]


@pytest.fixture
def admin_srv() -> Iterator[InProcessServer]:
    with InProcessServer(admin=True) as srv:
        yield srv


# --- admin endpoints -------------------------------------------------------------------------------


ADMIN_CALLS = [
    ("GET", "/__admin/faults", None),
    ("PUT", "/__admin/faults", {"faults": "drop"}),
    ("GET", "/__admin/requests", None),
    ("DELETE", "/__admin/requests", None),
]


def test_admin_takes_the_servers_admin_key_and_no_projects_key(admin_srv: InProcessServer) -> None:
    other = InProcessServer(admin=True)  # another server: its keys and its admin key are not this one's
    refused = {
        None: 401,
        "Bearer not-a-jwt": 401,
        f"Bearer {other.service_key}": 401,
        f"Bearer {other.admin_key}": 401,
        f"Bearer {admin_srv.admin_key}x": 401,
        f"Basic {admin_srv.admin_key}": 401,
        # Keys of this server speak for one project, however much they may do there: 403.
        f"Bearer {admin_srv.service_key}": 403,
        f"Bearer {admin_srv.mint_key(permissions=['*'])}": 403,
        f"Bearer {admin_srv.mint_key(project='elsewhere')}": 403,
        f"Bearer {admin_srv.mint_key(permissions=['locks.manage'])}": 403,
        f"Bearer {admin_srv.anon_key}": 403,
    }
    other.close()
    for auth, status in refused.items():
        headers = {} if auth is None else {"Authorization": auth}
        for method, path, body in ADMIN_CALLS:
            r = httpx.request(method, admin_srv.url + path, json=body, headers=headers)
            assert r.status_code == status, (auth, method, path, r.text)
            assert r.json()["code"] == ("unauthorized" if status == 401 else "forbidden")
            assert admin_srv.admin_key not in r.text
    assert admin_srv.faults() == ""  # no refused PUT changed anything
    r = httpx.get(
        admin_srv.url + "/__admin/faults", headers={"Authorization": f"Bearer {admin_srv.admin_key}"}
    )
    assert r.status_code == 200 and r.json() == {"faults": ""}


def test_a_projects_full_key_cannot_read_another_projects_requests(admin_srv: InProcessServer) -> None:
    theirs = Raw(admin_srv.url, admin_srv.mint_key(project="theirs"))
    assert theirs.acquire("payroll", new_id()).status_code == 201
    theirs.close()
    mine = {"Authorization": f"Bearer {admin_srv.mint_key(project='mine')}"}
    r = httpx.get(admin_srv.url + "/__admin/requests", headers=mine)
    assert r.status_code == 403 and "payroll" not in r.text
    assert [e["path"] for e in admin_srv.requests()] == ["/locks/payroll/lease"]  # the harness's admin key


def test_serve_prints_the_admin_key_and_takes_one_from_the_env_or_the_flag(tmp_path: Path) -> None:
    chosen = "a" * 40
    for how in ("generated", "env", "flag"):
        env = {**os.environ, "VOLCANO_LOCAL_SECRET": "s" * 40, "PYTHONUNBUFFERED": "1"}
        env.pop("VOLCANO_LOCAL_ADMIN_KEY", None)
        args = [*SERVE, "--db", str(tmp_path / f"{how}.sqlite3"), "--admin"]
        if how == "env":
            env["VOLCANO_LOCAL_ADMIN_KEY"] = chosen
        elif how == "flag":
            args += ["--admin-key", chosen]
        with subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env) as proc:
            assert proc.stdout is not None
            printed = {}
            for line in proc.stdout:
                if line.strip() == "ready":
                    break
                printed.update(printed_variables(line))
            admin_key = printed["VOLCANO_ADMIN_KEY"]
            assert len(admin_key) >= 32 and (admin_key == chosen) == (how != "generated")
            url = printed["VOLCANO_API_URL"]
            for key, status in ((admin_key, 200), (printed["VOLCANO_SERVICE_KEY"], 403)):
                r = httpx.get(url + "/__admin/faults", headers={"Authorization": f"Bearer {key}"})
                assert r.status_code == status, r.text
            proc.terminate()
            proc.wait(HANG_BOUND)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--admin-key", "a" * 40], {}, "--admin-key needs --admin"),
        (["--admin", "--admin-key", "short-admin-key"], {}, "at least 32 visible ASCII characters"),
        (["--admin"], {"VOLCANO_LOCAL_ADMIN_KEY": "short-admin-key"}, "at least 32 visible ASCII characters"),
    ],
)
def test_a_bad_admin_key_is_a_usage_error_that_does_not_show_it(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    done = serve_until_exit(tmp_path, *args, env={"VOLCANO_LOCAL_SECRET": "s" * 40, **env})
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "short-admin-key" not in done.stderr + done.stdout


def test_admin_on_a_non_loopback_host_warns() -> None:
    with LocalServer(admin=True, host="0.0.0.0") as srv:
        srv.set_faults(None)  # the harness still reaches its admin endpoints
        assert "--admin on 0.0.0.0, which is not a loopback address" in srv.stderr()
    with LocalServer(admin=True) as srv:
        assert "not a loopback address" not in srv.stderr()


# --- secrets and database files ---------------------------------------------------------------------


def _serve(db: Path, env_extra: dict[str, str] | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "VOLCANO_LOCAL_SECRET"}
    env.update(env_extra or {})
    return subprocess.Popen(
        [*SERVE, "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_database_and_secret_are_created_private(tmp_path: Path) -> None:
    db = tmp_path / "data" / "locks.sqlite3"
    proc = _serve(db)
    try:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + HANG_BOUND
        while "ready" not in lines and time.monotonic() < deadline:
            lines.append(proc.stdout.readline().strip())
        printed = printed_variables("\n".join(lines))
        url, key = printed["VOLCANO_API_URL"], printed["VOLCANO_SERVICE_KEY"]
        raw = Raw(url, key)
        assert raw.acquire("job", new_id()).status_code == 201
        raw.close()
        for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm"), Path(f"{db}.secret")):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    finally:
        proc.terminate()
        proc.communicate(timeout=HANG_BOUND)


def test_an_existing_readable_database_is_named_in_a_warning(tmp_path: Path) -> None:
    db = tmp_path / "old.sqlite3"
    db.touch(mode=0o644)
    db.chmod(0o644)
    with LocalServer(db=str(db)) as srv:
        assert f"database file {db} has mode -rw-r--r--" in srv.stderr()


def test_a_readable_secret_file_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "locks.sqlite3"
    secret_file = Path(f"{db}.secret")
    secret_file.write_text("s" * 48 + "\n")
    secret_file.chmod(0o644)
    proc = _serve(db)
    _, err = proc.communicate(timeout=HANG_BOUND)
    assert proc.returncode == 2
    assert f"refusing the secret file {secret_file}" in err and "-rw-r--r--" in err
    assert "s" * 48 not in err
    # `keys` reads the default server's kept secret the same way
    data = tmp_path / "xdg"
    kept = data / "volcano-locks" / "locks.sqlite3.secret"
    kept.parent.mkdir(parents=True)
    kept.write_text("k" * 48 + "\n")
    kept.chmod(0o640)
    keys = subprocess.run(
        [sys.executable, "-m", "volcano_locks", "keys"],
        capture_output=True,
        text=True,
        env={
            **{k: v for k, v in os.environ.items() if k != "VOLCANO_LOCAL_SECRET"},
            "XDG_DATA_HOME": str(data),
        },
        timeout=HANG_BOUND,
    )
    assert keys.returncode == 2 and "refusing the secret file" in keys.stderr
    kept.chmod(0o600)
    assert load_or_create_secret(kept) == "k" * 48


@pytest.mark.skipif(
    not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to chown to another user"
)
def test_a_secret_file_of_another_user_is_refused(tmp_path: Path) -> None:
    secret_file = tmp_path / "locks.sqlite3.secret"
    secret_file.write_text("s" * 48 + "\n")
    secret_file.chmod(0o600)
    os.chown(secret_file, 65534, 65534)
    with pytest.raises(ValueError, match="owned by uid 65534, not by this user"):
        load_or_create_secret(secret_file)


# --- ambiguous requests ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("repeated", "code", "says"),
    [
        (
            "Content-Length: 19\r\nContent-Length: 40\r\n",
            "invalid_body",
            "conflicting Content-Length headers",
        ),
        ("Host: x\r\nHost: y\r\n", "bad_request", "Found multiple Host"),
        (
            "Authorization: Bearer {key}\r\nAuthorization: Bearer {key}\r\n",
            "bad_request",
            "repeated authorization",
        ),
        (
            "X-Volcano-Lock-Token: {token}\r\nX-Volcano-Lock-Token: {other}\r\n",
            "bad_request",
            "repeated x-volcano-lock-token",
        ),
    ],
)
def test_repeated_framing_or_identity_headers_are_400(
    admin_srv: InProcessServer, repeated: str, code: str, says: str
) -> None:
    token = new_id()
    lines = {
        "Host": "x",
        "Authorization": f"Bearer {admin_srv.service_key}",
        "X-Volcano-Lock-Token": token,
        "X-Volcano-Request-Id": new_id(),
        "Content-Length": "19",
    }
    first = repeated.split(":", 1)[0]
    head = "".join(f"{k}: {v}\r\n" for k, v in lines.items() if k != first)
    head += repeated.format(key=admin_srv.service_key, token=token, other=new_id())
    answer = exchange(
        admin_srv.port, f"POST /locks/job/lease HTTP/1.1\r\n{head}\r\n".encode() + b'{"ttl_seconds": 30}'
    )
    status = int(answer.split(b" ", 2)[1])
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert status == 400 and body["code"] == code
    assert says in body["error"]
    raw = Raw(admin_srv.url, admin_srv.service_key)
    assert raw.get("job").json() == {"held": False}
    raw.close()
    assert not [e for e in admin_srv.requests() if e["op"] == "acquire"]  # never reached the service


def _sign(secret: str, payload: str) -> str:
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing_input = b64(b'{"alg":"HS256","typ":"JWT"}') + "." + b64(payload.encode())
    mac = hmac.new(secret.encode(), signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + b64(mac)


@pytest.mark.parametrize("claim", ['"exp": 1e400', '"exp": -1e400', '"nbf": -1e400', '"exp": NaN'])
def test_non_finite_time_claims_are_refused(admin_srv: InProcessServer, claim: str) -> None:
    key = _sign(admin_srv.secret, '{"project_id": "local", "role": "service", "iat": 1, ' + claim + "}")
    raw = Raw(admin_srv.url, key)
    r = raw.get("job")
    raw.close()
    assert r.status_code == 401 and r.json()["code"] == "unauthorized", r.text


# --- PostgreSQL connections -----------------------------------------------------------------------


def _connections(pg_dsn: str, app_name: str) -> int:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        got = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app_name,))
        row = got.fetchone()
    assert row is not None and isinstance(row[0], int)
    return row[0]


def test_postgres_connections_stay_within_the_pool_and_waiters_get_503(pg_dsn: str) -> None:
    # 40 requests at once, each held up by a row lock: once they opened a connection each.
    schema = f"vl_pool_{uuid.uuid4().hex[:12]}"
    app_name = f"vl-pool-{uuid.uuid4().hex[:8]}"
    db = with_schema(pg_dsn, schema) + f"&timeout=2&pool_size=4&application_name={app_name}"
    try:
        with InProcessServer(db=db, quota=1_000_000) as srv:
            raw = Raw(srv.url, srv.service_key)
            token = new_id()
            assert raw.acquire("job", token).status_code == 201
            with psycopg.connect(pg_dsn) as blocker:  # holds the row lock every acquire needs
                blocker.execute(
                    sql.SQL("SELECT 1 FROM {} WHERE key = 'job' FOR UPDATE").format(
                        sql.Identifier(schema, "locks")
                    )
                )
                results: list[tuple[int, float]] = []

                def contend() -> None:
                    started = time.monotonic()
                    with httpx.Client(timeout=60) as http:
                        r = http.post(
                            f"{srv.url}/locks/job/lease",
                            json={"ttl_seconds": 30},
                            headers={
                                "Authorization": f"Bearer {srv.service_key}",
                                "X-Volcano-Lock-Token": new_id(),
                                "X-Volcano-Request-Id": new_id(),
                            },
                        )
                    results.append((r.status_code, time.monotonic() - started))

                threads = [threading.Thread(target=contend) for _ in range(40)]
                for t in threads:
                    t.start()
                seen = 0
                while any(t.is_alive() for t in threads):
                    seen = max(seen, _connections(pg_dsn, app_name))
                    time.sleep(0.05)
                for t in threads:
                    t.join()
                blocker.rollback()
            assert 0 < seen <= 4, seen
            assert len(results) == 40
            assert all(status == 503 and elapsed < HANG_BOUND for status, elapsed in results), results
            assert raw.get("job").json()["held"] is True  # nothing changed, and the pool still serves
            assert raw.release("job", token).status_code == 204
            raw.close()
    finally:
        drop_schema(pg_dsn, schema)


def test_pool_size_is_validated() -> None:
    from volcano_locks.server.pg_pool import parse_dsn

    assert parse_dsn("postgresql://u@h/db?pool_size=3").pool_size == 3
    for bad in ("0", "101", "x", "-1"):
        with pytest.raises(ValueError, match=f"pool_size=.*{bad!r}"):
            parse_dsn(f"postgresql://u@h/db?pool_size={bad}")
