"""Runs in the agent and in the leaders of a job's attempts: gpuhop's own lines in a job's
log start on a line of their own.

A job's output may stop in the middle of a line (a Keras progress bar redraws itself with
carriage returns and ends its line only when the epoch ends; a killed job ends wherever it
was). A line gpuhop appends then (the retry notice, the idle warning, a leader's word) would
be glued to it: `loss: 0.0181gpuhop: attempt 1 failed`. So the log's last byte is read
first, and a newline goes before gpuhop's line where the output did not end with one.
Standard library only.
"""

from __future__ import annotations

import os


def line_break(fd: int) -> bytes:
    """b"\\n" if the regular file open at `fd` (for writing only, as a log is) is not empty
    and does not end with a newline; else b"" (an empty file, a pipe, a terminal, or a file
    that cannot be read here)."""
    try:
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000 == 0o100000 and st.st_size):
            return b""
        # A log is opened for appending only: read its end through a descriptor of our own.
        reader = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        size = os.fstat(reader).st_size
        last = os.pread(reader, 1, size - 1) if size else b"\n"
    except OSError:
        return b""
    finally:
        os.close(reader)
    return b"" if last in (b"\n", b"") else b"\n"


def append_line(fd: int, text: str) -> None:
    """Append `text` as a line of its own to the file open at `fd` (for appending)."""
    data = line_break(fd) + text.encode(errors="replace") + b"\n"
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
