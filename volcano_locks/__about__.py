"""The distribution's version: the one place it is written (pyproject.toml reads it through hatch)."""

__version__ = "0.4.0"
