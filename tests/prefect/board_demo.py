"""Fills a Prefect server with what the lock screenshots show (run by test_ui_form.py).

Usage: python board_demo.py KEY
A deployment `nightly-rollup/nightly` on work pool `process-pool`: one run holds lock KEY, one run
ends skipped. Prints "READY <deployment id>" while the lock is held; releases when stdin closes.
"""

from __future__ import annotations

import os
import sys
import threading

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.flow_engine import run_flow

from prefect_volcano import locked_flow

KEY = sys.argv[1]
inside = threading.Event()


@locked_flow(KEY, ttl=60, on_contention="skip")
@flow(name="nightly-rollup")
def nightly(hold: bool) -> str:
    if hold:
        inside.set()
        sys.stdin.read()
    return "rolled up"


def main() -> None:
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="process-pool", type="process"))
        flow_id = client.create_flow(nightly)
        deployment_id = client.create_deployment(
            flow_id=flow_id, name="nightly", entrypoint="board_demo.py:nightly", work_pool_name="process-pool"
        )
        holder, skipper = (
            client.create_flow_run_from_deployment(deployment_id, parameters={"hold": h})
            for h in (True, False)
        )
    thread = threading.Thread(
        target=run_flow, args=(nightly,), kwargs={"flow_run": holder, "parameters": {"hold": True}}
    )
    thread.start()
    inside.wait(60)
    run_flow(nightly, flow_run=skipper, parameters={"hold": False})
    print(f"READY {deployment_id}", flush=True)
    thread.join()
    print("RELEASED", flush=True)


if __name__ == "__main__":
    main()
    os._exit(0)
