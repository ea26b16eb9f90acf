"""Runs on the user's machine: finds, starts and stops the local (embedded) agent.

The agent is started as its own daemon (`python -m gpuhop.agent`) in a new session, with
its output in `agent.log`, and reused by every later command.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from gpuhop.home import EXIT_MARK, AgentError, AgentPaths, read_pid

# Interpreter flags for an agent a command starts (`python_flags` of `start_background`).
AGENT_PYTHON_FLAGS = "GPUHOP_AGENT_PYTHON_FLAGS"


def connect(path: Path, timeout: float = 1.0) -> socket.socket | None:
    """A connection to the Unix socket at `path`, or None where nothing answers."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(path))
    except OSError:
        s.close()
        return None
    return s


def socket_answers(path: Path, timeout: float = 1.0) -> bool:
    s = connect(path, timeout)
    if s is None:
        return False
    s.close()
    return True


def connect_agent(paths: AgentPaths, timeout: float = 30.0) -> socket.socket:
    """A connection to the agent of `paths`, starting one first if none answers. The
    connection that finds the agent is the one the first request goes on: no probe of its
    own (through an SSH tunnel, a channel opened for nothing)."""
    if read_pid(paths) is not None and (sock := connect(paths.socket)) is not None:
        return sock
    start_background(paths, timeout=timeout)
    sock = connect(paths.socket)
    if sock is None:
        raise AgentError(f"the agent at {paths.socket} stopped answering as soon as it started")
    return sock


def start_background(
    paths: AgentPaths,
    fake_gpus: int | None = None,
    timeout: float = 30.0,
    fake_gpu_memory_mb: int | None = None,
    agent_args: Sequence[str] = (),
    python_flags: Sequence[str] | None = None,
) -> int:
    """Start the agent as a daemon and wait until its socket answers. Returns its pid.

    `agent_args` are more `python -m gpuhop.agent` arguments (e.g. `--listen HOST:PORT`);
    `python_flags` are the interpreter's, by default those in $GPUHOP_AGENT_PYTHON_FLAGS
    (e.g. `-X dev`; the tests set `-W error`, so that an agent a command starts for them
    turns warnings into errors too: flags, unlike $PYTHONWARNINGS, reach neither the agent's
    jobs nor the commands it runs).
    """
    if python_flags is None:
        python_flags = _flags_from_env()
    pid = read_pid(paths)
    if pid is not None and socket_answers(paths.socket):
        return pid
    paths.ensure()
    log_start = paths.logfile.stat().st_size if paths.logfile.exists() else 0
    cmd = [sys.executable, *python_flags, "-m", "gpuhop.agent", "--home", str(paths.home)]
    if fake_gpus is not None:
        cmd += ["--fake-gpus", str(fake_gpus)]
    if fake_gpu_memory_mb is not None:
        cmd += ["--fake-gpu-memory", str(fake_gpu_memory_mb)]
    cmd += agent_args
    import subprocess  # only to start an agent: not on a command that finds it running

    with open(paths.logfile, "ab") as logf:
        # Through a short-lived intermediate (a double fork), so the agent is not our child:
        # it outlives this process and never lingers as its zombie. It says the agent's pid,
        # and gives the agent its own stderr, the log.
        detached = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _DETACH, *cmd],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=logf,
            check=True,
        )
    started = int(detached.stdout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if socket_answers(paths.socket, timeout=0.2):
            running = read_pid(paths)
            if running is not None:
                return running
        if _log_says_exited(paths.logfile, log_start, started) and read_pid(paths) is None:
            raise AgentError(f"the agent failed to start:\n{_tail(paths.logfile, log_start)}")
        # (Exited while an agent holds the lock: another client started that one first, and
        # it answers once it has started.)
        time.sleep(0.02)
    # Given up on: the agent this call started is stopped, not left to come up unasked
    # (or to hold the state dir's lock) after the command said it failed.
    with contextlib.suppress(ProcessLookupError):
        os.kill(started, signal.SIGTERM)
    raise AgentError(
        f"the agent did not answer within {timeout:g}s (it was stopped):\n"
        f"{_tail(paths.logfile, log_start)}"
    )


def _flags_from_env() -> list[str]:
    flags = os.environ.get(AGENT_PYTHON_FLAGS, "")
    if not flags.strip():
        return []
    import shlex

    return shlex.split(flags)


def stop(paths: AgentPaths, timeout: float = 10.0) -> int | None:
    """Stop the agent (jobs keep running). Returns the pid that was stopped, or None."""
    pid = read_pid(paths)
    if pid is None:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if read_pid(paths) is None:
            return pid
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    while read_pid(paths) is not None and time.monotonic() < deadline + 5:
        time.sleep(0.05)
    return pid


_DETACH = (
    "import subprocess, sys; "
    "p = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=2, stderr=2,"
    " start_new_session=True, close_fds=True); "
    "print(p.pid)"
)


def _logged_since(logfile: Path, start: int) -> bytes | None:
    """What the agent logged since offset `start` (all of it if it rotated its log since,
    see gpuhop.agent.server.logs); None without a log."""
    try:
        with open(logfile, "rb") as f:
            if os.fstat(f.fileno()).st_size >= start:
                f.seek(start)
            return f.read()
    except OSError:
        return None


def _log_says_exited(logfile: Path, start: int, pid: int) -> bool:
    """Whether the agent `pid` wrote its exit line (see `gpuhop.agent.__main__`) since
    `start`. Only its own: an agent stopped just before frees its lock, then writes its exit
    line, which may come after `start`."""
    mine = b"(pid %d)" % pid
    logged = _logged_since(logfile, start) or b""
    return any(EXIT_MARK in line and line.endswith(mine) for line in logged.splitlines())


def _tail(path: Path, start: int, lines: int = 15) -> str:
    """The last `lines` of what the agent logged since `start` (this start's, not earlier
    agents'), and where the whole log is."""
    logged = _logged_since(path, start)
    if logged is None:
        return "(no agent log)"
    shown = "\n".join(logged.decode(errors="replace").splitlines()[-lines:])
    shown = shown or "(it logged nothing)"
    return f"{shown}\n(the agent's log: {path})"
