"""A real Prefect deployment set-up for tests and benches: ``prefect server start``, a process work pool,
its workers.

What a Prefect user runs: each flow run is a process of its own, started by the worker from a deployment
whose entrypoint is a file in a directory the test writes. The worker's environment is the test's plus
what it passes; ``wrap`` prefixes the worker's command (``opentelemetry-instrument``, say).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Pool", "process_pool"]


@dataclass
class Pool:
    """The running set-up: its API URL, a sync client on it, and the pool's name."""

    api: str
    client: Any
    name: str

    def deploy(self, flow_name: str, entrypoint: str, directory: Path) -> uuid.UUID:
        """A deployment of ``entrypoint`` (``file.py:flow``, in ``directory``) on the pool."""
        return self.client.create_deployment(  # type: ignore[no-any-return]
            flow_id=self.client.create_flow_from_name(flow_name),
            name=flow_name,
            entrypoint=entrypoint,
            work_pool_name=self.name,
            pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(directory)}}],
        )

    def run(self, deployment_id: uuid.UUID, **parameters: Any) -> Any:
        """A flow run of the deployment (the worker picks it up)."""
        return self.client.create_flow_run_from_deployment(deployment_id, parameters=parameters)

    def final(self, run_id: uuid.UUID, timeout: float = 300.0) -> Any:
        """The run's final state (a hang catcher: fails at ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.client.read_flow_run(run_id).state
            if state is not None and state.is_final():
                return state
            assert time.monotonic() < deadline, f"flow run {run_id} did not end in {timeout} s: {state}"
            time.sleep(0.5)


@contextmanager
def process_pool(
    workdir: Path,
    env: Mapping[str, str],
    *,
    wrap: Sequence[str] = (),
    pool: str = "test-pool",
    workers: int = 1,
    server: Mapping[str, Any] | None = None,
) -> Iterator[Pool]:
    """A real server (SQLite in ``workdir`` unless ``server`` says otherwise), a ``process`` pool and
    ``workers`` workers; worker ``i``'s log is ``workdir / f"worker{i}.log"``.

    ``server``: more of ``prefect_server``'s arguments (``database_url``, ``start_timeout``, ``log``,
    ``extra_env``).
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tests.prefect.helpers import prefect_server

    bin_dir = Path(sys.executable).parent
    with prefect_server(workdir / "prefect-home", **(server or {})) as base, ExitStack() as running:
        api = f"{base}/api"
        worker_env = dict(
            os.environ,
            **env,
            PREFECT_API_URL=api,
            PREFECT_HOME=str(workdir / "worker-home"),
            PREFECT_WORKER_QUERY_SECONDS="1",
        )
        running.enter_context(temporary_settings(updates={PREFECT_API_URL: api}))
        client = running.enter_context(get_client(sync_client=True))
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        command = [str(bin_dir / "prefect"), "worker", "start", "--pool", pool, "--type", "process"]
        for i in range(workers):
            log = running.enter_context((workdir / f"worker{i}.log").open("w"))
            worker = subprocess.Popen(
                [*wrap, *command, "--name", f"w{i}"],
                env=worker_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            running.callback(_stop, worker)
        yield Pool(api, client, pool)


def _stop(worker: subprocess.Popen[bytes]) -> None:
    worker.terminate()
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(10)
