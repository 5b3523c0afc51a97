"""The optional parts of the distribution: which modules each extra brings, and the error naming the extra.

``pip install 'volcano-locks[airflow]'`` (or ``[prefect]``) brings what a scheduler, worker or triggerer
needs and nothing of the local server; ``[server]`` adds the server's libraries. A part that needs an extra
calls :func:`require` before importing them, so a missing one fails with the command that installs it
rather than with a bare ``ModuleNotFoundError`` from deep inside the part.
"""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRA_MODULES", "MissingExtra", "require"]

EXTRA_MODULES: dict[str, dict[str, str]] = {
    "server": {
        "h11": "h11",
        "jwt": "pyjwt",
        "psycopg": "psycopg",
        "psycopg_pool": "psycopg-pool",
        "platformdirs": "platformdirs",
    },
}
"""Per extra, the modules it brings (import name -> distribution); pyproject.toml's extras list them too
(``tests/packaging/test_release.py`` holds the two together)."""


class MissingExtra(ModuleNotFoundError):
    """A part of volcano-locks was used without the extra that installs its libraries."""

    def __init__(self, extra: str, part: str, missing: list[str]) -> None:
        super().__init__(
            f"{part} needs the {extra!r} extra: pip install 'volcano-locks[{extra}]' "
            f"(not installed: {', '.join(missing)})",
            name=missing[0],
        )
        self.extra = extra
        self.missing = tuple(missing)


def require(extra: str, part: str) -> None:
    """Raise :class:`MissingExtra` if any module ``extra`` brings cannot be found (nothing is imported).

    Raises:
        MissingExtra: naming ``part``, the extra and the distributions that are not installed.
    """
    brings = EXTRA_MODULES[extra]
    missing = [dist for module, dist in brings.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise MissingExtra(extra, part, missing)
