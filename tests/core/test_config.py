"""Settings from arguments or VOLCANO_* variables, rejected at construction when missing or malformed."""

from __future__ import annotations

import pytest

from volcano_locks import AsyncVolcanoLocks, InvalidRequest, VolcanoLocks
from volcano_locks.config import api_url_from, resolve_config


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("VOLCANO_API_URL", "VOLCANO_ANON_KEY", "VOLCANO_SERVICE_KEY"):
        monkeypatch.delenv(name, raising=False)


def test_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOLCANO_API_URL", "http://127.0.0.1:9/")
    monkeypatch.setenv("VOLCANO_SERVICE_KEY", "svc-secret-value")
    monkeypatch.setenv("VOLCANO_ANON_KEY", "anon-secret-value")
    cfg = resolve_config(None, None, None, 10)
    assert (
        cfg.api_url == "http://127.0.0.1:9" and cfg.service_key == "svc-secret-value" and cfg.timeout == 10.0
    )
    assert "secret-value" not in repr(cfg)
    with VolcanoLocks() as client:
        assert "secret-value" not in repr(client) and client.api_url == "http://127.0.0.1:9"


def test_arguments_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOLCANO_API_URL", "http://env:1")
    monkeypatch.setenv("VOLCANO_SERVICE_KEY", "env-key")
    cfg = resolve_config("https://arg.example/base", None, "arg-key", 2.5)
    assert (cfg.api_url, cfg.service_key, cfg.timeout) == ("https://arg.example/base", "arg-key", 2.5)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((None, None, "k", 10), "missing API URL.*VOLCANO_API_URL"),
        (("http://h", None, None, 10), "missing service key.*VOLCANO_SERVICE_KEY"),
        (("http://h", None, "  ", 10), "missing service key"),
        (("ftp://h", None, "k", 10), "API URL 'ftp://h' is not an http\\(s\\) URL with a host"),
        (("https://h:99999", None, "k", 10), "API URL 'https://h:99999' has an invalid port"),
        (("https://a b", None, "k", 10), "API URL 'https://a b' is not"),
        (("http://h", None, "k", 0), "invalid timeout 0"),
        (("http://h", None, "k", True), "invalid timeout True"),
        (("http://h", None, "k", float("inf")), "invalid timeout inf"),
    ],
)
def test_rejected_at_construction(args: tuple[object, ...], match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        VolcanoLocks(*args[:3], timeout=args[3])  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match=match):
        AsyncVolcanoLocks(*args[:3], timeout=args[3])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("typed", "url"),
    [
        # Without a scheme: https, as a browser's address bar; http only for a loopback host.
        ("api.volcano.dev", "https://api.volcano.dev"),
        ("locks.example:8443/v1/", "https://locks.example:8443/v1"),
        ("10.0.0.7:8000", "https://10.0.0.7:8000"),
        ("localhost:8000", "http://localhost:8000"),
        ("127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("127.8.9.10", "http://127.8.9.10"),
        ("[::1]:8000", "http://[::1]:8000"),
        # A scheme typed is kept as typed, whichever host.
        ("https://localhost:8443", "https://localhost:8443"),
        ("http://api.volcano.dev/", "http://api.volcano.dev"),
        ("  https://api.volcano.dev  ", "https://api.volcano.dev"),
    ],
)
def test_api_url_without_a_scheme_gets_one(typed: str, url: str) -> None:
    assert api_url_from(typed) == url
    with VolcanoLocks(typed, service_key="k") as client:
        assert client.api_url == url


def test_api_url_from_the_environment_follows_the_same_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOLCANO_API_URL", "127.0.0.1:8000")
    assert resolve_config(None, None, "k", 10).api_url == "http://127.0.0.1:8000"


def test_bad_key_value_is_not_echoed() -> None:
    with pytest.raises(InvalidRequest) as info:
        VolcanoLocks("http://h", service_key="abc def-secret")
    assert "secret" not in str(info.value)
