"""Helpers shared by the Airflow tests: connections, real Airflow stacks, waiting for what they do."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"
STACK_DAGS = Path(__file__).resolve().parent / "stack_dags"  # DAGs only the full-stack tests run
CHROMIUM = Path(os.environ.get("VOLCANO_TEST_CHROMIUM", "/usr/bin/chromium"))
T = TypeVar("T")
OWNER = re.compile(r"\bowner ([0-9a-f]{32})\b")  # the operator logs its try's public owner nonce


STACK_HANG_BOUND = pytest.mark.timeout(900)
"""A stack module's hang catcher: pytest-timeout counts the module's stack start (in its first test) and
the stack's teardown (in its last), and on a busy two-core machine (make test's lanes) the default 300 s
did not always cover them with the runs."""


def airflow_bin() -> str:
    """Return the path of the airflow CLI of this environment."""
    return str(Path(sys.executable).with_name("airflow"))


def volcano_conn_json(url: str, service_key: str, **extra: object) -> str:
    """Return a Volcano connection in Airflow's JSON env-var form."""
    return json.dumps({"conn_type": "volcano", "host": url, "password": service_key, "extra": extra})


@dataclass(frozen=True)
class VolcanoConn:
    """The lock server a test's Airflow connection points at, and the exact keys in it."""

    server: Any
    url: str
    service_key: str = field(repr=False)
    anon_key: str = field(repr=False)

    def requests(self) -> list[dict[str, Any]]:
        """The server's recent request log."""
        return list(self.server.requests())


class TaskInstanceStandIn(SimpleNamespace):
    """What a task's ``context["ti"]`` offers an operator run in this process: its identity and XCom.

    XCom values go through a JSON round trip, as Airflow stores them (a value a REST user could post).
    """

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[(self.task_id, key)] = json.loads(json.dumps(value))

    def xcom_pull(self, task_ids: str, key: str) -> Any:
        return self.xcoms.get((task_ids, key))


def task_context(
    task_id: str, xcoms: dict[Any, Any], run_id: str = "manual__2026-12-01", dag_id: str = "swap_dag"
) -> dict[str, Any]:
    """A task's context for ``execute`` in this process; ``xcoms`` is shared by the run's tasks."""
    ti = TaskInstanceStandIn(
        dag_id=dag_id, task_id=task_id, run_id=run_id, map_index=-1, try_number=1, xcoms=xcoms
    )
    return {"ti": ti}


def browser_or_skip() -> Any:
    """``playwright.sync_api`` for a browser test module, which is skipped without it or without chromium."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the playwright package is not installed (test dependency group)"
    )
    if not CHROMIUM.is_file():
        pytest.skip(
            f"no browser at {CHROMIUM} (install Debian's chromium or set VOLCANO_TEST_CHROMIUM)",
            allow_module_level=True,
        )
    return sync_api


def until(what: str, check: Callable[[], T], timeout: float = 180.0, *, stack: Stack | None = None) -> T:
    """Poll ``check`` until it returns something true and return that; fail naming ``what`` at ``timeout``.

    With ``stack``, also fail as soon as one of its Airflow processes has exited (leave it out while a
    process is stopped on purpose, or gone).
    """
    deadline = time.monotonic() + timeout
    while True:
        if stack is not None:
            stack.alive()
        if value := check():
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}" + (
            f"\n{stack.report()}" if stack is not None else ""
        )
        time.sleep(0.2)


def deferral_processed(stack: Stack, dag_id: str, task_id: str, run_id: str, timeout: float = 180) -> None:
    """Wait until the scheduler has processed the executor's event for a task's deferring exit.

    A trigger that fires before that meets Airflow's race (apache/airflow#72716, docs/operating.md's
    Known limits): the scheduler fails the resumed, running task. Tests that free a lock behind a deferred
    waiter wait for this first, as a user's lock normally outlasts it by far.
    """
    event = (
        "Received executor event with state success for task instance "
        f"TaskInstanceKey(dag_id='{dag_id}', task_id='{task_id}', run_id='{run_id}'"
    )
    until(f"{run_id}'s deferral processed", lambda: event in stack.output("scheduler"), timeout, stack=stack)


def deferred_and_waiting(
    stack: Stack, dag_id: str, run_id: str, key: str, *, task_id: str = "hold", timeout: float = 180
) -> None:
    """Wait until ``run_id``'s task is deferred, the scheduler has processed its deferring exit
    (:func:`deferral_processed`), and its trigger has said it is waiting for ``key``."""
    until(
        f"{run_id} deferred",
        lambda: (
            stack.query(
                "SELECT state FROM task_instance WHERE dag_id = ? AND task_id = ? AND run_id = ?",
                dag_id,
                task_id,
                run_id,
            )
            == [("deferred",)]
        ),
        timeout,
        stack=stack,
    )
    deferral_processed(stack, dag_id, task_id, run_id, timeout)
    until(
        f"{run_id}'s trigger waiting",
        lambda: f"Still waiting for lock {key!r}" in stack.logs(run_id),
        timeout,
        stack=stack,
    )


def users_env(root: Path, users: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """The simple auth manager's settings for ``users`` (name -> (role, password)), passwords file in root."""
    (root / "passwords.json").write_text(json.dumps({name: pw for name, (_, pw) in users.items()}))
    return {
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{n}:{role}" for n, (role, _) in users.items()),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(root / "passwords.json"),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
    }


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def owner_tokens(service_key: str, lock_key: str, task_rows: Any, text: str) -> set[str]:
    """The ownership tokens of the given task tries, from the owner nonces that ``text`` names.

    :param task_rows: ``(dag_id, task_id, run_id, map_index, try_number)`` rows; every try up to
        ``try_number`` is paired with every nonce found (a superset, for secret scans and log oracles).
    """
    from airflow_provider_volcano._tokens import TaskIdentity, derive_token

    return {
        derive_token(service_key, TaskIdentity(dag, task, run, int(index), n, nonce), lock_key)
        for dag, task, run, index, tries in task_rows
        for n in range(1, max(1, int(tries)) + 1)
        for nonce in set(OWNER.findall(text))
    }


