"""Runs inside the job: a failed notebook cell's traceback as the job's log shows it, short
and plain where the log is not a terminal.

IPython's kernel sends a cell's error as its type, its message and a traceback of one string
per frame, in ANSI colours, with context lines round each frame's line: 150 lines for an
error raised deep in a library, unreadable in a log file. `short` keeps what a user acts on:
the frames of their own code (the notebook's cells, and files outside the Python
installation), each with the line that ran, a line for each run of library frames between
them (with where the error was raised, at the end), and the error. The executed notebook in
the job's artifacts keeps the kernel's full traceback. Standard library only.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["Frame", "frames", "plain", "short"]

# Colours and other terminal control sequences (CSI), as IPython writes them.
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# A frame's first line: "Cell In[4], line 2" or "File ~/x/y.py:346, in loads(s, cls, ...)".
HEADER = re.compile(
    r"^(?:Cell In\[(?P<count>\d+)\], line (?P<cell_line>\d+)|File (?P<path>.+?):(?P<line>\d+))"
    r"(?:, in (?P<function>[^(\s]+))?"
)
# The line that ran, among a frame's context lines: "----> 2 x = f()" or "--> 346     return".
CURRENT = re.compile(r"^-+> *\d+ ?(?P<code>.*)$")
# Where installed code lives; a frame in none of these is the user's own.
LIBRARY_MARKS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


class Frame(NamedTuple):
    execution: int | None  # the cell's execution count (In[N]), for a cell's frame
    path: str | None  # the file, for a file's frame (~ expanded)
    line: int
    function: str | None
    code: str  # the line that ran, stripped ("" where the traceback has none)


def plain(text: str) -> str:
    """`text` without terminal escapes."""
    return ANSI.sub("", text)


def frames(traceback: list[str]) -> list[Frame]:
    """The frames of an IPython error's traceback (one string per frame, among others)."""
    found = []
    for entry in traceback:
        lines = plain(entry).splitlines()
        match = HEADER.match(lines[0]) if lines else None
        if match is None:
            continue
        code = next((m["code"].strip() for m in map(CURRENT.match, lines[1:]) if m), "")
        path = match["path"]
        found.append(
            Frame(
                execution=int(match["count"]) if match["count"] else None,
                path=os.path.expanduser(path) if path else None,
                line=int(match["cell_line"] or match["line"]),
                function=match["function"],
                code=code,
            )
        )
    return found


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots |= {os.path.dirname(os.__file__)}
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots)


def _library_part(path: str, roots: tuple[str, ...]) -> str | None:
    """`path` from its package's directory on ("keras/src/models/model.py") if it is
    installed code, else None."""
    real = os.path.realpath(path)
    for mark in LIBRARY_MARKS:
        if mark in real:
            return real.rsplit(mark, 1)[1]
    for root in roots:
        if real.startswith(root):
            return real[len(root) :]
    return None


def short(
    traceback: list[str], ename: str, evalue: str, cell_name: Callable[[int], str]
) -> str | None:
    """The user's frames of a cell's error and the error, Python's way round (most recent
    call last), in plain text; `cell_name(N)` names the cell that ran as In[N]. None where
    the traceback has no frames to show (a SyntaxError's, say): then print it `plain`."""
    found = frames(traceback)
    if not found:
        return None
    roots = _library_roots()
    out = ["Traceback (your code; most recent call last):"]
    skipped: list[str] = []  # the library frames since the last user frame

    def flush(last: bool) -> None:
        if not skipped:
            return
        packages = list(dict.fromkeys(p.split(os.sep, 1)[0].removesuffix(".py") for p in skipped))
        many = f"{len(skipped)} frame{'s' if len(skipped) != 1 else ''}"
        where = f", raised in {skipped[-1]}" if last else ""
        out.append(f"  ... {many} in {', '.join(packages)}{where}")
        skipped.clear()

    for frame in found:
        part = None if frame.path is None else _library_part(frame.path, roots)
        if part is not None:
            function = f", in {frame.function}" if frame.function else ""
            skipped.append(f"{part}:{frame.line}{function}")
            continue
        flush(last=False)
        where = cell_name(frame.execution) if frame.execution is not None else f'"{frame.path}"'
        function = f", in {frame.function}" if frame.function else ""
        out.append(f"  {where}, line {frame.line}{function}")
        if frame.code:
            out.append(f"    {frame.code}")
    flush(last=True)
    out.append(f"{ename}: {evalue}" if evalue else ename)
    return "\n".join(out)


def is_terminal() -> bool:
    """Whether the runner's output is a terminal (then the kernel's colours are welcome)."""
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())
