"""The fault plan: every run, even the short default, attacks from every side."""

from __future__ import annotations

import pytest

from .scheduler import BASE_SPECS, CLOCK_GAIN, HOLDER_CUTS, MAX_DELAY, SPECS, WAITER_CUTS, Action, plan


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
    assert sum(a.kind == "worker_stop" for a in actions) >= 14  # cycles of about 40 s
    assert {a.params["name"] for a in actions if a.kind == "faults"} >= set(SPECS)
    assert max(_max_delay(spec) for spec in SPECS.values()) == MAX_DELAY


def test_latency_spikes_reach_past_the_renewal_window_and_the_ttl() -> None:
    # Renewal is due at ttl/3; the "spikes" spec delays renewals by up to 8 s > ttl.
    assert "delay=4-8" in SPECS["spikes"] and "op=renew" in SPECS["spikes"]


def test_plan_is_reproducible_and_validates() -> None:
    assert plan(60, ttl=5, poll=1.0, servers=1, seed=7) == plan(60, ttl=5, poll=1.0, servers=1, seed=7)
    with pytest.raises(ValueError):
        plan(10, ttl=4, poll=1.0, servers=1)


def _server_clock(actions: list[Action], step: float = 0.05) -> list[tuple[float, float]]:
    """(real, server) seconds from the start, sampled every ``step``, as the plan's clock actions move it."""
    changes = sorted((a.at, a.params) for a in actions if a.kind == "clock")
    samples, real, server, rate = [], 0.0, 0.0, 1.0
    end = max(a.at for a in actions) + 10.0
    i = 0
    while real <= end:
        while i < len(changes) and changes[i][0] <= real:
            server += changes[i][1].get("jump", 0.0)
            rate = changes[i][1].get("rate", rate)
            i += 1
        samples.append((real, server))
        real += step
        server += rate * step
    return samples


@pytest.mark.parametrize("first_cycle", [0, 1, 2, 3])
def test_clock_faults_never_gain_the_grace_second_within_a_ttl(first_cycle: int) -> None:
    """What the contract can absorb (docs/chaos.md): the server's clock never gains 1 s on real time
    within one TTL; and every cycle ends with the clock back on real time, at its normal rate."""
    ttl = 5
    actions = plan(120, ttl=ttl, poll=1.0, servers=2, seed=first_cycle, first_cycle=first_cycle)
    samples = _server_clock(actions)
    steps = int(ttl / 0.05)
    gains = [(s2 - s1) - (r2 - r1) for (r1, s1), (r2, s2) in zip(samples, samples[steps:], strict=False)]
    assert max(gains) <= CLOCK_GAIN + 1e-6 < 1.0
    assert min(gains) < -1.0  # it does step back
    last_real, last_server = samples[-1]
    assert last_server - last_real == pytest.approx(0.0, abs=1e-6)
    rates = [a.params["rate"] for a in actions if a.kind == "clock" and "rate" in a.params]
    assert max(rates) > 1.1 and min(rates) < 0.9 and rates[-1] == 1.0


def test_every_cycle_cuts_a_holder_and_a_waiter_off_rotating_how() -> None:
    actions = plan(600, ttl=5, poll=1.0, servers=2, seed=1)
    cuts = [a.params for a in actions if a.kind == "cut"]
    holders = {(c["up"], c["down"]) for c in cuts if c["target"] == "holder"}
    waiters = {(c["up"], c["down"]) for c in cuts if c["target"] == "waiter"}
    assert holders == set(HOLDER_CUTS) and waiters == set(WAITER_CUTS)
    assert all(c["duration"] > 5 + 1 for c in cuts if c["target"] == "holder")  # past TTL + grace
    # The short run gives each backend its own first cycle, so between them two kinds of cut are seen.
    short = [plan(20, ttl=5, poll=1.0, servers=s, first_cycle=k) for s, k in ((1, 0), (2, 1))]
    assert len({(a.params["up"], a.params["down"]) for p in short for a in p if a.kind == "cut"}) == 4
