"""The README's fenced code blocks, for the tests that run them (``tests/docs/test_readme.py`` says which).

Each test that runs a block takes it from the README itself, so a block edited there is the block tested.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

_FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block: its language, its text and the line it starts on."""

    lang: str
    code: str
    line: int


def blocks(path: Path = README) -> list[Block]:
    """Every fenced code block of a Markdown file, in order."""
    found: list[Block] = []
    lang, start, lines = None, 0, []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        fence = _FENCE.match(line)
        if lang is None and fence:
            lang, start, lines = fence.group(1), number, []
        elif lang is not None and line.strip() == "```":
            found.append(Block(lang, "\n".join(lines) + "\n", start))
            lang = None
        elif lang is not None:
            lines.append(line)
    assert lang is None, f"{path.name}: the block opened on line {start} is never closed"
    return found


def python_block(containing: str, path: Path = README) -> str:
    """The one Python block that contains ``containing``."""
    matches = [b.code for b in blocks(path) if b.lang == "python" and containing in b.code]
    assert len(matches) == 1, f"{len(matches)} Python blocks of {path.name} contain {containing!r}"
    return matches[0]


def _without_comment(line: str) -> str:
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def shell_commands(path: Path = README) -> list[str]:
    """Every command line of the bash blocks, comments and blank lines left out."""
    return [
        command
        for block in blocks(path)
        if block.lang == "bash"
        for command in map(_without_comment, block.code.splitlines())
        if command
    ]
