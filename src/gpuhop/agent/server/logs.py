"""Runs in the agent: its log, `agent.log`, rotated, and kept from floods.

The client that starts the agent points its stdout and stderr at `agent.log` of the state
dir (see `gpuhop.client.embedded`). When they are that file, the agent logs through a
rotating handler (`MAX_BYTES`, `BACKUPS` old files beside it: `agent.log.1`, ...) that moves
stdout and stderr to each new file, so what the interpreter prints itself (a traceback, the
exit line) lands in the current file. Otherwise (the agent run in a terminal, or by a
service manager that keeps its own logs) it logs to stderr as before.

Lines that anyone on the network can cause, before any token is checked, are throttled:
`Throttle` lets through one line per key (a client address, a message) per `window` seconds
and counts the rest, which the next line that passes reports.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

MAX_BYTES = 10 * 2**20
BACKUPS = 3
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Loggers that write what an unauthenticated client makes happen (a malformed request, a
# TLS handshake that fails): at most one line per message per window.
NOISY_LOGGERS = ("uvicorn.error", "asyncio")
# Loggers that write each request's URL at INFO (httpx: "HTTP Request: POST URL"): the
# agent's requests go to webhooks whose URL is a user's secret. Their warnings still come.
URL_LOGGERS = ("httpx", "httpcore")


def configure(logfile: Path, max_bytes: int = MAX_BYTES, backups: int = BACKUPS) -> None:
    """Log at INFO to `logfile`, rotated, when stderr is that file; else to stderr."""
    handler: logging.Handler
    if _same_file(sys.stderr.fileno(), logfile):
        handler = FollowingRotatingHandler(logfile, max_bytes, backups, fds=(1, 2))
    else:
        handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).addFilter(ThrottleFilter())
    for name in URL_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


class FollowingRotatingHandler(logging.handlers.RotatingFileHandler):
    """A RotatingFileHandler whose file descriptors `fds` (stdout, stderr) follow it."""

    def __init__(self, path: Path, max_bytes: int, backups: int, fds: Sequence[int] = ()):
        super().__init__(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        self.fds = tuple(fds)

    def doRollover(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        super().doRollover()
        if self.stream is not None:
            for fd in self.fds:
                os.dup2(self.stream.fileno(), fd)


class Throttle:
    """At most one event per key per `window` seconds; counts what it holds back."""

    def __init__(
        self, window: float = 5.0, keys: int = 1024, clock: Callable[[], float] = time.monotonic
    ):
        self.window = window
        self.keys = keys  # so that many keys (addresses) cannot grow it without bound
        self.clock = clock
        self._seen: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def allow(self, key: str) -> int | None:
        """None if held back, else how many were held back since the last one let through."""
        now = self.clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self.window:
            self._seen[key] = (last[0], last[1] + 1)
            return None
        self._seen[key] = (now, 0)
        self._seen.move_to_end(key)
        while len(self._seen) > self.keys:
            self._seen.popitem(last=False)
        return last[1] if last is not None else 0


class ThrottleFilter(logging.Filter):
    """A logger's filter: one line per message template per window, then a count."""

    def __init__(self, throttle: Throttle | None = None):
        super().__init__()
        self.throttle = throttle or Throttle()

    def filter(self, record: logging.LogRecord) -> bool:
        # A template when the logger has one; else the message's start (asyncio's handler
        # formats its details into the message itself).
        held = self.throttle.allow(f"{record.name}:{str(record.msg)[:80]}")
        if held is None:
            return False
        if held:
            record.msg = f"{record.msg} ({held} more like it not logged)"
        return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), path.stat()
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