class Stack:
    """Real Airflow processes on a private AIRFLOW_HOME and SQLite metadata database."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home, self.env = home, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.url = ""  # the api-server's base URL
        self.pg_dsn = ""  # the metadata database, when it is PostgreSQL (else SQLite in home)

    def rest(self, method: str, path: str, body: object = None, *, token: str = "") -> Any:
        """Call the api-server's public REST API (``/api/v2/...``, or ``/auth/token``); return the JSON."""
        request = urllib.request.Request(
            self.url + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={
                "Content-Type": "application/json",
                **({"Authorization": f"Bearer {token}"} if token else {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            exc.close()  # its response holds a socket
            raise
        return json.loads(text) if text else None

    def wait_for_api(self, timeout: float = 180) -> None:
        """Wait until the api-server answers its health check."""
        deadline = time.monotonic() + timeout
        while True:
            self.alive()
            try:
                self.rest("GET", "/api/v2/monitor/health")
                return
            except OSError:
                assert time.monotonic() < deadline, "the api-server never answered"
                time.sleep(1)

    def start(self, name: str, *args: str) -> None:
        """Start ``airflow <args>`` in its own session, its output in ``<home>/<name>.out``."""
        with open(self.home / f"{name}.out", "wb") as out:
            self.procs[name] = subprocess.Popen(
                [airflow_bin(), *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def cli(self, *args: str) -> str:
        """Run one ``airflow`` CLI command against this stack; fail the test if it fails."""
        done = subprocess.run(
            [airflow_bin(), *args], env=self.env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
        return done.stdout

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Read the metadata database (``?`` placeholders, on SQLite and PostgreSQL alike)."""
        if self.pg_dsn:
            import psycopg

            with psycopg.connect(self.pg_dsn, autocommit=True) as pg:
                return [tuple(row) for row in pg.execute(sql.replace("?", "%s"), params).fetchall()]
        conn = sqlite3.connect(self.home / "airflow.db", timeout=30)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def unpause_when_parsed(self, dag_id: str, timeout: float = 180) -> None:
        """Wait for the dag processor to serialise ``dag_id``, then unpause it."""
        deadline = time.monotonic() + timeout
        while not self.query("SELECT 1 FROM serialized_dag WHERE dag_id = ?", dag_id):
            self.alive()
            assert time.monotonic() < deadline, "the dag processor never parsed the DAG"
            time.sleep(1)
        self.cli("dags", "unpause", dag_id)

    def output(self, name: str) -> str:
        """What the process ``name`` (e.g. ``scheduler``) wrote so far."""
        return (self.home / f"{name}.out").read_text(errors="replace")

    def logs(self, run_id: str | None = None) -> str:
        """The text of every task log file (of one run, if ``run_id`` is given)."""
        return "\n".join(
            path.read_text(errors="replace")
            for path in sorted((self.home / "logs").rglob("*"))
            if path.is_file() and (run_id is None or f"run_id={run_id}" in str(path))
        )

    def report(self, *run_ids: str) -> str:
        """Why runs ended as they did, for an assertion's message: the scheduler's lines that name them
        (state mismatches, kills, failures) and the tail of each run's task logs (no ``run_ids``: of
        every run)."""
        lines = [
            line
            for line in self.output("scheduler").splitlines()
            if (not run_ids or any(r in line for r in run_ids))
            and any(w in line for w in ("mismatch", "failed", "Killing", "killed", "externally", "FAILED"))
        ]
        tails = [f"--- {r or 'every run'} task logs ---\n" + self.logs(r)[-2500:] for r in run_ids or (None,)]
        return "\n".join(["--- runs ---", *self.run_states(), "--- scheduler ---", *lines[-20:], *tails])

    def run_states(self) -> list[str]:
        """A line per task try in the metadata database: run, its state, task, its state and try."""
        try:
            rows = self.query(
                "SELECT dr.run_id, dr.run_type, dr.state, ti.task_id, ti.state, ti.try_number "
                "FROM dag_run dr LEFT JOIN task_instance ti "
                "ON ti.dag_id = dr.dag_id AND ti.run_id = dr.run_id "
                "ORDER BY dr.id"
            )
        except Exception as exc:  # a report must not hide the failure it reports
            return [f"(run states unreadable: {exc!r})"]
        return [" ".join(str(v) for v in row) for row in rows]

    def alive(self) -> None:
        """Fail the test with the process's output if any Airflow process has exited."""
        for name, proc in self.procs.items():
            assert proc.poll() is None, (
                f"airflow {name} exited:\n" + (self.home / f"{name}.out").read_text()[-3000:]
            )

    def stop(self) -> None:
        """SIGTERM every process group, SIGKILL what is still there after 20 s."""
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def _stack_env(home: Path, port: int, dags: Path, tmp_path: Path, executor: str, sql: str) -> dict[str, str]:
    """What every process of a stack runs with: home, metadata DB, DAGs folder, executor, api-server."""
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sql,
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__EXECUTOR": executor,
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        # A new DAG file is parsed when it is found; the files a stack starts with never change, and
        # re-parsing each every 30 s (the default) kept a dag processor busy on a two-core machine.
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
        "VOLCANO_EXAMPLES_DB": str(tmp_path / "examples.sqlite"),
    }


def _start_core(stack: Stack, port: int, apps: str, triggerer: bool = True) -> None:
    """Start the api-server (``apps``), the dag processor, the scheduler and (``triggerer``) the triggerer."""
    stack.start("api-server", "api-server", "--apps", apps, "-H", "127.0.0.1", "-p", str(port), "-w", "1")
    stack.start("dag-processor", "dag-processor")
    stack.start("scheduler", "scheduler")
    if triggerer:
        stack.start("triggerer", "triggerer")


@contextmanager
def running_stack(
    airflow_db: Path,
    tmp_path: Path,
    dags: Path = DAGS,
    *,
    apps: str = "execution",
    extra_env: dict[str, str] | None = None,
    triggerer: bool = True,
    postgres: bool = False,
) -> Iterator[Stack]:
    """An api-server, dag processor, scheduler (LocalExecutor) and triggerer on a copy of the session's DB.

    The Volcano connection comes from the environment (``AIRFLOW_CONN_VOLCANO_DEFAULT``); the example DAGs
    write to ``<tmp_path>/examples.sqlite``. ``dags`` is the DAGs folder (default: the examples);
    ``apps`` the api-server's apps (``all`` serves the public REST API too); ``extra_env`` is added to
    every process's environment; without ``triggerer`` the test starts one itself (``stack.start``).
    With ``postgres`` the metadata database is a PostgreSQL database of its own (migrated, dropped after)
    instead: SQLite fails a write that meets another process's (``database is locked``), and
    ``airflow backfill create`` commits its backfill before its runs, so such a failure leaves a backfill
    that lacks days and blocks any other.
    """
    home = tmp_path / "airflow-home"
    home.mkdir()
    shutil.copy(airflow_db / "airflow.cfg", home / "airflow.cfg")  # same JWT secret for every process
    port = free_port()
    with ExitStack() as cleanup:
        if postgres:
            dsn, sql = cleanup.enter_context(_pg_database("af_stack"))
        else:
            shutil.copy(airflow_db / "airflow.pristine.db", home / "airflow.db")
            dsn, sql = "", f"sqlite:///{home}/airflow.db"
        env = _stack_env(home, port, dags, tmp_path, "LocalExecutor", sql)
        stack = Stack(home, {**env, **(extra_env or {})})
        stack.pg_dsn = dsn
        stack.url = f"http://127.0.0.1:{port}"
        try:
            if postgres:
                stack.cli("db", "migrate")
            _start_core(stack, port, apps, triggerer)
            yield stack
        finally:
            stack.stop()


PG_ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"
CELERY_REDIS_DB = 7  # this suite's own Redis database number (flushed before each Celery stack)


@contextmanager
def _pg_database(prefix: str) -> Iterator[tuple[str, str]]:
    """A PostgreSQL database of its own (``<prefix>_<random>``), dropped after: its DSN and Airflow's URL."""
    import uuid

    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield (
            f"host=127.0.0.1 port=5432 user=postgres dbname={name}",
            f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}",
        )
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def running_celery_stack(
    airflow_db: Path,
    tmp_path: Path,
    dags: Path,
    queues: Mapping[str, str],
    *,
    apps: str = "execution",
    extra_env: dict[str, str] | None = None,
) -> Iterator[Stack]:
    """An api-server, dag processor, scheduler (CeleryExecutor), triggerer and one Celery worker per queue.

    The metadata database is a PostgreSQL database of its own (``af_celery_<random>``, dropped after);
    the broker and the result backend are Redis database ``CELERY_REDIS_DB`` on 127.0.0.1:6379.
    ``queues`` maps a worker's name to the queue it serves (its process is ``stack.procs[name]``).
    """
    import redis

    broker = f"redis://127.0.0.1:6379/{CELERY_REDIS_DB}"
    redis.Redis.from_url(broker).flushdb()
    home = tmp_path / "airflow-home"
    home.mkdir()
    shutil.copy(airflow_db / "airflow.cfg", home / "airflow.cfg")  # same JWT secret for every process
    port = free_port()
    with _pg_database("af_celery") as (dsn, sql):
        env = _stack_env(home, port, dags, tmp_path, "CeleryExecutor", sql)
        env |= {
            "AIRFLOW__CELERY__BROKER_URL": broker,
            "AIRFLOW__CELERY__RESULT_BACKEND": broker,
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
        }
        stack = Stack(home, {**env, **(extra_env or {})})
        stack.pg_dsn = dsn
        stack.url = f"http://127.0.0.1:{port}"
        try:
            stack.cli("db", "migrate")
            _start_core(stack, port, apps)
            for worker, queue in queues.items():
                stack.start(
                    worker,
                    "celery",
                    "worker",
                    "--queues",
                    queue,
                    "--concurrency",
                    "1",
                    "--skip-serve-logs",
                    "--celery-hostname",
                    f"{worker}@%h",
                    "--without-gossip",
                    "--without-mingle",
                )
            yield stack
        finally:
            stack.stop()
            redis.Redis.from_url(broker).flushdb()


@contextmanager
def dag_stack(
    airflow_db: Path,
    conn: VolcanoConn,
    root: Path,
    dag_files: Sequence[Path],
    dag_ids: Sequence[str],
    *,
    users: Mapping[str, tuple[str, str]] | None = None,
    extra_env: dict[str, str] | None = None,
    celery_queues: Mapping[str, str] | None = None,
    parse_timeout: float = 180,
    triggerer: bool = True,
) -> Iterator[Stack]:
    """A full stack running ``dag_files`` against ``conn``'s lock server, its ``dag_ids`` parsed and unpaused.

    The DAGs folder is ``<root>/dags`` with copies of ``dag_files``; with ``users`` (name -> (role,
    password), the simple auth manager) the api-server serves the UI and the public REST API too, and is
    answering when this yields. ``celery_queues`` (worker name -> queue) makes it a CeleryExecutor stack
    (``running_celery_stack``), else a LocalExecutor one (``running_stack``, which starts no triggerer
    without ``triggerer``).
    """
    dags = root / "dags"
    dags.mkdir()
    for path in dag_files:
        shutil.copy(path, dags)
    extra = {**(users_env(root, users) if users else {}), **(extra_env or {})}
    apps = "all" if users else "execution"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(
            "AIRFLOW_CONN_VOLCANO_DEFAULT",
            volcano_conn_json(conn.url, conn.service_key, anon_key=conn.anon_key),
        )
        if celery_queues is None:
            running = running_stack(airflow_db, root, dags, apps=apps, extra_env=extra, triggerer=triggerer)
        else:
            running = running_celery_stack(airflow_db, root, dags, celery_queues, apps=apps, extra_env=extra)
        with running as stack:
            if users:
                stack.wait_for_api()
            for dag_id in dag_ids:
                stack.unpause_when_parsed(dag_id, timeout=parse_timeout)
            yield stack
