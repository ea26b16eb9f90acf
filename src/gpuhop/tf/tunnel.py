"""Runs on the user's machine, in a helper process of `gpuhop.tf.connect`: the tunnel to a
TensorFlow server job, and the watchdog that ends it when the server is gone or frozen.

Why a process of its own: TensorFlow holds the GIL while it waits for a remote op, so no
Python thread in the user's process runs then, neither a tunnel's nor a watchdog's (a
tunnel there deadlocks the first remote op). This process forwards a local port to the
server's port inside its job's private network (`Job.forward`: the agent's socket, SSH, or
TLS and token) and tells its parent on stdout, one line each:

    ready PORT        the tunnel listens on 127.0.0.1:PORT and a gRPC server answered
    error MESSAGE     it could not start (then it exits)
    failed MESSAGE    the server went away or froze; the tunnel is closed (then it exits)

Every `probe_interval` seconds it makes a fresh HTTP/2 handshake with the server through
the tunnel (a gRPC server answers one even while it computes; a frozen one does not) and
checks the job. On a failure it says why on stderr too (the parent may be stuck in
TensorFlow), then closes the tunnel: the op in flight fails at once, and so does every
later one. It exits when its stdin closes (the parent closed the connection, or died).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import threading
import time

from gpuhop.client import Client, GpuhopError, Job, tfservers

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H2_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame
H2_SETTINGS_TYPE = 0x4
NO_ANSWER = "no answer"  # a probe's words for a server that holds the connection, silent
# How long a server whose connection fails (refused, reset, closed: its process is gone or
# going) may take to be recorded as ended by the agent, which is then said instead of
# "frozen". Seconds: on a loaded host the agent records a cancelled job's end a moment
# after its process dies.
SETTLE_S = 15.0


def probe(address: tuple[str, int], timeout: float) -> str | None:
    """None if a gRPC (HTTP/2) server answers a handshake at `address` within `timeout`
    seconds; else what went wrong. A TCP accept proves nothing (the kernel accepts for a
    frozen process), so it waits for the server's own SETTINGS frame."""
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection(address, timeout=timeout) as s:
            s.sendall(H2_PREFACE + H2_SETTINGS)
            header = b""
            while len(header) < 9:
                s.settimeout(max(0.001, deadline - time.monotonic()))
                chunk = s.recv(9 - len(header))
                if not chunk:
                    return "the connection closed before the server answered"
                header += chunk
    except TimeoutError:
        return f"{NO_ANSWER} within {timeout:g}s"
    except OSError as e:
        return f"the connection failed ({e.strerror or e})"
    if header[3] != H2_SETTINGS_TYPE:
        return "something that is not a gRPC server answered"
    return None


def stalled_message(job: Job, problem: str) -> str:
    """Why the server stopped answering, as far as the agent can tell."""
    try:
        info = job.refresh()
    except GpuhopError as e:
        return (
            f"the TensorFlow server (job {job.id}) stopped answering ({problem}), and so did"
            f" the agent ({e.message}): the connection to the GPU host is down. Remote ops"
            " fail from now on; connect again once it is back"
        )
    if not info.state.finished and not problem.startswith(NO_ANSWER):
        # Not silent but gone: its process died (a cancel, a crash) and the agent is about
        # to record the job's end, which says more than "frozen" would.
        deadline = time.monotonic() + SETTLE_S
        while not info.state.finished and time.monotonic() < deadline:
            time.sleep(0.2)
            with contextlib.suppress(GpuhopError):
                info = job.refresh()
    if info.state.finished:
        return tfservers.ended_message(job)
    return (
        f"the TensorFlow server (job {job.id}) stopped answering ({problem}) while its job"
        f" is {info.state.value}: it is frozen (stopped, or its host is overloaded). Remote"
        f" ops fail from now on. Restart it (gpuhop tf-server stop {info.name or job.id};"
        " gpuhop tf-server start) and connect again"
    )


def _say(kind: str, message: str) -> None:
    sys.stdout.write(f"{kind} {' '.join(message.splitlines())}\n")
    sys.stdout.flush()


def _watch(job: Job, fwd: object, stall: float, interval: float, stop: threading.Event) -> str:
    from gpuhop.client.forward import Forward

    assert isinstance(fwd, Forward)
    while not stop.wait(interval):
        if fwd.closed:
            with contextlib.suppress(GpuhopError):
                job.refresh()
            return tfservers.ended_message(job)
        problem = probe(fwd.address, stall)
        if problem is not None and not stop.is_set():
            return stalled_message(job, problem)
    return ""


def serve(args: argparse.Namespace) -> int:
    try:
        client = Client(args.home, remote=args.remote, autostart=False)
        job = client.job(args.job)
        fwd = job.forward(args.port)
    except GpuhopError as e:
        _say("error", e.message)
        return 1
    with client, fwd:
        problem = probe(fwd.address, args.stall_timeout)
        if problem is not None:
            _say(
                "error",
                f"the TensorFlow server (job {job.id}) does not answer ({problem}); it may be"
                f" frozen. See gpuhop logs {job.id}, or restart it (gpuhop tf-server stop"
                f" {job.info.name or job.id}; gpuhop tf-server start)",
            )
            return 1
        stop = threading.Event()

        def until_stdin_closes() -> None:
            # The parent closing our stdin (or dying) is the end of the connection. Read
            # the bare file descriptor: this thread, blocked in a read of sys.stdin, would
            # hold its buffer's lock, and the interpreter's exit after a failure (while
            # the parent still holds our stdin) would abort on it (Fatal Python error).
            while os.read(sys.stdin.fileno(), 4096):
                pass
            stop.set()

        threading.Thread(target=until_stdin_closes, daemon=True).start()
        _say("ready", str(fwd.local_port))
        reason = _watch(job, fwd, args.stall_timeout, args.probe_interval, stop)
        if reason:
            print(f"gpuhop: {reason}", file=sys.stderr, flush=True)
            _say("failed", reason)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuhop.tf.tunnel")
    parser.add_argument("--job", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--remote")
    parser.add_argument("--home")
    parser.add_argument("--stall-timeout", type=float, default=10.0)
    parser.add_argument("--probe-interval", type=float, default=2.0)
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
