"""The fenced blocks of the docs, and the shell commands of their ``bash`` blocks."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Block", "Command", "read_blocks", "shell_commands"]


@dataclass(frozen=True)
class Block:
    """One fenced block of a doc."""

    doc: str
    line: int
    lang: str
    text: str


@dataclass(frozen=True)
class Command:
    """One shell command of a ``bash`` block (continuation lines joined, comments dropped)."""

    doc: str
    line: int
    argv: tuple[str, ...]

    @property
    def text(self) -> str:
        return shlex.join(self.argv)

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}:{' '.join(self.argv[:4])}"


def read_blocks(docs: Iterable[Path], root: Path) -> list[Block]:
    """The fenced blocks of ``docs``, each named by its path relative to ``root``."""
    blocks = []
    fence = re.compile(r"^```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
    for doc in docs:
        text = doc.read_text()
        for m in fence.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            lang = m["lang"]
            blocks.append(Block(str(doc.relative_to(root)), line, lang, m["body"]))
    return blocks


def shell_commands(block: Block) -> list[Command]:
    """The commands of a ``bash`` block, each at the line it starts on."""
    commands = []
    joined = block.text.replace("\\\n", " ")
    for offset, raw in enumerate(joined.splitlines()):
        argv = shlex.split(raw, comments=True)
        if argv:
            commands.append(Command(block.doc, block.line + 1 + offset, tuple(argv)))
    return commands
