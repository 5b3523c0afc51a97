"""VolcanoHook: connection parsing (UI, URI, JSON) and test_connection against the real server."""

from __future__ import annotations

import asyncio
import json

import pytest

from airflow_provider_volcano.hooks.volcano import VolcanoConnectionError, VolcanoHook
from tests.airflow.helpers import volcano_conn_json

SECRET = "sk-not-a-real-key-but-long-enough"


def _env(monkeypatch: pytest.MonkeyPatch, conn_id: str, value: str) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", value)


def test_json_connection_parses_every_field(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(
        monkeypatch,
        "v_json",
        volcano_conn_json("https://api.volcano.dev/", SECRET, anon_key="ak-anon-key-123", timeout="2.5"),
    )
    config = VolcanoHook("v_json").config
    assert config.api_url == "https://api.volcano.dev"
    assert config.service_key == SECRET
    assert config.anon_key == "ak-anon-key-123"
    assert config.timeout == 2.5
    assert SECRET not in repr(config) and "ak-anon-key-123" not in repr(config)


def test_uri_connection_with_protocol_in_host(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, "v_uri", f"volcano://http://:{SECRET}@127.0.0.1:8123/?timeout=4&anon_key=ak-x-12345")
    config = VolcanoHook("v_uri").config
    assert (config.api_url, config.service_key, config.anon_key, config.timeout) == (
        "http://127.0.0.1:8123",
        SECRET,
        "ak-x-12345",
        4.0,
    )


def test_uri_connection_with_quoted_url_as_host(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, "v_uri2", f"volcano://:{SECRET}@http%3A%2F%2Flocalhost%3A9000")
    config = VolcanoHook("v_uri2").config
    assert config.api_url == "http://localhost:9000"
    assert config.anon_key is None
    assert config.timeout == 10.0


def test_bare_host_defaults_to_https_and_keeps_port_and_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(
        monkeypatch,
        "v_bare",
        json.dumps(
            {
                "conn_type": "volcano",
                "host": "locks.example",
                "port": 8443,
                "schema": "v1",
                "password": SECRET,
            }
        ),
    )
    assert VolcanoHook("v_bare").config.api_url == "https://locks.example:8443/v1"


@pytest.mark.parametrize(
    ("host", "port", "url"),
    [
        # What the form saves when Port is filled in for Airflow 3.3.2's Test icon.
        ("https://api.volcano.dev", 443, "https://api.volcano.dev"),
        ("http://127.0.0.1", 8123, "http://127.0.0.1:8123"),
        ("http://127.0.0.1:8123", 8123, "http://127.0.0.1:8123"),
        ("http://127.0.0.1:8123", None, "http://127.0.0.1:8123"),
        ("http://127.0.0.1", 80, "http://127.0.0.1"),
        # Airflow's Host field takes a host without a scheme: the core's rule gives it one.
        ("api.volcano.dev", None, "https://api.volcano.dev"),
        ("127.0.0.1", 8123, "http://127.0.0.1:8123"),
        ("localhost:8123", None, "http://localhost:8123"),
    ],
)
def test_port_field_names_the_same_endpoint_as_the_url(
    monkeypatch: pytest.MonkeyPatch, host: str, port: int | None, url: str
) -> None:
    _env(
        monkeypatch,
        "v_port",
        json.dumps({"conn_type": "volcano", "host": host, "port": port, "password": SECRET}),
    )
    assert VolcanoHook("v_port").config.api_url == url


def test_missing_key_names_the_form_field_not_airflows_internal_one(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, "v_nokey", json.dumps({"conn_type": "volcano", "host": "http://x.test"}))
    ok, message = VolcanoHook("v_nokey").test_connection()
    assert not ok
    assert "Service key" in message
    assert "password" not in message.lower()


def test_prefixed_extra_names_of_older_uis_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(
        monkeypatch,
        "v_old",
        volcano_conn_json("http://x.test", SECRET, extra__volcano__anon_key="ak-old-12345"),
    )
    assert VolcanoHook("v_old").config.anon_key == "ak-old-12345"


def test_async_parse_matches_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, "v_async", volcano_conn_json("http://x.test:1", SECRET, timeout=3))
    assert asyncio.run(VolcanoHook("v_async").aget_config()) == VolcanoHook("v_async").config


def test_hook_timeout_overrides_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, "v_to", volcano_conn_json("http://x.test:1", SECRET, timeout=3))
    assert VolcanoHook("v_to", timeout=7).config.timeout == 7.0


