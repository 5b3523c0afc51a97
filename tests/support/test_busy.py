"""``tests.support.busy`` counts the neighbours a machine already has, and starts only the rest."""

from __future__ import annotations

import pytest

from tests.support import busy as busy_module
from tests.support.busy import burners, burners_needed, busy, neighbours


@pytest.mark.parametrize(("want", "load", "started"), [(2, 0.4, 2), (2, 1.9, 1), (2, 2.0, 0), (2, 6.5, 0)])
def test_only_the_missing_neighbours_are_started(want: int, load: float, started: int) -> None:
    assert burners_needed(want, load) == started


def test_a_declared_neighbour_count_starts_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOLCANO_TEST_NEIGHBOURS", "3")
    with busy(2) as started:
        assert started == 0


def test_a_bad_declared_count_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOLCANO_TEST_NEIGHBOURS", "lanes")
    with pytest.raises(ValueError, match=r"VOLCANO_TEST_NEIGHBOURS.*'lanes'"):
        neighbours()


def test_processes_running_now_count_before_the_load_average_catches_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two CPU-bound processes started a moment ago are seen at once (the 1-minute average lags)."""
    monkeypatch.delenv("VOLCANO_TEST_NEIGHBOURS", raising=False)
    monkeypatch.setattr(busy_module.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    with burners(2):
        assert neighbours() >= 1  # two spinners on two cores: at least one is seen running in most samples
