"""A real pseudo-terminal for CLI tests: the CLI sees a TTY and draws live displays."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

# CSI sequences (colours, cursor moves) and OSC sequences (hyperlinks, titles).
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[=>]")


def plain(text: str) -> str:
    """What a terminal's scrollback would hold, roughly: the text without escape codes."""
    return ANSI.sub("", text).replace("\r", "")


class Terminal:
    """`gpuhop ARGS` running with a pseudo-terminal as its stdin, stdout and stderr."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        cwd: Path | None = None,
        size: tuple[int, int] = (160, 40),
    ):
        """`size`: the terminal's columns and lines."""
        columns, lines = size
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
        self.size = size
        self._master = master
        self._chunks: list[bytes] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuhop", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            env={**env, "TERM": "xterm-256color", "COLUMNS": str(columns), "LINES": str(lines)},
            start_new_session=True,
        )
        os.close(slave)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError:  # EIO: the other side is closed
                return
            if not data:
                return
            self._chunks.append(data)

    @property
    def raw(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    @property
    def text(self) -> str:
        return plain(self.raw)

    def screen(self) -> list[str]:
        """The screen as it stands now, a line per row, as a terminal emulator (pyte) draws
        everything written so far: what a person reads there."""
        import pyte

        screen = pyte.Screen(*self.size)
        pyte.ByteStream(screen).feed(b"".join(self._chunks))
        return [line.rstrip() for line in screen.display]

    def wait_for_screen(self, *needles: str, timeout: float = 60) -> list[str]:
        """The screen, once it shows every one of `needles` at once."""
        deadline = time.monotonic() + timeout
        while not all(n in "\n".join(shown := self.screen()) for n in needles):
            seen = "\n".join(shown)
            if self.proc.poll() is not None and not self._reader.is_alive():
                raise AssertionError(f"exited before {needles!r} showed:\n{seen}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{needles!r} not on screen in {timeout}s:\n{seen}")
            time.sleep(0.1)
        return shown

    def wait_for(self, needle: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            if self.proc.poll() is not None and not self._reader.is_alive():
                raise AssertionError(f"exited before {needle!r} appeared:\n{self.text}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} did not appear in {timeout}s:\n{self.text}")
            time.sleep(0.05)
        return self.text

    def interrupt(self) -> None:
        """Ctrl-C, as the terminal would send it."""
        self.proc.send_signal(signal.SIGINT)

    def finish(self, timeout: float = 120) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        os.close(self._master)
        return code
