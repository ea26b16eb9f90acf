"""Runs on the user's machine: the CLI's output where nothing is drawn (a pipe, a file), as
rich would write it there, without importing rich.

The CLI writes rich markup ("[dim]gpuhop:[/dim] ...") and rich tables. rich costs tens of
milliseconds to import, paid before a command's first byte; on a terminal that buys
colour and live redraws, in a pipe nothing. There a message is its markup's text (tags
dropped, escapes undone, the control codes rich drops dropped) and a table is its cells
padded into columns. tests/unit/test_plain_output.py checks both against rich itself.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import IO

# rich.markup's tag syntax: a tag is `[` + a letter, `#`, `/` or `@` + up to the next `]`,
# after any number of backslashes (an odd number escapes it).
_TAG = re.compile(r"((\\*)\[([a-z#/@][^[]*?)])")
_ESCAPE = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")
# What rich's Text drops from what it is given: BEL, BS, VT, FF and CR.
_STRIP = dict.fromkeys((7, 8, 11, 12, 13))
# Set in the environment, these make rich style a stream that is not a terminal.
_FORCING = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")


def styled(stream: IO[str]) -> bool:
    """Whether rich would draw on `stream` (a terminal, or one forced on): else plain."""
    if any(os.environ.get(name) for name in _FORCING):
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def escape(text: str) -> str:
    """`text` with what would read as markup escaped (rich.markup.escape)."""

    def backslashed(match: re.Match[str]) -> str:
        backslashes, tag = match.groups()
        return f"{backslashes}{backslashes}\\{tag}"

    text = _ESCAPE.sub(backslashed, text)
    if text.endswith("\\") and not text.endswith("\\\\"):
        return text + "\\"
    return text


def plain(markup: str) -> str:
    """The text rich shows for `markup`, without its styles."""
    out: list[str] = []
    position = 0
    for match in _TAG.finditer(markup):
        full, escapes, _tag = match.groups()
        start, end = match.span()
        out.append(markup[position:start])
        backslashes, escaped = divmod(len(escapes), 2)
        out.append("\\" * backslashes)
        if escaped:
            out.append(full[len(escapes) :])
        position = end
    out.append(markup[position:])
    return "".join(out).translate(_STRIP)


def narrow(text: str) -> bool:
    """Whether every character of `text` takes one column on screen as rich counts it: a
    printable one, no combining mark or format character, not East Asian wide, from the
    blocks whose widths are settled (Latin to Georgian, general punctuation to the arrows
    and technical symbols: `⏎`, `·`, `…`, `é`; not the emoji and dingbat blocks).
    tests/unit/test_plain_output.py holds it to rich's own width table."""
    if text.isascii():
        return text.isprintable()
    import unicodedata

    for char in text:
        code = ord(char)
        if not (code < 0x1100 or 0x2000 <= code < 0x2600 or 0x27C0 <= code < 0x2E80):
            return False
        if not char.isprintable() or unicodedata.category(char) in ("Mn", "Mc", "Me", "Cf"):
            return False
        if unicodedata.east_asian_width(char) in ("W", "F"):
            return False
    return True


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> str | None:
    """The lines of a rich `Table(box=None, pad_edge=False)` of plain cells, as rich writes
    it at `width` columns; None where only rich can say (a cell with a character that is
    not `narrow`, whose width on screen rich measures, or a table wider than `width`, which
    it squeezes)."""
    cells = [list(columns), *(list(row) for row in rows)]
    if not all(narrow(c) for row in cells for c in row):
        return None
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    if sum(widths) + 2 * (len(widths) - 1) > width:
        return None
    lines = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells)
    return "".join(line + "\n" for line in lines)
