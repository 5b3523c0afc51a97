"""Dependencies in the core run one way, and the integrations take their rules from the core.

The graph counts every import between ``volcano_locks`` modules, those made only for type checking
too: a cycle hidden behind ``TYPE_CHECKING`` is still two modules that cannot be understood apart.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "volcano_locks"


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, known: set[str]) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        out |= {name for name in names if name in known}
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (package ``__init__`` files excluded as targets)."""
    files = {_module(p): p for p in root.rglob("*.py")}
    known = {name for name, path in files.items() if path.name != "__init__.py"}
    return {name: _imports(path, known) - {name} for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle in ``graph`` as a path that returns to its start, or ``None``."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_core_has_no_import_cycle() -> None:
    graph = import_graph(CORE)
    assert graph.get("volcano_locks.client")  # the graph is not empty
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_guard_and_the_wait_engine_do_not_depend_on_the_client() -> None:
    graph = import_graph(CORE)
    assert "volcano_locks.client" not in graph["volcano_locks.guard"]
    assert "volcano_locks.client" not in graph["volcano_locks.waiting"]


@pytest.mark.parametrize("package", ["airflow_provider_volcano", "prefect_volcano"])
def test_integrations_keep_no_copy_of_the_key_grammar_or_the_ttl_bounds(package: str) -> None:
    rules = {
        "the key grammar": re.compile(r"A-Za-z0-9\]\[A-Za-z0-9"),
        "the 90-day TTL bound": re.compile(r"7_?776_?000"),
    }
    for path in (REPO / package).rglob("*.py"):
        text = path.read_text()
        for what, pattern in rules.items():
            assert not pattern.search(text), f"{path.relative_to(REPO)} keeps its own copy of {what}"
