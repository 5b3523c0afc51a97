"""The fenced-lake example's stores: built once per process, so a run pays no first-use cost.

``flows/fenced_lake.py`` (and ``dags/volcano_fenced_lake.py``, the same helpers) used to build an engine,
create its table and a new FencedSQL on every run. Its runs (tests/prefect/test_flows.py, the Airflow
test_dags.py) show what it writes; this shows what a second run in a process costs: the guard and its own
statements, nothing else.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import sqlalchemy as sa

from volcano_locks.fencing import Fence

FLOW = Path(__file__).resolve().parents[2] / "flows" / "fenced_lake.py"


def _load() -> ModuleType:
    name = "flows_fenced_lake"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, FLOW)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_a_second_run_in_a_process_reuses_the_warehouse_and_sends_only_its_statements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _load()
    monkeypatch.setenv("VOLCANO_EXAMPLES_SQLALCHEMY_URL", f"sqlite:///{tmp_path / 'warehouse.sqlite3'}")
    first = module.warehouse()
    with first.begin("sales:2026-11-30", Fence("sales:2026-11-30", 1)) as conn:  # a first run: creates
        conn.execute(module.daily_sales.delete().where(module.daily_sales.c.day == "2026-11-30"))
    again = module.warehouse()
    assert again is first  # one engine and one FencedSQL per process and URL
    sent: list[str] = []
    sa.event.listen(again.engine, "before_cursor_execute", lambda *a, **_: sent.append(str(a[2]).split()[0]))
    with again.begin("sales:2026-11-30", Fence("sales:2026-11-30", 2)) as conn:
        conn.execute(module.daily_sales.delete().where(module.daily_sales.c.day == "2026-11-30"))
    assert sent == ["INSERT", "DELETE"]  # the guard, then the run's own statement
    assert module.lake("2026-11-30").client is module.lake("2026-12-01").client  # one S3 client too
    first.engine.dispose()
