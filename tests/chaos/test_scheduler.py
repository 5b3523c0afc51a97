"""The fault plan: every run, even the short default, attacks from every side."""

from __future__ import annotations

import pytest

from .scheduler import SPECS, plan


@pytest.mark.parametrize("servers", [1, 2])
def test_short_run_has_every_kind_of_fault(servers: int) -> None:
    actions = plan(20, ttl=5, poll=1.0, servers=servers)
    kinds = [a.kind for a in actions]
    for kind in ("worker_kill", "await_takeover", "spawn_worker", "worker_stop", "server_kill"):
        assert kind in kinds
    specs = {a.params["name"] for a in actions if a.kind == "faults"}
    assert {"mixed", "spikes", "stall", "quiet"} <= specs
    assert [a.at for a in actions] == sorted(a.at for a in actions)
    assert actions[-1].params["spec"] == ""  # faults off for the drain


def test_stop_outlasts_the_takeover_bound_and_server_kill_lands_inside_it() -> None:
    for action_index, action in enumerate(acts := plan(120, ttl=5, poll=1.0, servers=2, seed=3)):
        if action.kind == "worker_stop":
            assert action.params["duration"] > 5 + 1 + 1.0
            kill = acts[action_index + 1]
            assert kill.kind == "server_kill"
            assert action.at < kill.at < action.at + action.params["duration"]


def test_long_run_rotates_server_kills_and_specs() -> None:
    actions = plan(600, ttl=5, poll=1.0, servers=2, seed=1)
    killed = {a.params["server"] for a in actions if a.kind == "server_kill"}
    assert killed == {0, 1}
    assert sum(a.kind == "worker_stop" for a in actions) >= 20
    assert {a.params["name"] for a in actions if a.kind == "faults"} >= set(SPECS)


def test_latency_spikes_reach_past_the_renewal_window_and_the_ttl() -> None:
    # Renewal is due at ttl/3; the "spikes" spec delays renewals by up to 8 s > ttl.
    assert "delay=4-8" in SPECS["spikes"] and "op=renew" in SPECS["spikes"]


def test_plan_is_reproducible_and_validates() -> None:
    assert plan(60, ttl=5, poll=1.0, servers=1, seed=7) == plan(60, ttl=5, poll=1.0, servers=1, seed=7)
    with pytest.raises(ValueError):
        plan(10, ttl=4, poll=1.0, servers=1)
