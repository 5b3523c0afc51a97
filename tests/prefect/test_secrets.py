"""Neither the service key nor any ownership token reaches what Prefect stores or shows.

The ownership tokens are captured where they leave the process (the lock-token header of every
request), then searched for in the saved block, task results and state messages, the flow run
logs read back from the harness API, and every file under PREFECT_HOME.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogWorker
from prefect.results import ResultRecord
from prefect.states import State

from prefect_volcano import VolcanoCredentials, current_lease, locked_task
from volcano_locks import VolcanoLocks


@pytest.fixture
def sent_tokens(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Every ownership token any client sends during the test."""
    tokens: set[str] = set()
    sync_send = httpx.HTTPTransport.handle_request
    async_send = httpx.AsyncHTTPTransport.handle_async_request

    def record(request: httpx.Request) -> None:
        if token := request.headers.get("x-volcano-lock-token"):
            tokens.add(token)

    def handle_request(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
        record(request)
        return sync_send(self, request)

    async def handle_async_request(self: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
        record(request)
        return await async_send(self, request)

    monkeypatch.setattr(httpx.HTTPTransport, "handle_request", handle_request)
    monkeypatch.setattr(httpx.AsyncHTTPTransport, "handle_async_request", handle_async_request)
    return tokens


def test_no_secret_in_block_results_logs_or_storage(
    volcano_server: Any, unique_key: str, prefect_home: Path, sent_tokens: set[str]
) -> None:
    block_name = f"secrets-{uuid.uuid4().hex[:10]}"
    VolcanoCredentials(
        api_url=volcano_server.url, service_key=volcano_server.service_key, anon_key=volcano_server.anon_key
    ).save(block_name)
    started = threading.Event()

    @task(persist_result=True)
    @locked_task(unique_key + "-{n}", credentials=block_name, result="locked_result")
    def produce(n: int) -> dict[str, Any]:
        return {"n": n, "lease": current_lease().public_dict()}

    @task(persist_result=True)
    @locked_task(unique_key + "-async", credentials=block_name)
    async def produce_async() -> dict[str, Any]:
        return current_lease().public_dict()

    @task(persist_result=True)
    @locked_task(unique_key + "-held", credentials=block_name, on_contention="skip")
    def skipped() -> str:
        return "never"

    @task(persist_result=True)
    @locked_task(unique_key + "-held", credentials=block_name, on_contention="fail")
    def refused() -> str:
        return "never"

    @task(persist_result=True)
    @locked_task(unique_key + "-lost", ttl=5, credentials=block_name)
    def lost() -> str:
        started.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.05)
        return "never"

    states: list[State[Any]] = []

    @flow(persist_result=True)
    def everything() -> str:
        states.extend(
            [
                produce(1, return_state=True),
                produce(2, return_state=True),
                asyncio.run(produce_async(return_state=True)),
                skipped(return_state=True),
                refused(return_state=True),
                lost(return_state=True),
            ]
        )
        return "done"

    def breaker() -> None:
        if started.wait(60):
            with VolcanoLocks(**_env_args(volcano_server)) as admin:
                admin.force_release(unique_key + "-lost")

    thread = threading.Thread(target=breaker, daemon=True)
    thread.start()
    with VolcanoLocks(**_env_args(volcano_server)) as holder, holder.with_lock(unique_key + "-held", 30):
        flow_state = everything(return_state=True)
    thread.join()
    assert flow_state.is_completed()
    assert [s.type.value for s in states] == ["COMPLETED"] * 4 + ["FAILED"] * 2
    assert len(sent_tokens) >= 5  # acquisitions of both produce runs, async, the holder, lost

    haystack: list[tuple[str, bytes]] = []
    with get_client(sync_client=True) as client:
        document = client.read_block_document_by_name(
            block_name, "volcano-credentials", include_secrets=False
        )
        haystack.append(("saved block", document.model_dump_json().encode()))
        for s in states:
            haystack.append((f"{s.name} result", pickle.dumps(s.result(raise_on_failure=False))))
            haystack.append((f"{s.name} result repr", repr(s.result(raise_on_failure=False)).encode()))
            haystack.append((f"{s.name} state", s.model_dump_json(exclude={"data"}).encode()))
        APILogWorker.drain_all(timeout=10)
        logs = client.read_logs(
            LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_state.state_details.flow_run_id]))
        )
    log_text = "\n".join(log.message for log in logs)
    assert "Acquired lock" in log_text and "Lost ownership of lock" in log_text
    haystack.append(("flow run logs", log_text.encode()))
    storage = [p for p in (prefect_home / "storage").rglob("*") if p.is_file()]
    assert storage, "results were persisted under PREFECT_HOME/storage"
    haystack.extend((str(p), p.read_bytes()) for p in prefect_home.rglob("*") if p.is_file())
    # Result files hold base64 pickles: scan what they decode to as well.
    decoded = [(f"{p} decoded", _decoded_result(p.read_bytes())) for p in storage]
    assert any(unique_key.encode() in content for _, content in decoded), "the scan sees stored results"
    haystack.extend(decoded)

    secrets = {"service key": volcano_server.service_key, **{f"token {t[:4]}…": t for t in sent_tokens}}
    for label, secret in secrets.items():
        for where, content in haystack:
            assert secret.encode() not in content, f"{label} found in {where}"


def _decoded_result(content: bytes) -> bytes:
    try:
        record = ResultRecord.deserialize(content)
    except Exception:
        return b""  # not a result record (e.g. a lock file)
    return pickle.dumps(record.result) + repr(record.result).encode()


def _env_args(volcano_server: Any) -> dict[str, str]:
    return {"api_url": volcano_server.url, "service_key": volcano_server.service_key}
