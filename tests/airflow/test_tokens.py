"""The derived ownership token: deterministic per task try and lock, a UUID, keyed by the service key."""

from __future__ import annotations

import uuid

from airflow_provider_volcano._tokens import TaskIdentity, derive_token, new_nonce

NONCE = new_nonce()
ID = TaskIdentity("dag", "task", "manual__2026-01-01", -1, 1, NONCE)


def test_token_is_a_deterministic_uuid() -> None:
    token = derive_token("key-a", ID, "lock")
    assert str(uuid.UUID(token)) == token
    assert derive_token("key-a", ID, "lock") == token


def test_every_identity_part_the_key_and_the_lock_change_the_token() -> None:
    base = derive_token("key-a", ID, "lock")
    variants = [
        derive_token("key-b", ID, "lock"),
        derive_token("key-a", ID, "lock2"),
        derive_token("key-a", TaskIdentity("dag2", "task", ID.run_id, -1, 1, NONCE), "lock"),
        derive_token("key-a", TaskIdentity("dag", "task2", ID.run_id, -1, 1, NONCE), "lock"),
        derive_token("key-a", TaskIdentity("dag", "task", "other", -1, 1, NONCE), "lock"),
        derive_token("key-a", TaskIdentity("dag", "task", ID.run_id, 0, 1, NONCE), "lock"),
        derive_token("key-a", TaskIdentity("dag", "task", ID.run_id, -1, 2, NONCE), "lock"),
        derive_token("key-a", TaskIdentity("dag", "task", ID.run_id, -1, 1, new_nonce()), "lock"),
        # No ambiguity from joining the parts.
        derive_token("key-a", TaskIdentity("da", "gtask", ID.run_id, -1, 1, NONCE), "lock"),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_identity_round_trips_through_primitives() -> None:
    assert TaskIdentity.from_dict(ID.as_dict()) == ID
    assert all(isinstance(v, str | int) for v in ID.as_dict().values())
