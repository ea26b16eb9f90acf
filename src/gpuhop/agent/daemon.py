"""Runs on the GPU host: serves the agent in this process until SIGTERM.

One agent per state dir, guarded by an flock on `agent.lock`, listening on `agent.sock`
(mode 0600 in a 0700 dir; no TCP port). Jobs run in their own sessions and survive the
agent: stopping it never stops a job.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import socket
import time
from pathlib import Path

from gpuhop.home import AgentError, AgentPaths, read_pid


def serve(
    paths: AgentPaths, fake_gpus: int | None = None, fake_gpu_memory_mb: int | None = None
) -> None:
    """Run the agent in this process until SIGTERM or SIGINT.

    `fake_gpus=N` pretends the host has N GPUs of `fake_gpu_memory_mb` (default 8192) each.
    """
    import uvicorn

    from gpuhop.agent import gpus
    from gpuhop.agent.app import create_app
    from gpuhop.agent.context import AgentContext

    paths.ensure()
    lock_fd = os.open(paths.lockfile, os.O_RDWR | os.O_CREAT, 0o600)
    if not _take_lock(lock_fd):
        raise AgentError(f"an agent already runs for {paths.home} (pid {read_pid(paths)})")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    paths.pidfile.write_text(f"{os.getpid()}\n")
    sock = _bind_unix_socket(paths.socket)
    ctx = AgentContext(
        paths, gpus.discover(fake_gpus, fake_gpu_memory_mb or gpus.FAKE_GPU_MEMORY_MB)
    )
    config = uvicorn.Config(
        create_app(ctx),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    logging.getLogger("gpuhop.agent").info(
        "agent %d serving %s with %d GPU(s) (%s)",
        os.getpid(),
        paths.socket,
        len(ctx.gpus),
        ctx.gpu_host.source,
    )
    # uvicorn re-raises the signal that stopped it once it has shut down; with these
    # no-op handlers in place that re-raise returns here and the cleanup below runs.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        ctx.close()
        with contextlib.suppress(OSError):
            paths.socket.unlink()
        with contextlib.suppress(OSError):
            paths.pidfile.unlink()
        os.close(lock_fd)


def _take_lock(fd: int, patience: float = 1.0) -> bool:
    # A client checking for a running agent holds the lock for an instant: retry briefly.
    deadline = time.monotonic() + patience
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


def _bind_unix_socket(path: Path) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket from an agent that died; we hold the lock
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(128)
    return sock
