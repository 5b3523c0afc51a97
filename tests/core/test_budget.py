"""The quota arithmetic the CLI and README quote: holders a TTL supports within 600 requests a minute."""

from __future__ import annotations

import pytest

from volcano_locks.budget import holder_budget, renewals_per_minute


@pytest.mark.parametrize(
    ("ttl", "holders"),
    [(10, 33), (30, 100), (60, 200), (5, 16), (7_776_000, 600)],  # renewed at least once a minute
)
def test_holders_match_the_contract_table(ttl: int, holders: int) -> None:
    assert holder_budget(ttl).holders == holders


def test_reserve_is_taken_off_the_budget() -> None:
    assert holder_budget(30, reserve=60).holders == 90
    assert holder_budget(30, quota=1200).holders == 200


@pytest.mark.parametrize("ttl", [4, 0, -1, True, 30.0, "30"])
def test_bad_ttl_is_named(ttl: object) -> None:
    with pytest.raises(ValueError, match=repr(ttl).replace(".", r"\.")):
        renewals_per_minute(ttl)  # type: ignore[arg-type]


@pytest.mark.parametrize(("quota", "reserve"), [(0, 0), (600, 600), (600, -1), (True, 0)])
def test_bad_quota_or_reserve(quota: object, reserve: object) -> None:
    with pytest.raises(ValueError):
        holder_budget(30, quota=quota, reserve=reserve)  # type: ignore[arg-type]
