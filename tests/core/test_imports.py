"""Dependencies run one way in every package of the repository; the integrations take the core's rules.

The graph is read from the source (no package is imported, so this runs in either environment) and
counts every import statement between the repository's modules: module-level ones, those made only for
type checking (``if TYPE_CHECKING:``) and those inside functions. A cycle hidden behind
``TYPE_CHECKING`` or deferred into a function is still two modules that cannot be understood apart;
deferring an import for start-up cost is fine, as long as it does not close a circle. Relative imports
are resolved against the importing module's package. What is not seen: ``importlib.import_module``
with a computed name, and the implicit import of a parent package's ``__init__`` (``from a.b import c``
runs ``a/__init__.py``, but only ``a.b`` or ``a.b.c`` is the module the code asked for).
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The import cycles on the base of issue 21 (649235d), each owned by another change of that issue. The
# test fails when one of them is gone, so that it is removed from here: the set only ever shrinks.
KNOWN_CYCLES: set[frozenset[str]] = set()


def repository_packages(repo: Path) -> list[str]:
    """The packages the wheel ships (pyproject.toml), the repository's importable code."""
    pyproject = tomllib.loads((repo / "pyproject.toml").read_text())
    return list(pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"])


def _module(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, wherever it is (functions, TYPE_CHECKING blocks, try...)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, known: set[str]) -> set[str]:
    """The repository's modules that one import statement asks for."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    if node.level:
        # ``from .x import y`` in a.b.c (a module) is a.b.x; in a.b (a package's __init__) it is a.b.x too.
        base = importer if is_package else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        module = ".".join(part for part in (base, node.module) if part)
    else:
        module = node.module or ""
    out: set[str] = set()
    for alias in node.names:
        if f"{module}.{alias.name}" in known:
            out.add(f"{module}.{alias.name}")  # ``from pkg import submodule``
        elif module in known:
            out.add(module)  # ``from module import name``: the module (a package's __init__ for a package)
    return out


def import_graph(root: Path, packages: list[str]) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` (under ``root``) it imports, by any import statement."""
    files = {_module(root, path): path for package in packages for path in (root / package).rglob("*.py")}
    known = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        graph[name] = set().union(*(_targets(n, name, is_package, known) for n in _import_nodes(tree))) - {
            name
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The groups of modules that import each other (strongly connected components of two or more)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group: set[str] = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                found.add(frozenset(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def find_cycle(graph: dict[str, set[str]], within: frozenset[str] | None = None) -> list[str] | None:
    """One cycle of ``graph`` (restricted to ``within``) as a path that returns to its start, or ``None``."""
    nodes = set(graph) if within is None else set(within)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, set()) & nodes):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (path := visit(nxt)):
                return path
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(nodes):
        if node not in state and (path := visit(node)):
            return path
    return None


def _show(graph: dict[str, set[str]], group: frozenset[str]) -> str:
    return " -> ".join(find_cycle(graph, group) or sorted(group))


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(REPO, repository_packages(REPO))


def test_the_cycle_finders_find_cycles() -> None:
    ring = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(ring) == ["a", "b", "c", "a"]
    assert cycles(ring) == {frozenset("abc")}
    line = {"a": {"b"}, "b": set(), "c": {"a", "b"}}
    assert find_cycle(line) is None
    assert cycles(line) == set()
    two = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "a"}}
    assert cycles(two) == {frozenset("ab"), frozenset("cd")}


def test_the_graph_sees_relative_type_checking_and_function_level_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import A\n")
    (pkg / "a.py").write_text("from . import b\nfrom .sub import c\nA = 1\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.c import C\n"
    )
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text(
        "def f():\n    from ..a import A\n    from .. import b\n    import pkg.d\n"
    )
    (pkg / "d.py").write_text("from pkg import A\nimport os\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b", "pkg.sub.c"},
        "pkg.b": {"pkg.sub.c"},
        "pkg.sub": set(),
        "pkg.sub.c": {"pkg.a", "pkg.b", "pkg.d"},
        "pkg.d": {"pkg"},  # the package's __init__, named by the import
    }
    assert cycles(graph) == {frozenset({"pkg", "pkg.a", "pkg.b", "pkg.sub.c", "pkg.d"})}


