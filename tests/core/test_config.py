"""Settings from arguments or VOLCANO_* variables, rejected at construction when missing or malformed."""

from __future__ import annotations

import pytest

from volcano_locks import AsyncVolcanoLocks, InvalidRequest, VolcanoLocks
from volcano_locks.config import resolve_config


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
        (("ftp://h", None, "k", 10), "invalid API URL 'ftp://h'"),
        (("localhost:8000", None, "k", 10), "invalid API URL"),
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


def test_bad_key_value_is_not_echoed() -> None:
    with pytest.raises(InvalidRequest) as info:
        VolcanoLocks("http://h", service_key="abc def-secret")
    assert "secret" not in str(info.value)
