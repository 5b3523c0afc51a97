"""Which PostgreSQL the tests use: the pure choice with injected probes, and the real probes here."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator

import pytest

from tests.support.pg_select import (
    DSN_ENV,
    LEGACY_DSN_ENV,
    LOCAL_DSN,
    REQUIRE_ENV,
    Probe,
    Source,
    choose,
    connect_problem,
    docker_probe,
    local_probe,
    unavailable,
)

LOCAL_UP = Probe(True, "PostgreSQL answers at 127.0.0.1:5432/test")
LOCAL_DOWN = Probe(False, "nothing usable answers at 127.0.0.1:5432/test (OperationalError: refused)")
DOCKER_UP = Probe(True, "a Docker engine answers at unix:///var/run/docker.sock")
DOCKER_DOWN = Probe(False, "no Docker engine answers at unix:///var/run/docker.sock (FileNotFoundError)")
ENV_DSN = "postgresql://ci:hunter2-secret@db.internal:6543/volcano"
LEGACY_DSN = "postgresql://postgres@10.0.0.7:5432/old"


class Recorded:
    """A probe that returns a fixed result and counts its calls."""

    def __init__(self, result: Probe) -> None:
        self.result = result
        self.calls = 0

    def __call__(self) -> Probe:
        self.calls += 1
        return self.result


@pytest.mark.parametrize(
    ("env", "local", "docker", "source", "dsn", "local_calls", "docker_calls"),
    [
        pytest.param({DSN_ENV: ENV_DSN}, LOCAL_UP, DOCKER_UP, Source.ENV, ENV_DSN, 0, 0, id="env-wins"),
        pytest.param(
            {LEGACY_DSN_ENV: LEGACY_DSN}, LOCAL_UP, DOCKER_UP, Source.ENV, LEGACY_DSN, 0, 0, id="legacy-env"
        ),
        pytest.param(
            {DSN_ENV: ENV_DSN, LEGACY_DSN_ENV: LEGACY_DSN},
            LOCAL_UP,
            DOCKER_UP,
            Source.ENV,
            ENV_DSN,
            0,
            0,
            id="new-name-over-legacy",
        ),
        pytest.param(
            {DSN_ENV: "  "}, LOCAL_UP, DOCKER_UP, Source.LOCAL, LOCAL_DSN, 1, 0, id="blank-env-unset"
        ),
        pytest.param({}, LOCAL_UP, DOCKER_UP, Source.LOCAL, LOCAL_DSN, 1, 0, id="local-before-docker"),
        pytest.param({}, LOCAL_DOWN, DOCKER_UP, Source.CONTAINER, None, 1, 1, id="container"),
        pytest.param({}, LOCAL_DOWN, DOCKER_DOWN, Source.NONE, None, 1, 1, id="none"),
    ],
)
def test_choice_order_and_probes_called_only_when_needed(
    env: dict[str, str],
    local: Probe,
    docker: Probe,
    source: Source,
    dsn: str | None,
    local_calls: int,
    docker_calls: int,
) -> None:
    local_probe_, docker_probe_ = Recorded(local), Recorded(docker)
    choice = choose(env, local_probe_, docker_probe_)
    assert (choice.source, choice.dsn) == (source, dsn)
    assert (local_probe_.calls, docker_probe_.calls) == (local_calls, docker_calls)
    assert choice.required is False


def test_env_reason_names_the_variable_but_not_the_credentials() -> None:
    choice = choose({LEGACY_DSN_ENV: ENV_DSN}, Recorded(LOCAL_UP), Recorded(DOCKER_UP))
    assert f"${LEGACY_DSN_ENV}" in choice.reason
    assert "db.internal:6543/volcano" in choice.reason
    assert "hunter2" not in choice.reason and "ci:" not in choice.reason


def test_container_reason_says_why_the_local_server_was_not_used() -> None:
    choice = choose({}, Recorded(LOCAL_DOWN), Recorded(DOCKER_UP))
    assert LOCAL_DOWN.detail in choice.reason and DOCKER_UP.detail in choice.reason


def test_no_postgres_reason_names_everything_tried_and_how_to_fix_it() -> None:
    choice = choose({}, Recorded(LOCAL_DOWN), Recorded(DOCKER_DOWN))
    for fact in (f"${DSN_ENV} is not set", LOCAL_DOWN.detail, DOCKER_DOWN.detail, "or start Docker"):
        assert fact in choice.reason


@pytest.mark.parametrize(("value", "required"), [("1", True), ("0", False), ("", False), ("yes", False)])
def test_require_switch_is_exactly_one(value: str, required: bool) -> None:
    for local, docker in ((LOCAL_UP, DOCKER_DOWN), (LOCAL_DOWN, DOCKER_DOWN)):
        assert choose({REQUIRE_ENV: value}, Recorded(local), Recorded(docker)).required is required


def test_unavailable_skips_or_fails_when_required() -> None:
    with pytest.raises(pytest.skip.Exception, match="no PostgreSQL here"):
        unavailable("no PostgreSQL here", required=False)
    with pytest.raises(pytest.fail.Exception, match=rf"no PostgreSQL here \({REQUIRE_ENV}=1\)"):
        unavailable("no PostgreSQL here", required=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
def not_postgres() -> Iterator[int]:
    """A loopback TCP port that accepts connections and closes them at once: something, not PostgreSQL."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.close()

    thread = threading.Thread(target=serve, name="not-postgres", daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    server.close()


def test_local_probe_reports_a_closed_port_by_address() -> None:
    port = _free_port()
    found = local_probe(f"postgresql://postgres@127.0.0.1:{port}/test")
    assert not found.ok
    assert f"127.0.0.1:{port}/test" in found.detail and "OperationalError" in found.detail


def test_local_probe_reports_a_port_that_is_not_postgres(not_postgres: int) -> None:
    found = local_probe(f"postgresql://postgres@127.0.0.1:{not_postgres}/test")
    assert not found.ok
    assert f"127.0.0.1:{not_postgres}/test" in found.detail


def test_connect_problem_never_quotes_the_password() -> None:
    problem = connect_problem(f"postgresql://ci:hunter2-secret@127.0.0.1:{_free_port()}/test", timeout=1)
    assert problem is not None and "hunter2" not in problem


def test_docker_probe_looks_where_docker_host_points(monkeypatch: pytest.MonkeyPatch) -> None:
    host = f"tcp://127.0.0.1:{_free_port()}"
    monkeypatch.setenv("DOCKER_HOST", host)
    found = docker_probe()
    assert not found.ok
    assert f"no Docker engine answers at {host}" in found.detail


def test_docker_probe_says_when_no_docker_client_is_installed(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{_free_port()}")
    monkeypatch.setenv("PATH", str(tmp_path_factory.mktemp("empty-path")))
    found = docker_probe()
    assert not found.ok and "no docker client is installed" in found.detail


def _docker_cli_reaches_an_engine(cli: str) -> bool:
    """The independent witness: the docker client's own `docker info` (DOCKER_HOST, current context)."""
    return subprocess.run([cli, "info"], capture_output=True, timeout=60, check=False).returncode == 0


def test_on_this_machine_the_reason_is_honest_about_docker() -> None:
    """With local PostgreSQL ruled out, the choice matches what `docker info` says about the engine.

    Here (docker client installed, no daemon) that means: no container, and a reason saying the client is
    installed but no engine answers. Where `docker info` reaches an engine, the choice is a container.
    """
    cli = shutil.which("docker")
    if cli is None:
        pytest.skip("no docker client on PATH to cross-check the Docker probe against")
    nothing_local: Callable[[], Probe] = lambda: Probe(False, "nothing answers at 127.0.0.1:5432 (ruled out)")  # noqa: E731
    choice = choose({}, nothing_local, docker_probe)
    if _docker_cli_reaches_an_engine(cli):
        assert choice.source is Source.CONTAINER, choice.reason
        return
    assert choice.source is Source.NONE
    assert f"the docker client {cli} is installed, but no Docker engine answers at" in choice.reason
