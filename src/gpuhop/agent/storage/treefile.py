"""Runs in the agent: a tree's JSON read from its file one entry at a time.

A tree of 200,000 files parsed whole is some hundreds of MB of Python objects; read here, the
agent holds one entry at a time (and what the caller keeps of each). The document has one
shape, `{"entries": [ENTRY, ...]}`, so its frame is read by hand and each entry by the
standard library's own decoder, the one that reads the tree again when a job starts: what
is checked here is what is used there. (ijson's C parser, the usual choice, turns a lone
UTF-16 surrogate escape into "?" or an error of its own, so its checks and json.loads's
reading could differ; its Python parser is ten times slower than this.)
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from typing import Any, BinaryIO

READ = 1 << 20
# The most text one entry may take, whitespace and escapes included: a path of 3,072 bytes,
# each escaped as \uXXXX, is under 20 KB.
MAX_ENTRY_CHARS = 64 * 1024
_WS = " \t\n\r"
_ENDS = _WS + ",]}"


class TreeFileError(ValueError):
    """The document is not a tree: not JSON, or not of its shape. The message says where."""


class _Text:
    """The file's text from `pos` on, decoded as UTF-8 a piece at a time."""

    def __init__(self, f: BinaryIO):
        self.f = f
        self.utf8 = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.pos = 0
        self.eof = False

    def more(self) -> bool:
        if self.eof:
            return False
        data = self.f.read(READ)
        try:
            text = self.utf8.decode(data, final=not data)
        except UnicodeDecodeError as e:
            raise TreeFileError(f"the tree is not valid UTF-8 ({e.reason})") from None
        self.eof = not data
        self.buf = self.buf[self.pos :] + text
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next character that is not whitespace ("" at the end)."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WS:
                self.pos += 1
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos : self.pos + 1]

    def expect(self, chars: str, where: str) -> str:
        got = self.peek()
        if not got or got not in chars:
            shown = repr(got) if got else "the end"
            raise TreeFileError(f"the tree is not valid JSON: expected {where}, found {shown}")
        self.pos += 1
        return got

    def value(self, where: str) -> object:
        """One JSON value, decoded by the standard library; it may straddle reads."""
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if len(self.buf) - self.pos > MAX_ENTRY_CHARS or not self.more():
                    raise TreeFileError(f"{where} is not valid JSON ({e.msg})") from None
                continue
            # A number or a word is whole only once what follows it is seen: "1" of "1.5"
            # may end a read.
            scalar = not isinstance(value, (dict, list, str))
            followed = end < len(self.buf) and self.buf[end] in _ENDS
            short = len(self.buf) - self.pos <= MAX_ENTRY_CHARS
            if scalar and not followed and short and self.more():
                continue
            self.pos = end
            return value


_DECODER = json.JSONDecoder()


def read_entries(f: BinaryIO) -> Iterator[Any]:
    """Each item of the document's `entries` list, in order, as json.loads makes it.
    Raises TreeFileError for a document that is not `{"entries": [...]}`."""
    text = _Text(f)
    text.expect("{", "a JSON object")
    seen = False
    if text.peek() != "}":
        while True:
            key = text.value("a field name")
            if not isinstance(key, str):
                raise TreeFileError("the tree is not valid JSON: a field name must be a string")
            if key != "entries":
                raise TreeFileError(f"{key}: a tree has no such field (only entries)")
            if seen:
                raise TreeFileError("entries: given twice")
            seen = True
            text.expect(":", "':'")
            text.expect("[", "the list of entries")
            index = 0
            if text.peek() != "]":
                while True:
                    yield text.value(f"entries.{index}")
                    index += 1
                    if text.expect(",]", "',' or ']' after an entry") == "]":
                        break
            else:
                text.pos += 1
            if text.expect(",}", "',' or '}'") == "}":
                break
    else:
        text.pos += 1
    if text.peek():
        raise TreeFileError("the tree is not valid JSON: more follows its end")
    if not seen:
        raise TreeFileError("entries: Field required")
