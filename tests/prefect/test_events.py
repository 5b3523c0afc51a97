"""Lock events, read back from the Prefect API: what the Event Feed shows and an automation matches."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from prefect import flow, task
from prefect.states import State

from prefect_volcano import (
    SKIPPED_STATE_NAME,
    VolcanoCredentials,
    locked_task,
)
from tests.prefect.helpers import (
    PROJECT,
    assert_no_secret,
    collecting_flow,
    force_release_when,
    lock_events,
    related_ids,
    release_once_waiting,
    token_task,
)
from volcano_locks import OwnershipLost, VolcanoLocks

pytestmark = pytest.mark.usefixtures("volcano_env")


def test_acquired_released_and_skipped_events_name_the_lock_and_the_runs(
    unique_key: str, credentials: VolcanoCredentials
) -> None:
    f, states = collecting_flow(token_task(unique_key, on_contention="skip"))

    f()
    with VolcanoLocks() as holder, holder.with_lock(unique_key, 10) as held:
        f()
    ran, skipped = states
    token = ran.result()
    assert skipped.name == SKIPPED_STATE_NAME

    events = lock_events(unique_key, ["acquired", "released", "skipped"])
    by_name = {e.event: e for e in events}
    assert [e.event for e in events] == [
        "volcano.lock.acquired",
        "volcano.lock.released",
        "volcano.lock.skipped",
    ]
    acquired, released, skip = (by_name[f"volcano.lock.{n}"] for n in ("acquired", "released", "skipped"))
    assert acquired.resource.id == f"volcano.lock.{PROJECT}/{unique_key}"
    assert acquired.resource["volcano.project"] == PROJECT
    assert acquired.resource["volcano.lock.key"] == unique_key
    assert acquired.payload["fencing_token"] == token and acquired.payload["ttl"] == 30
    assert released.payload == {"fencing_token": token}
    # The contract's 409 does not name the holder, and a skip spends no request to ask.
    assert skip.payload == {} and held.fencing_token == token + 1
    assert released.follows == acquired.id
    for event, state in ((acquired, ran), (released, ran), (skip, skipped)):
        task_run_id = state.state_details.task_run_id
        assert related_ids(event, "task-run") == [f"prefect.task-run.{task_run_id}"]
        assert related_ids(event, "flow-run") == [f"prefect.flow-run.{state.state_details.flow_run_id}"]
    assert_no_secret(events, credentials)


def test_waiting_and_lost_events(
    unique_key: str, credentials: VolcanoCredentials, volcano_server: Any
) -> None:
    started = threading.Event()

    @task
    @locked_task(unique_key, ttl=5, wait_timeout=30)
    def job() -> str:
        started.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.05)
        return "should never complete"

    states: list[State[Any]] = []

    @flow
    def f() -> None:
        states.append(job(return_state=True))

    with VolcanoLocks() as holder:
        lease = holder.acquire(unique_key, 120)  # never lapses before the task waits
        releaser = release_once_waiting(volcano_server, holder, unique_key, lease)
        thread = force_release_when(started, unique_key)
        f()
        releaser.join(90)
        thread.join()
    with pytest.raises(OwnershipLost):
        states[0].result()

    events = lock_events(unique_key, ["waiting", "acquired", "lost"])
    names = [e.event.removeprefix("volcano.lock.") for e in events]
    assert names == ["waiting", "acquired", "lost"]
    waiting, acquired, lost = events
    assert waiting.payload.get("holder_fencing_token", lease.fencing_token) == lease.fencing_token
    assert acquired.payload["fencing_token"] > lease.fencing_token
    assert lost.payload["fencing_token"] == acquired.payload["fencing_token"]
    assert lost.payload["code"] == "lock_ownership_lost" and "renew failed" in lost.payload["reason"]
    # Dropped long before its 5 s TTL could run out: the holder can tell it was a force release.
    assert lost.payload["force_released"] is True
    task_run = f"prefect.task-run.{states[0].state_details.task_run_id}"
    assert all(related_ids(e, "task-run") == [task_run] for e in events)
    assert_no_secret(events, credentials)


@pytest.mark.filterwarnings("ignore:'imghdr' is deprecated:DeprecationWarning")  # apprise, under SlackWebhook
def test_the_readme_automation_notify_when_a_lock_is_lost_is_accepted() -> None:
    # The example of docs/prefect.md, as written there: Prefect validates and stores it.
    from prefect.automations import Automation
    from prefect.blocks.notifications import SlackWebhook
    from prefect.events.actions import SendNotification
    from prefect.events.schemas.automations import EventTrigger, Posture

    slack = SlackWebhook(url="https://hooks.slack.com/services/T000/B000/XXXX")
    slack_id = slack.save("volcano-alerts", overwrite=True)

    automation = Automation(
        name="volcano-lock-lost",
        trigger=EventTrigger(
            expect={"volcano.lock.lost"},
            match={"prefect.resource.id": "volcano.lock.*"},
            posture=Posture.Reactive,
            threshold=1,
        ),
        actions=[
            SendNotification(
                block_document_id=slack_id,
                subject="Lock {{ event.resource['volcano.lock.key'] }} lost",
                body="{{ event.payload.reason }} (fencing token {{ event.payload.fencing_token }})",
            )
        ],
    ).create()
    stored = Automation.read(id=automation.id)
    assert isinstance(stored.trigger, EventTrigger)
    assert stored.trigger.expect == {"volcano.lock.lost"}
    assert stored.trigger.match.model_dump() == {"prefect.resource.id": "volcano.lock.*"}
    stored.delete()