def test_every_package_of_the_repository_is_in_the_graph(graph: dict[str, set[str]]) -> None:
    on_disk = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests"}
    assert set(repository_packages(REPO)) == on_disk
    for module in (
        "volcano_locks.client",
        "volcano_locks.server.app",
        "volcano_locks.fencing.sql",
        "airflow_provider_volcano.triggers.lock",
        "prefect_volcano.locked",
    ):
        assert graph.get(module), f"{module} imports nothing of the repository: the graph is not being read"


def test_no_package_has_an_import_cycle(graph: dict[str, set[str]]) -> None:
    found = cycles(graph)
    new = [_show(graph, group) for group in found - KNOWN_CYCLES]
    assert not new, "import cycles: " + "; ".join(sorted(new))
    gone = [" <-> ".join(sorted(group)) for group in KNOWN_CYCLES - found]
    assert not gone, "no longer a cycle, remove it from KNOWN_CYCLES: " + "; ".join(gone)


def test_only_the_modules_above_the_client_import_it(graph: dict[str, set[str]]) -> None:
    # Inside the core (the integrations sit above all of it and may name the clients).
    importers = {
        name
        for name, deps in graph.items()
        if name.split(".")[0] == "volcano_locks" and "volcano_locks.client" in deps
    }
    assert importers <= {"volcano_locks", "volcano_locks.sdk", "volcano_locks.cli_ops"}, importers


def test_the_guard_and_the_wait_engine_do_not_depend_on_the_client(graph: dict[str, set[str]]) -> None:
    engine = [
        name for name in graph if name == "volcano_locks.waiting" or name.startswith("volcano_locks.waiting.")
    ]
    assert engine
    for name in ["volcano_locks.guard", *engine]:
        assert "volcano_locks.client" not in graph[name], name


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


def _core_imports(package: str) -> Iterator[tuple[str, str, str]]:
    """Every ``(file, module, name)`` that ``package`` imports from the core, wherever the import is."""
    for path in sorted((REPO / package).rglob("*.py")):
        for node in _import_nodes(ast.parse(path.read_text())):
            where = str(path.relative_to(REPO))
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "volcano_locks":
                        yield where, alias.name, "*"
            elif node.module is not None and node.module.split(".")[0] == "volcano_locks" and not node.level:
                for alias in node.names:
                    yield where, node.module, alias.name


@pytest.mark.parametrize("package", ["airflow_provider_volcano", "prefect_volcano"])
def test_integrations_take_from_the_core_only_what_it_declares_for_them(package: str) -> None:
    """The core's front door (``volcano_locks.__all__``) and ``volcano_locks.integration``, nothing else."""
    declared = {
        "volcano_locks": {*_all_of(REPO / "volcano_locks" / "__init__.py"), "__version__"},
        "volcano_locks.integration": _all_of(REPO / "volcano_locks" / "integration.py"),
        # The user-facing packages: their __all__ is public API, as users import it.
        "volcano_locks.once": _all_of(REPO / "volcano_locks" / "once" / "__init__.py"),
        "volcano_locks.fencing": _all_of(REPO / "volcano_locks" / "fencing" / "__init__.py"),
    }
    taken = list(_core_imports(package))
    assert taken, f"{package} imports nothing from the core: the test reads the wrong files"
    stray = [
        f"{where}: from {module} import {name}"
        for where, module, name in taken
        if name not in declared.get(module, ())
    ]
    assert stray == [], "imports past the core's declared names:\n" + "\n".join(stray)


def _all_of(path: Path) -> set[str]:
    """The names a module lists in ``__all__`` (literals, or the names of the tables it is built from)."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            names: set[str] = set()
            for const in ast.walk(node.value):
                if isinstance(const, ast.Constant) and isinstance(const.value, str):
                    names.add(const.value)
            if "_FROM" in ast.unparse(node.value):  # volcano_locks.integration: sorted(_FROM)
                names |= _dict_keys(tree, "_FROM")
            if "_LAZY" in ast.unparse(node.value):  # volcano_locks: its lazily loaded names
                names |= _dict_keys(tree, "_LAZY")
            if "_errors.__all__" in ast.unparse(node.value):
                names |= _all_of(path.parent / "errors.py")
            return names
    raise AssertionError(f"{path} has no __all__")


def _dict_keys(tree: ast.Module, name: str) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            assert isinstance(node.value, ast.Dict)
            return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    raise AssertionError(f"no {name} in the module")
