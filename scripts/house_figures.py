"""The Airflow provider's house figures (issue 27): what a newcomer reads to change how a task waits.

Prints one markdown table: the provider's function-level imports (import statements inside a function
or method, ``if TYPE_CHECKING:`` blocks not counted), the lines of the trigger module and of the
operator module, and the private modules flat at the provider's root. ``tests/airflow/test_layout.py``
holds the limits; this script only reports.

Usage: python scripts/house_figures.py [--where]   (``--where`` lists each function-level import)
"""

from __future__ import annotations

import argparse
import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROVIDER = REPO / "airflow_provider_volcano"

__all__ = ["HouseFigures", "function_level_imports", "house_figures"]


@dataclass(frozen=True)
class HouseFigures:
    """The figures, each with the limit issue 27 sets."""

    function_imports: int
    trigger_lines: int
    operator_lines: int
    flat_private_modules: tuple[str, ...]


def function_level_imports(path: Path) -> list[int]:
    """The line of every import statement inside a function of ``path``."""
    found: list[int] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import | ast.ImportFrom) and in_function:
                found.append(child.lineno)
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(ast.parse(path.read_text()), False)
    return found


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def house_figures(provider: Path = PROVIDER) -> tuple[HouseFigures, dict[str, list[int]]]:
    """The figures of ``provider``, and where each function-level import is (module -> lines)."""
    where = {
        str(path.relative_to(provider.parent)): lines
        for path in sorted(provider.rglob("*.py"))
        if (lines := function_level_imports(path))
    }
    flat = tuple(sorted(p.name for p in provider.glob("_*.py") if p.name != "__init__.py"))
    figures = HouseFigures(
        function_imports=sum(len(lines) for lines in where.values()),
        trigger_lines=_lines(provider / "triggers" / "lock.py"),
        operator_lines=_lines(provider / "operators" / "lock.py"),
        flat_private_modules=flat,
    )
    return figures, where


def main() -> None:
    """Print the table (and with ``--where``, each function-level import)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--where", action="store_true", help="list each function-level import")
    args = parser.parse_args()
    figures, where = house_figures()
    print("| figure | now | limit (issue 27) |")
    print("| --- | ---: | ---: |")
    print(f"| function-level imports in the provider | {figures.function_imports} | 15 |")
    print(f"| lines of triggers/lock.py | {figures.trigger_lines} | 250 |")
    print(f"| lines of operators/lock.py | {figures.operator_lines} | about 300 |")
    flat = ", ".join(figures.flat_private_modules)
    print(
        f"| private modules flat at the provider's root | {len(figures.flat_private_modules)} ({flat}) | 5 |"
    )
    if args.where:
        print()
        for module, lines in where.items():
            print(f"{module}: {', '.join(map(str, lines))}")


if __name__ == "__main__":
    main()
