"""The fault plan: every run, even the short default, attacks from every side."""

from __future__ import annotations

import pytest

from .scheduler import BASE_SPECS, MAX_DELAY, SPECS, plan


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


def _max_delay(spec: str) -> float:
    delays = [float(r.split(":")[0].split("-")[-1]) for r in spec.split(",") if r.startswith("delay=")]
    return max(delays, default=0.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_holder_kills_come_long_after_any_long_delay_fault(seed: int) -> None:
    """A renewal held up in the server must not extend a killed holder's lease into the measurement."""
    actions = plan(300, ttl=5, poll=1.0, servers=2, seed=seed)
    long_delay_until = 0.0
    for i, a in enumerate(actions):
        if a.kind == "faults":
            following = [b for b in actions[i + 1 :] if b.kind == "faults"]
            ends = following[0].at if following else a.at
            if _max_delay(a.params["spec"]) > 1.0:
                long_delay_until = max(long_delay_until, ends)
        if a.kind == "worker_kill":
            assert a.at - long_delay_until >= MAX_DELAY, (a, long_delay_until)
    assert all(_max_delay(SPECS[n]) <= 1.0 for n in BASE_SPECS)


def test_long_run_rotates_server_kills_and_specs() -> None:
    actions = plan(600, ttl=5, poll=1.0, servers=2, seed=1)
    killed = {a.params["server"] for a in actions if a.kind == "server_kill"}
    assert killed == {0, 1}
    assert sum(a.kind == "worker_stop" for a in actions) >= 20
    assert {a.params["name"] for a in actions if a.kind == "faults"} >= set(SPECS)
    assert max(_max_delay(spec) for spec in SPECS.values()) == MAX_DELAY


def test_latency_spikes_reach_past_the_renewal_window_and_the_ttl() -> None:
    # Renewal is due at ttl/3; the "spikes" spec delays renewals by up to 8 s > ttl.
    assert "delay=4-8" in SPECS["spikes"] and "op=renew" in SPECS["spikes"]


def test_plan_is_reproducible_and_validates() -> None:
    assert plan(60, ttl=5, poll=1.0, servers=1, seed=7) == plan(60, ttl=5, poll=1.0, servers=1, seed=7)
    with pytest.raises(ValueError):
        plan(10, ttl=4, poll=1.0, servers=1)
