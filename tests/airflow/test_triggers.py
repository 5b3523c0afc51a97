"""VolcanoLockTrigger: primitives-only serialisation and the poll timing rules."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from airflow_provider_volcano._tokens import TaskIdentity
from airflow_provider_volcano.triggers.lock import VolcanoLockTrigger, next_poll_delay

IDENTITY = TaskIdentity("d", "t", "r", 3, 2).as_dict()


def _primitives_only(value: object) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _primitives_only(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_primitives_only(v) for v in value)
    return value is None or isinstance(value, str | int | float | bool)


def test_serialize_round_trip_is_primitives_only() -> None:
    trigger = VolcanoLockTrigger(
        volcano_conn_id="vc", lock_key="k.1", ttl=30, identity=IDENTITY, deadline=1_900_000_000.5, poll=1.5
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_volcano.triggers.lock.VolcanoLockTrigger"
    assert _primitives_only(kwargs)
    again = VolcanoLockTrigger(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (classpath, kwargs)
    assert set(kwargs) == {"volcano_conn_id", "lock_key", "ttl", "identity", "deadline", "poll"}


def test_serialize_without_deadline() -> None:
    _, kwargs = VolcanoLockTrigger(volcano_conn_id="vc", lock_key="k", ttl=5, identity=IDENTITY).serialize()
    assert kwargs["deadline"] is None


def _fixed(_a: float, _b: float) -> float:
    return 1.0


def test_poll_delay_is_the_interval_while_the_holder_has_long_to_go() -> None:
    far = datetime.fromtimestamp(1000 + 3600, UTC)
    assert next_poll_delay(2.0, far, 1000.0, None, rand=_fixed) == 2.0


def test_poll_delay_stops_at_holder_expiry_plus_grace() -> None:
    soon = datetime.fromtimestamp(1000.5, UTC)
    assert next_poll_delay(5.0, soon, 1000.0, None, rand=_fixed) == 1.5


def test_poll_delay_stops_at_the_earliest_deadline_but_never_below_the_floor() -> None:
    assert next_poll_delay(5.0, None, 1000.0, 1003.0, rand=_fixed) == 3.0
    assert next_poll_delay(5.0, None, 1000.0, 999.0, rand=_fixed) == 0.2


def test_poll_delay_has_jitter() -> None:
    delays = {next_poll_delay(2.0, None, 0.0, None) for _ in range(20)}
    assert len(delays) > 1 and all(1.8 <= d <= 2.2 for d in delays)
