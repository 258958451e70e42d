"""The command blocks of a Markdown page, as tests/docs/test_readme.py runs them.

```bash, ```sh, ```shell and ```console blocks; of a console block only the `$ ` lines (output is
not compared); comment-only lines are dropped, continuation lines stay with their command.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

LANGS = ("bash", "sh", "shell", "console")


@dataclass(frozen=True)
class Command:
    line: int  # the README line it starts on
    text: str  # as bash gets it, continuation lines included

    def words(self) -> list[list[str]]:
        """Each simple command's words (`NAME=value` prefixes included), split at && || ; & |."""
        lex = shlex.shlex(self.text.replace("\\\n", " "), posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        out: list[list[str]] = [[]]
        for token in lex:
            if token in ("&&", "||", ";", "&", "|"):
                out.append([])
            else:
                out[-1].append(token)
        return [w for w in out if w]

    def argvs(self) -> list[list[str]]:
        return [[w for i, w in enumerate(words) if not _assignment(words[: i + 1])] for words in self.words()]

    def env(self) -> dict[str, str]:
        """The `NAME=value` prefixes of the first command."""
        words = self.words()[0]
        return dict(w.split("=", 1) for i, w in enumerate(words) if _assignment(words[: i + 1]))


def _assignment(words: list[str]) -> bool:
    """Whether the last of `words` is still a `NAME=value` prefix."""
    return all(re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w) for w in words)


@dataclass(frozen=True)
class Block:
    line: int  # the README line of its opening fence
    lang: str
    first: str  # its first line: the key NOT_RUNNABLE uses
    commands: tuple[Command, ...]


def readme_blocks(text: str) -> list[Block]:
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if fence is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        if fence.group(1) in LANGS:
            body = lines[i + 1:end]
            first = next((line.rstrip() for line in body if line.strip()), "")
            commands = _commands(body, i + 2, console=fence.group(1) == "console")
            blocks.append(Block(i + 1, fence.group(1), first, commands))
        i = end + 1
    return blocks


def _commands(body: list[str], first_line: int, console: bool) -> tuple[Command, ...]:
    out: list[Command] = []
    pending: list[str] = []
    start = first_line
    for number, raw in enumerate(body, first_line):
        if pending:
            line = raw[2:] if console and raw.startswith("> ") else raw
        elif console:
            if not raw.startswith("$ "):
                continue  # output
            line, start = raw[2:], number
        elif not raw.strip() or raw.lstrip().startswith("#"):
            continue
        else:
            line, start = raw, number
        pending.append(line)
        if not line.endswith("\\"):  # as bash reads it: a backslash right before the newline
            out.append(Command(start, "\n".join(pending)))
            pending = []
    assert not pending, f"README.md:{start}: the command ends in a line continuation"
    return tuple(out)