@pytest.mark.parametrize(
    ("conn", "message"),
    [
        ({"conn_type": "volcano", "password": SECRET}, "has no API URL: set its API URL field"),
        ({"conn_type": "volcano", "host": "http://x.test"}, "has no service key: set its Service key field"),
        ({"conn_type": "volcano", "host": "ftp://x.test", "password": SECRET}, "is not an http(s) URL"),
        ({"conn_type": "volcano", "host": "http://x.test:99999", "password": SECRET}, "invalid port"),
        (
            {"conn_type": "volcano", "host": "http://x.test:8000", "port": 9000, "password": SECRET},
            "Port 9000 differs from the port of API URL 'http://x.test:8000'",
        ),
        (
            {"conn_type": "volcano", "host": "http://x.test", "port": 70000, "password": SECRET},
            "Port must be a TCP port (1-65535), got 70000",
        ),
        (
            {
                "conn_type": "volcano",
                "host": "http://x.test",
                "password": SECRET,
                "extra": {"timeout": "soon"},
            },
            "timeout must be a number of seconds, got 'soon'",
        ),
        (
            {"conn_type": "volcano", "host": "http://x.test", "password": SECRET, "extra": {"timeout": -1}},
            "timeout must be a positive number",
        ),
        (
            {"conn_type": "volcano", "host": "http://x.test", "password": SECRET, "extra": "{not json"},
            "Extra field is not valid JSON",
        ),
        (
            {"conn_type": "volcano", "host": "http://x.test", "password": SECRET, "extra": "[1]"},
            "must be a JSON object",
        ),
    ],
)
def test_bad_connections_get_clear_errors(
    monkeypatch: pytest.MonkeyPatch, conn: dict[str, object], message: str
) -> None:
    _env(monkeypatch, "v_bad", json.dumps(conn))
    with pytest.raises(VolcanoConnectionError) as info:
        _ = VolcanoHook("v_bad").config
    assert message in str(info.value)
    assert "'v_bad'" in str(info.value)
    assert SECRET not in str(info.value)
    ok, reason = VolcanoHook("v_bad").test_connection()
    assert not ok and message in reason


def test_missing_connection_names_it() -> None:
    from tests.airflow.versions import AirflowNotFoundException

    with pytest.raises(AirflowNotFoundException, match="v_nowhere"):
        _ = VolcanoHook("v_nowhere").config


def test_test_connection_ok_against_real_server(volcano_conn) -> None:
    ok, message = VolcanoHook().test_connection()
    assert ok, message
    assert volcano_conn.url in message


def test_test_connection_reports_unreachable_url(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _env(monkeypatch, "v_down", volcano_conn_json(f"http://127.0.0.1:{port}", SECRET, timeout=2))
    ok, message = VolcanoHook("v_down").test_connection()
    assert not ok
    assert "Cannot reach the Volcano API" in message and str(port) in message
    assert SECRET not in message


def test_test_connection_reports_bad_key(volcano_server, monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, "v_badkey", volcano_conn_json(volcano_server.url, "not.a.jwt"))
    ok, message = VolcanoHook("v_badkey").test_connection()
    assert not ok and "rejected" in message and "401" in message


def test_test_connection_reports_key_without_locks_manage(
    volcano_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    scoped = volcano_server.mint_key(permissions=["storage.read"])
    _env(monkeypatch, "v_scoped", volcano_conn_json(volcano_server.url, scoped))
    ok, message = VolcanoHook("v_scoped").test_connection()
    assert not ok and "may not manage locks" in message and "403" in message
    anon = volcano_server.anon_key
    _env(monkeypatch, "v_anon", volcano_conn_json(volcano_server.url, anon))
    ok, message = VolcanoHook("v_anon").test_connection()
    assert not ok and "403" in message


def test_waiting_budget_from_the_connection_reaches_the_governor(
    volcano_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A credential of its own: the governor is per process and credential, and this budget is small.
    key = volcano_server.mint_key(permissions=["locks.manage"], ttl_seconds=3600)
    monkeypatch.setenv(
        "AIRFLOW_CONN_VOLCANO_DEFAULT", volcano_conn_json(volcano_server.url, key, wait_budget="30")
    )
    hook = VolcanoHook()
    assert hook.config.wait_budget == 30
    with hook.get_client() as client:
        assert client.governor.wait_budget == 30
        assert client.governor is hook.get_async_client().governor  # one governor per credential


@pytest.mark.parametrize("bad", ["0", "601", "lots", 2.5])
def test_a_bad_waiting_budget_names_the_field(bad: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_VOLCANO_DEFAULT", volcano_conn_json("http://127.0.0.1:1", "k" * 20, wait_budget=bad)
    )
    with pytest.raises(VolcanoConnectionError, match=r"'volcano_default': invalid Waiting budget"):
        _ = VolcanoHook().config
