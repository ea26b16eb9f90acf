"""Runs in the agent: small facts about host processes (liveness that survives pid reuse),
the words for how one ended, which the agent uses for every backend's attempts, and a
bounded way to ask a program a question (`ask`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Mapping
from typing import Any, NamedTuple


def _stat(pid: int) -> list[bytes]:
    """The fields of /proc/PID/stat after the command name (state first); [] if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return []
    # Field 2 (comm) may contain spaces and parentheses: split after the last ')'.
    return data[data.rfind(b")") + 2 :].split()


def parent(pid: int) -> int | None:
    """The process's parent pid, or None if it is gone."""
    fields = _stat(pid)
    return int(fields[1]) if len(fields) > 1 else None


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, or None if it is gone.

    Stored with a pid so that a reused pid is never mistaken for the original process.
    """
    fields = _stat(pid)
    if fields and fields[0] == b"Z":
        return None  # a zombie has finished; only its parent's wait is missing
    return fields[19].decode() if len(fields) > 19 else None


def alive(pid: int, started: str | None) -> bool:
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group. Returns False if the group no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def describe_signal(sig: int) -> str:
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    hint = " (likely out of memory, or killed by hand)" if sig == signal.SIGKILL else ""
    return f"killed by signal {sig} ({name}){hint}"


def describe_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def command_line(pid: int) -> bytes | None:
    """The process's command line as the kernel keeps it (NUL-separated), or None if gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def environ_value(pid: int, name: str) -> str | None:
    """The variable `name` in the environment the process started with, or None (unset,
    gone, or not ours to read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for item in data.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


class Answer(NamedTuple):
    """What `ask` got: the exit code (negative: the signal that ended it), what it printed
    (stdout and stderr together, the first `cap` bytes), why it was stopped (None: it ended
    by itself), and whether that was for printing more than `cap`."""

    code: int
    out: str
    stopped: str | None
    cut: bool = False

    def marked(self, mark: str) -> Any:
        """The JSON value after `mark` on the last line that starts with it, from a program
        that ended by itself with exit code 0 (where a question's answer is printed after a
        mark, in whatever else the program prints); None where there is none."""
        if self.code != 0 or self.stopped is not None:
            return None
        for line in reversed(self.out.splitlines()):
            if line.startswith(mark):
                try:
                    return json.loads(line.removeprefix(mark))
                except ValueError:
                    return None
        return None


def ask(
    argv: list[str],
    *,
    env: Mapping[str, str] | None = None,
    cap: int = 64 << 10,
    seconds: float = 60,
    pass_fds: tuple[int, ...] = (),
) -> Answer:
    """Run `argv` (a program a job named, as `--python`, which may be any program on the
    host, or one whose output a job decides, as py-spy's dump of its stacks) and read what
    it prints, no more than `cap` bytes and for no longer than `seconds`: one that prints
    without end or never ends is killed, and its answer says so, rather than filling the
    agent's memory or holding its caller. OSError where it cannot be run."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=None if env is None else dict(env),
        pass_fds=pass_fds,
    )
    assert proc.stdout is not None
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        proc.kill()

    timer = threading.Timer(seconds, expire)
    timer.start()
    stopped = None
    try:
        out = proc.stdout.read(cap + 1)
        if len(out) > cap:
            stopped = (
                f"it printed more than {f'{cap >> 10} KiB' if cap >= 1024 else f'{cap} bytes'}"
            )
            proc.kill()
        code = proc.wait()
    finally:
        timer.cancel()
        proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    cut = stopped is not None
    if stopped is None and expired.is_set():
        stopped = f"it had not answered after {seconds:g} s"
    return Answer(code, out[:cap].decode(errors="replace"), stopped, cut)
