"""Runs on the GPU host, in a job's leader: the job's secrets masked in its output before
it reaches the log.

With secrets, the job writes its output into a pipe, and a pump (a child of the leader,
outside the job's sandbox, as the agent's user) copies it to the log with every secret's
value replaced by `***`. A value split across two writes is masked too: the pump holds back
the end of what it read where that end could begin a value, until the next read says.
Standard library only, as the leader.
"""

import os
import select
import signal
import time

MASK = b"***"
# How long the leader waits for a pump to reach the end of its pipe once the job has ended,
# before telling it to copy what is there and stop (a process the job left behind, outside
# a sandbox, may hold the pipe open).
DRAIN_SECONDS = 2.0


def masked_values(values: list) -> list:
    """The byte strings to mask for these values, longest first: each value, and each line
    (of at least 4 characters) of a value of several lines, such as a key file printed line
    by line."""
    found = set()
    for value in filter(None, values):  # an empty value masks nothing
        found.add(value.encode("utf-8", "surrogateescape"))
        lines = [line.strip() for line in value.splitlines()]
        if len(lines) > 1:
            found.update(
                line.encode("utf-8", "surrogateescape") for line in lines if len(line) >= 4
            )
    return sorted(found, key=len, reverse=True)


class Masker:
    """Masks values in a stream of bytes fed in pieces."""

    def __init__(self, values: list):
        self.values = [v for v in values if v]
        self.held = b""

    def feed(self, data: bytes) -> bytes:
        """What of the stream so far can be written now, masked."""
        buf = self.held + data
        for value in self.values:
            if value in buf:
                buf = buf.replace(value, MASK)
        keep = self._pending(buf)
        self.held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]

    def flush(self) -> bytes:
        """The end of the stream: what was held (no whole value: it was only a beginning)."""
        out, self.held = self.held, b""
        return out

    def _pending(self, buf: bytes) -> int:
        """The length of the longest end of `buf` that begins a value (but is not all of it)."""
        longest = 0
        for value in self.values:
            start = max(0, len(buf) - len(value) + 1)
            at = buf.find(value[:1], start)
            while at != -1:
                if len(buf) - at > longest and value.startswith(buf[at:]):
                    longest = len(buf) - at
                    break
                at = buf.find(value[:1], at + 1)
        return longest


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data) :]
        except InterruptedError:
            continue


def _pump(read_fd: int, out_fd: int, masker: Masker, mask: set[int | signal.Signals]) -> None:
    """Copy the pipe, masked, until its writers are gone; told to drain (SIGUSR1), copy what
    it holds now and stop. The signal only wakes the loop (a byte on a wakeup pipe): an
    exception raised by its handler could land between a read and its write, and lose what
    was read."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGUSR1, lambda *_: None)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a drain sent meanwhile comes now
    draining = False
    while True:
        watched = [read_fd] if draining else [read_fd, wake_r]
        ready = select.select(watched, [], [], 0 if draining else None)[0]
        if wake_r in ready:
            draining = True  # what the pipe holds now, and no more: someone the job left
            continue  # behind holds it open
        if not ready:
            break
        data = os.read(read_fd, 65536)
        if not data:
            break
        _write_all(out_fd, masker.feed(data))
    _write_all(out_fd, masker.flush())


def start(values: list, out_fd: int) -> tuple:
    """Fork a pump that copies a new pipe to `out_fd`, masking `values`; return its pid and
    the pipe's write end (the caller's to hand to the job, and then close)."""
    read_fd, write_fd = os.pipe()
    # SIGUSR1 (`finish`'s "drain now") is held back until the pump has its handler: sent to
    # a child that had not yet run that far (a busy machine), its default action killed the
    # pump with the job's output unwritten.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(write_fd)
            _pump(read_fd, out_fd, Masker(masked_values(values)), held)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_SETMASK, held)
    os.close(read_fd)
    return pid, write_fd


def finish(pid: int) -> None:
    """Wait for a pump whose writers are gone, or told to drain after DRAIN_SECONDS."""
    deadline = time.monotonic() + DRAIN_SECONDS
    told = False
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        if not told and time.monotonic() > deadline:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                return
            told = True
        time.sleep(0.01)
