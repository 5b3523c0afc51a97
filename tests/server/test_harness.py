"""The shared fixtures and the LocalServer harness work as SPEC.md promises."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from volcano_locks.server.harness import LocalServer

from .helpers import Raw, new_id


def test_session_server_happy_path(volcano_server: LocalServer, unique_key: str) -> None:
    raw = Raw(volcano_server.url, volcano_server.service_key)
    token = new_id()
    r = raw.acquire(unique_key, token, 30)
    assert r.status_code == 201, r.text
    assert set(r.json()) == {"expires_at", "fencing_token"}
    assert raw.get(unique_key).json()["held"] is True
    assert raw.release(unique_key, token).status_code == 204
    assert raw.get(unique_key).json() == {"held": False}
    raw.close()


def test_unique_key_matches_contract(unique_key: str) -> None:
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}", unique_key)


def test_env_and_admin(volcano_server: LocalServer, unique_key: str) -> None:
    env = volcano_server.env()
    assert env["VOLCANO_API_URL"] == volcano_server.url
    rid = new_id()
    raw = Raw(env["VOLCANO_API_URL"], env["VOLCANO_SERVICE_KEY"])
    raw.get(unique_key, request_id=rid)
    raw.close()
    seen = [e for e in volcano_server.requests() if e["request_id"] == rid]
    assert seen and seen[0]["op"] == "get" and seen[0]["status"] == 200
    assert volcano_server.faults() == ""


def test_restart_keeps_leases_and_fencing() -> None:
    with LocalServer() as srv:
        raw = Raw(srv.url, srv.service_key)
        token = new_id()
        first = raw.acquire("restart-me", token, 60).json()
        raw.close()
        port = srv.port
        srv.restart()
        assert srv.port == port
        raw = Raw(srv.url, srv.service_key)
        assert raw.get("restart-me").json() == {"held": True, **first}
        assert raw.release("restart-me", token).status_code == 204
        again = raw.acquire("restart-me", new_id(), 60).json()
        assert again["fencing_token"] > first["fencing_token"]
        raw.close()
        srv.kill()
        srv.start()
        raw = Raw(srv.url, srv.service_key)
        assert raw.get("restart-me").json()["fencing_token"] == again["fencing_token"]
        raw.close()


def test_sigterm_stops_cleanly() -> None:
    srv = LocalServer().start()
    assert srv.stop() == 0
    assert "stopped" in srv.stdout_path.read_text()
    try:
        httpx.get(srv.url + "/locks/x", timeout=2)
        raise AssertionError("server still answering after stop")
    except httpx.TransportError:
        pass
    srv.close()


def test_server_exits_when_the_process_that_started_it_dies() -> None:
    script = (
        "from volcano_locks.server.harness import LocalServer\n"
        "import time\n"
        "srv = LocalServer().start()\n"
        "print(srv.proc.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as parent:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(server_pid, signal.SIGKILL)
    raise AssertionError("the orphaned server kept running")


ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

INNER_TESTS = """
def test_sets_a_fault(volcano_server):
    volcano_server.set_faults("status=503:op=get")
    assert volcano_server.faults() != ""


def test_runs_next_and_sees_no_fault(volcano_server):
    assert volcano_server.faults() == ""
"""

# Shadows the root autouse fixture by name, so the control run shows what the inner check sees without it.
NO_RESET_CONFTEST = """
import pytest


@pytest.fixture(autouse=True)
def _volcano_server_faults_reset():
    yield
"""


@pytest.mark.parametrize("reset", [True, False], ids=["root-conftest", "reset-disabled"])
def test_autouse_fixture_clears_faults_a_test_left_on_the_shared_server(
    pytester: pytest.Pytester, reset: bool
) -> None:
    """A session run with the root conftest: the second test sees no fault that the first one set.

    The control run shadows the reset fixture and must see the fault, so the check can fail. Both runs
    are whole sessions of their own (own server, fixed test order), independent of this file's order.
    """
    pytester.makeconftest(ROOT_CONFTEST.read_text())
    if reset:
        pytester.makepyfile(test_inner=INNER_TESTS)
    else:
        pytester.mkpydir("sub").joinpath("conftest.py").write_text(NO_RESET_CONFTEST)
        pytester.path.joinpath("sub", "test_inner.py").write_text(INNER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", timeout=120)
    if reset:
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(passed=1, failed=1)
        result.stdout.fnmatch_lines(["*assert 'status=503:op=get' == ''*"])
        result.stdout.fnmatch_lines(["FAILED*test_runs_next_and_sees_no_fault*"])
