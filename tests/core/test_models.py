"""LockLease / LockState: immutable, token never shown, public_dict is the shareable form."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from volcano_locks.models import LeaseFacts, LockLease, LockState

from .helpers import TOKEN, lease


def test_lease_is_frozen_and_hides_token() -> None:
    held = lease(key="jobs")
    with pytest.raises(dataclasses.FrozenInstanceError):
        held.fencing_token = 1  # type: ignore[misc]
    assert TOKEN not in repr(held) and TOKEN not in str(held)
    assert "fencing_token=7" in repr(held)


def test_public_dict_has_no_token() -> None:
    public = lease(key="jobs").public_dict()
    assert set(public) == {"lock_key", "fencing_token", "acquired_at", "expires_at", "ttl"}
    assert public["lock_key"] == "jobs" and public["fencing_token"] == 7
    assert str(public["expires_at"]).endswith("+00:00")
    assert TOKEN not in repr(public)


def test_state_defaults_and_pickles() -> None:
    assert LockState(held=False) == LockState(False, None, None)
    held = lease()
    assert pickle.loads(pickle.dumps(held)) == held
    assert isinstance(held, LockLease)


def test_lease_facts_are_the_one_public_form_and_round_trip() -> None:
    held = lease(key="jobs", ttl=45)
    facts = held.facts()
    assert isinstance(facts, LeaseFacts) and facts.ttl == 45 and facts.fencing_token == 7
    assert LeaseFacts.from_dict(facts.as_dict()) == facts
    assert held.public_dict() == facts.as_dict()
    assert not any(f.name == "token" for f in dataclasses.fields(LeaseFacts))
