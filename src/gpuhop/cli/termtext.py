"""Runs on the user's machine: a job's log as a terminal would show it, as plain text.

A program that believes it writes to a terminal (Keras's default progress bar does even into
a file) redraws its line: a carriage return goes back to the line's start, a backspace one
column left, and what follows overwrites what was there; ANSI escape sequences set colours
and move the cursor. Written to a file or read in a browser those bytes are noise: every
frame of every bar, `[1m` and boxes. `TerminalText` plays them as a terminal would and gives
each line as it finally stood, without escapes: what `gpuhop logs` writes to a pipe or a file
(`--raw` keeps the bytes).

The dashboard's log view does the same in a small JavaScript twin (`renderTerminal` in
agent/ui/static/termtext.js): the browser follows a log by byte offset and redraws the open
line itself as more of it comes, which a server-side rendering of whole lines could not give
it mid-line. The rules are these; tests/e2e/test_dashboard_browser.py holds the two to one
output for a real Keras log.
"""

from __future__ import annotations

import codecs
import re

# An escape sequence: CSI (colours, cursor moves, erasing), OSC (titles, links; ended by BEL
# or ST), or a two-byte one (ESC and one character).
_ESCAPE = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")
# An escape sequence that a chunk of the stream may have cut short: kept for the next chunk.
_UNFINISHED = re.compile(r"\x1b(\[[0-?]*[ -/]*|\][^\x07\x1b]*\x1b?)?\Z")
# What a terminal shows nothing for: the C0 controls but tab, and DEL (a lone ESC too, where
# no sequence follows it).
_INVISIBLE = dict.fromkeys([*range(0, 8), 11, 12, *range(14, 32), 127])
# Of the line as the program last left it: where `\x1b[K` erases from.
_ERASE_LINE = frozenset({"K", "0K", "1K", "2K"})


class TerminalText:
    """Feed it a log's bytes in pieces; it gives back whole lines as a terminal shows them."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._line: list[str] = []
        self._cursor = 0
        self._pending = ""  # an escape sequence cut by the end of the last piece

    def feed(self, data: bytes) -> str:
        """The lines `data` ended (each with its newline), rendered."""
        return self._play(self._decoder.decode(data))

    def open_line(self) -> str:
        """The line still being written (a progress bar mid-epoch), as it stands now."""
        return "".join(self._line).rstrip()

    def close(self) -> str:
        """What is left at the end of the log: its last line, if it had no newline."""
        out = self._play(self._decoder.decode(b"", final=True))
        self._pending = ""
        last = self.open_line()
        self._line, self._cursor = [], 0
        return out + last

    def _play(self, text: str) -> str:
        text, self._pending = self._pending + text, ""
        cut = _UNFINISHED.search(text)
        if cut is not None:
            text, self._pending = text[: cut.start()], text[cut.start() :]
        out: list[str] = []
        position = 0
        for match in _ESCAPE.finditer(text):
            self._write(text[position : match.start()], out)
            self._escape(match.group(1))
            position = match.end()
        self._write(text[position:], out)
        return "".join(out)

    def _write(self, text: str, out: list[str]) -> None:
        text = text.translate(_INVISIBLE)
        if "\r" not in text and "\b" not in text and self._cursor == len(self._line):
            self._append(text, out)  # plain lines (most of a log): no character by character
            return
        line, cursor = self._line, self._cursor
        for char in text:
            if char == "\n":
                out.append("".join(line).rstrip() + "\n")
                line, cursor = [], 0
            elif char == "\r":
                cursor = 0
            elif char == "\b":
                cursor = max(0, cursor - 1)
            elif cursor < len(line):
                line[cursor] = char
                cursor += 1
            else:
                line.extend(" " * (cursor - len(line)))
                line.append(char)
                cursor += 1
        self._line, self._cursor = line, cursor

    def _append(self, text: str, out: list[str]) -> None:
        """`_write` of text without carriage returns or backspaces, at the line's end."""
        *ended, rest = text.split("\n")
        if ended:
            ended[0] = "".join(self._line) + ended[0]
            out.extend(line.rstrip() + "\n" for line in ended)
            self._line = list(rest)
        else:
            self._line.extend(rest)
        self._cursor = len(self._line)

    def _escape(self, body: str) -> None:
        """The cursor moves and erasures a progress bar uses; colours and the rest: nothing."""
        if not body.startswith("["):
            return
        command, argument = body[-1], body[1:-1]
        count = int(argument) if argument.isdigit() else 1
        if command == "K" and body[1:] in _ERASE_LINE:
            if argument in ("", "0"):
                del self._line[self._cursor :]
            else:  # 1: up to the cursor; 2: the whole line
                end = len(self._line) if argument == "2" else self._cursor
                self._line[:end] = " " * min(end, len(self._line))
        elif command == "G":  # to column N (1-based)
            self._cursor = max(0, count - 1)
        elif command == "D":
            self._cursor = max(0, self._cursor - count)
        elif command == "C":
            self._cursor += count


def render(data: bytes) -> str:
    """A whole log as a terminal would show it, as plain text."""
    text = TerminalText()
    return text.feed(data) + text.close()
