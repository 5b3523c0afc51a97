"""Root fixtures for every test package: a session server, a client on it, lock keys, a PostgreSQL DSN."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests import tiers
from tests.fencing.s3_server import MotoServer
from tests.support import pg_select
from volcano_locks import VolcanoLocks
from volcano_locks.governor import Governor
from volcano_locks.server.harness import LocalServer

if TYPE_CHECKING:
    from tests.fencing.examples import ExampleStores

# pytester runs whole sessions against this conftest (tests/server/test_harness.py).
pytest_plugins = ["pytester"]


@pytest.hookimpl(tryfirst=True)  # before -m selects by the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the tests `tests/tiers.py` names into the slow tier."""
    tiers.mark_slow(items, config.args)


@pytest.fixture(scope="session")
def volcano_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    """A `volcano-locks serve` subprocess for the whole session: tmp SQLite db, admin on, quota 1,000,000.

    Shared by every test: use `unique_key` for lock names. Faults set with `set_faults` are cleared
    after each test that used it.
    """
    db = tmp_path_factory.mktemp("volcano-server") / "locks.sqlite3"
    with LocalServer(db=str(db), admin=True, quota=1_000_000) as srv:
        yield srv


@pytest.fixture
def quota_server(tmp_path: Path) -> Iterator[LocalServer]:
    """A server of this test's own at the contract's quota of 600 requests a minute, with a request log."""
    with LocalServer(db=str(tmp_path / "quota.sqlite3"), admin=True, quota=600) as srv:
        yield srv


@pytest.fixture(autouse=True)
def _fresh_governors() -> None:
    """Each test waits as a new process would: what earlier tests spent is not its budget's debt."""
    Governor.reset_all()


@pytest.fixture(autouse=True)
def _volcano_server_faults_reset(request: pytest.FixtureRequest) -> Iterator[None]:
    """Clear runtime faults on the shared server after any test that used it, even a failed one."""
    yield
    if "volcano_server" in request.fixturenames:
        srv: LocalServer = request.getfixturevalue("volcano_server")
        if srv.running and srv.faults():
            srv.set_faults(None)


@pytest.fixture(scope="module")
def volcano_client(volcano_server: LocalServer) -> Iterator[VolcanoLocks]:
    """A sync `VolcanoLocks` on the session server with its service key, shared by one test module.

    Module-scoped so Hypothesis tests can use it too; take `unique_key`s and release what you hold.
    """
    with VolcanoLocks(volcano_server.url, service_key=volcano_server.service_key, timeout=10.0) as client:
        yield client


@pytest.fixture
def unique_key(request: pytest.FixtureRequest) -> str:
    """A fresh lock key for this test (valid per the contract's key pattern, <= 128 chars)."""
    name = re.sub(r"[^A-Za-z0-9._:-]", "-", request.node.name)[:80].strip("-._:") or "test"
    return f"t-{name}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """DSN of the test PostgreSQL, chosen by `pg_select.choose` (no query string: append ``?...``).

    $VOLCANO_TEST_POSTGRES_DSN (or the older $VOLCANO_TEST_PG_DSN), else 127.0.0.1:5432/test, else a
    testcontainers PostgreSQL for the session where a Docker engine is reachable. Skips with the reason
    when none is usable, unless VOLCANO_TEST_REQUIRE_POSTGRES=1 (then the test fails). Use your own
    schema/table names; the server takes `?schema=NAME` on the DSN.
    """
    choice = pg_select.choose(os.environ, pg_select.local_probe, pg_select.docker_probe)
    if choice.source is pg_select.Source.NONE:
        pg_select.unavailable(choice.reason, choice.required)
    if choice.dsn is not None:
        # The local probe has just connected; a DSN from the environment has not been tried yet.
        if choice.source is pg_select.Source.ENV and (problem := pg_select.connect_problem(choice.dsn)):
            pg_select.unavailable(f"{choice.reason}, but it does not answer: {problem}", choice.required)
        yield choice.dsn
        return
    with ExitStack() as stack:
        try:
            dsn = stack.enter_context(pg_select.postgres_container())
        except Exception as exc:
            message = f"{choice.reason}, but the container did not start: {type(exc).__name__}: {exc}"
            pg_select.unavailable(message, choice.required)
        yield dsn


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """moto's S3-compatible server as its own process on a free loopback port, its conditional writes
    atomic as S3's are (``tests/fencing/s3_server.py``).

    One per session; take a fresh bucket per test with ``s3_server.bucket()``. Stopped at session end.
    """
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with MotoServer(log=log) as server:
        yield server


@pytest.fixture(scope="session")
def pg_sqlalchemy_url(pg_dsn: str) -> str:
    """``pg_dsn`` as a SQLAlchemy URL on the psycopg 3 driver the environments have."""
    return "postgresql+psycopg://" + pg_dsn.split("://", 1)[1]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def example_stores(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    s3_server: MotoServer,
) -> Iterator[ExampleStores]:
    """The fenced-lake examples' warehouse (SQLite, then PostgreSQL) and bucket, set in VOLCANO_EXAMPLES_*."""
    from tests.fencing.examples import ExampleStores  # SQLAlchemy only for the tests that use it

    url = (
        f"sqlite:///{tmp_path / 'warehouse.sqlite3'}"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_sqlalchemy_url")
    )
    stores = ExampleStores(url, s3_server)
    for name, value in stores.env.items():
        monkeypatch.setenv(name, value)
    try:
        yield stores
    finally:
        stores.close()


@pytest.fixture(scope="session")
def metric_reader() -> Any:
    """OpenTelemetry's in-memory reader behind the global ``MeterProvider``, set the standard way, once."""
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


@pytest.fixture(scope="session")
def span_exporter() -> Any:
    """OpenTelemetry's in-memory span exporter behind the global ``TracerProvider``, set once."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter
