"""Runs in the agent (local backend): starts jobs' leaders through a warm leader server
(`leaderserver.py` beside this file) instead of a fresh interpreter each.

A leader started by the agent costs a Python start and the imports of the leader and its helpers
(tens of milliseconds, more on a busy host) before the job's own process exists; the server
has paid them once, and forks each leader before its job comes (in a memory cgroup of its
own, which the request renames to the attempt's: see leaderserver.py). A job's leader is the
same either way: the leader of its own session with its log as stdout and stderr, run by
the same code. The server is started on first use and again if it ended; where it cannot be
reached the caller starts the leader itself, as before.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import socket
import subprocess
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from gpuhop.backends.base import StartError
from gpuhop.backends.local import cgroups

log = logging.getLogger("gpuhop.agent")

SERVER = str(Path(__file__).with_name("leaderserver.py"))
# How long a request waits for the server's answer (a fork takes milliseconds).
ANSWER_SECONDS = 30.0


def check_os_text(argv: list[str], env: dict[str, str]) -> None:
    """Raise what Popen raises for arguments or variables the OS cannot take (a lone
    surrogate: UnicodeEncodeError; an embedded NUL, a name with "="), before the leader server
    is asked: the job then fails to start saying why, as a directly started leader would."""
    for text in (*argv, *env.values()):
        if b"\0" in os.fsencode(text):
            raise ValueError("embedded null byte")
    for name in env:
        raw = os.fsencode(name)
        if not raw or b"=" in raw or b"\0" in raw:
            raise ValueError(f"illegal environment variable name: {name!r}")


class ServerGone(OSError):
    """The leader server could not be started or reached; start the leader another way."""


class ForkServer:
    """One warm leader server for an agent; `spawn` may be called from any thread."""

    def __init__(self, python: str):
        self.python = python
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        # The exit code of each leader it started, once it has ended (None: not known, as
        # the server went away first).
        self._ends: dict[int, Future[int | None]] = {}

    def spawn(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        log_path: Path,
        cgroup: Path | None,
        request: Path,
        specs: dict[str, Any] | None = None,
    ) -> tuple[int, str | None]:
        """Start a leader with `argv` (its arguments), its request written to the file
        `request` (in the job's dir, hidden from jobs), in the new cgroup `cgroup` (a path
        not yet made: the server makes it), given `specs` (what its spec files would say,
        such as {"sandbox": ...}); returns its pid and start time.
        Raises ServerGone where the server did not start it, and StartError where it may
        have (it took the request and never answered): starting it another way could then
        run the job twice."""
        # The request goes in a file that only the leader, once forked, reads: the server's
        # memory, which every later leader inherits, never holds a job's environment.
        specs = dict(specs or {})
        ready = specs.pop("ready", None)  # for the server: which ready container may run it
        spec = {"argv": argv, "env": env, "cwd": str(cwd), "specs": specs}
        fd = os.open(request, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with open(fd, "w") as f:
            json.dump(spec, f)
        said = {"request": str(request), "cgroup": cgroup and str(cgroup)}
        if ready is not None:
            said["ready"] = ready
        message = json.dumps(said).encode()
        with self._lock:
            sock = self._running()
            with open(log_path, "ab") as logfile:
                try:
                    socket.send_fds(sock, [message], [logfile.fileno()])
                except OSError as e:
                    self._stop()
                    raise ServerGone(f"the leader server did not take the request ({e})") from e
            try:
                answer = self._answers.get(timeout=ANSWER_SECONDS)
            except queue.Empty:
                answer = None
            if answer is None:
                self._stop()
                raise StartError(
                    "the agent's leader server ended or hung before it said whether it started"
                    " the job; not starting it again, as it may run"
                )
        if "error" in answer:
            raise ServerGone(f"the leader server could not start the leader: {answer['error']}")
        return int(answer["pid"]), answer.get("start")

    def ended(self, pid: int) -> Future[int | None] | None:
        """The exit code of a leader this server started, once it ends; None for another."""
        return self._ends.get(pid)

    def forget(self, pid: int) -> None:
        self._ends.pop(pid, None)

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _running(self) -> socket.socket:
        if self._sock is not None and self._proc is not None and self._proc.poll() is None:
            return self._sock
        self._stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            found = cgroups.agent_cgroup()  # where the server makes its waiting leaders' own
            where = [] if found is None else [str(found[0]), found[1]]
            self._proc = subprocess.Popen(
                [self.python, "-I", "-S", SERVER, str(theirs.fileno()), *where],
                stdin=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
                start_new_session=True,  # no signal meant for the agent's group reaches it
            )
        except OSError as e:
            ours.close()
            raise ServerGone(f"the leader server did not start ({e})") from e
        finally:
            theirs.close()
        self._sock = ours
        self._answers = queue.Queue()
        threading.Thread(
            target=self._read, args=(ours, self._answers), name="leader-server", daemon=True
        ).start()
        return ours

    def _read(self, sock: socket.socket, answers: queue.Queue[dict[str, Any] | None]) -> None:
        """Route the server's messages: answers to `spawn`, and the ends of leaders."""
        mine: set[int] = set()  # the leaders this server started, still running
        while True:
            try:
                data = sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            message = json.loads(data)
            if "ended" in message:
                mine.discard(int(message["ended"]))
                future = self._ends.get(int(message["ended"]))
                if future is not None and not future.done():
                    future.set_result(int(message["code"]))
                continue
            if "pid" in message:  # before the answer is read: its end may come next
                mine.add(int(message["pid"]))
                self._ends[int(message["pid"])] = Future()
            answers.put(message)
        answers.put(None)
        # Leaders still running outlive the server; their ends are learned another way.
        for pid in mine:
            future = self._ends.get(pid)
            if future is not None and not future.done():
                future.set_result(None)

    def _stop(self) -> None:
        if self._sock is not None:
            # Shut down first: that wakes the reader, and the server ends at its next read.
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("the leader server did not end; killing it")
                self._proc.kill()
                self._proc.wait()
            self._proc = None
