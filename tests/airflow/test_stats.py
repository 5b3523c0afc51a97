"""The lock metrics through Airflow's Stats: with ``[metrics] statsd_on`` they reach a StatsD listener under
Airflow's prefix, named the Airflow way, and ``[metrics]``'s allow list applies to them."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

import airflow_provider_volcano  # noqa: F401  (registers the Stats sink, as any use of the provider does)
from tests.support.metrics import points
from volcano_locks import LockContention, VolcanoLocks
from volcano_locks.server.harness import LocalServer

PREFIX = "airflow"


def _stats_to(monkeypatch: pytest.MonkeyPatch, port: int, **metrics: str) -> None:
    """Airflow's Stats set up as a task process does, from ``[metrics]`` in the environment."""
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    settings = {"statsd_on": "True", "statsd_host": "127.0.0.1", "statsd_port": str(port), **metrics}
    settings["statsd_prefix"] = PREFIX
    for name, value in settings.items():
        monkeypatch.setenv(f"AIRFLOW__METRICS__{name.upper()}", value)
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)


@pytest.fixture
def statsd(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A StatsD listener on a free UDP port of the loopback; Airflow's Stats reset to none after the test."""
    from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
    from airflow.sdk.observability import stats

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(0.5)
        try:
            yield sock
        finally:
            _close_statsd_client()
            stats.initialize(factory=NoStatsLogger, export_legacy_names=False)


def _close_statsd_client() -> None:
    """Close the UDP socket of the StatsD client Airflow made (it never closes it; warnings are errors)."""
    from airflow.sdk._shared.observability.metrics import stats as shared

    client = getattr(shared._get_backend(), "statsd", None)
    sock = getattr(client, "_sock", None)
    if sock is not None:
        sock.close()


def _received(sock: socket.socket) -> list[str]:
    lines: list[str] = []
    while True:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return lines
        lines += data.decode().splitlines()


def _hold_and_contend(server: LocalServer, key: str) -> None:
    with (
        VolcanoLocks(server.url, service_key=server.service_key) as locks,
        locks.with_lock(key, 30),
        pytest.raises(LockContention),
    ):
        locks.acquire(key, 30)


def test_lock_metrics_reach_statsd_under_airflows_prefix(
    statsd: socket.socket,
    monkeypatch: pytest.MonkeyPatch,
    volcano_server: LocalServer,
    unique_key: str,
    metric_reader: Any,
) -> None:
    _stats_to(monkeypatch, statsd.getsockname()[1])
    _hold_and_contend(volcano_server, unique_key)
    lines = _received(statsd)
    names = {line.split(":")[0]: line.split("|")[1] for line in lines}
    assert names[f"{PREFIX}.volcano.lock.requests.acquire.201"] == "c"
    assert names[f"{PREFIX}.volcano.lock.requests.acquire.409"] == "c"
    assert names[f"{PREFIX}.volcano.lock.contentions"] == "c"
    assert names[f"{PREFIX}.volcano.lock.hold.duration.released"] == "ms"
    assert names[f"{PREFIX}.volcano.lock.leases"] == "g"
    assert f"{PREFIX}.volcano.lock.leases:+1|g" in lines and f"{PREFIX}.volcano.lock.leases:-1|g" in lines
    assert not any(unique_key in line for line in lines)  # keys stay off unless allowed
    # Through Stats only: a global MeterProvider (Airflow sets one with otel_on) does not get them twice.
    assert not points(metric_reader, "volcano.lock.hold.duration")


def test_the_allow_list_of_metrics_applies(
    statsd: socket.socket, monkeypatch: pytest.MonkeyPatch, volcano_server: LocalServer, unique_key: str
) -> None:
    _stats_to(monkeypatch, statsd.getsockname()[1], metrics_allow_list="volcano.lock.hold")
    _hold_and_contend(volcano_server, unique_key)
    names = {line.split(":")[0] for line in _received(statsd)}
    assert names == {f"{PREFIX}.volcano.lock.hold.duration.released"}
