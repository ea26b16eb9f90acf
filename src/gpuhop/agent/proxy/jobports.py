"""Runs in the agent: a connection to a port a job listens on, for every path that reaches
one (`gpuhop forward`'s WebSocket bridge and its hand-off on this host, the model-server
proxy).

An ordinary job's port is on the host's loopback, reached only where the job's own
processes are what listens (`gpuhop.backends.listeners`). A job in a private network
namespace (`private_network`, and every multi-worker job) is reached through its leader's
relay, a Unix socket in the job's dir that connects to the port inside the namespace and
hands the connected socket over (see `gpuhop.backends.local.relay` for why a relay rather
than setns). Which job, and whether the caller may reach it, is decided before: see
`gpuhop.agent.services.ports`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import struct
from pathlib import Path

from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.api import ErrorCode
from gpuhop.backends import listeners

# One read from the job's socket is at most this size (a WebSocket message, a stream's limit).
CHUNK = 256 * 1024
CONNECT_TIMEOUT = 5.0


def private(job: JobRecord) -> bool:
    """Whether the job's ports live in a private network namespace (reached by its relay)."""
    return job.spec.private_network or job.spec.workers > 1


async def connect(
    rt: AgentContext, job: JobRecord, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Streams over `open_socket`."""
    sock = await open_socket(rt, job, port)
    if sock.family == socket.AF_UNIX:  # an older relay that moves the bytes itself
        return await asyncio.open_unix_connection(sock=sock, limit=CHUNK)
    return await asyncio.open_connection(sock=sock, limit=CHUNK)


async def open_socket(rt: AgentContext, job: JobRecord, port: int) -> socket.socket:
    """A connected non-blocking socket to `port` where the job listens: this host's
    loopback, or the loopback of the job's private network (handed over by its relay)."""
    if private(job):
        sock = await asyncio.to_thread(
            _from_relay, rt.supervisor.job_paths(job.id).relay, job, port
        )
        sock.setblocking(False)
        return sock
    # The host's loopback is everybody's: reach only a port the job itself listens on.
    host, why = await asyncio.to_thread(listeners.job_loopback, job.pid or 0, port)
    if host is not None:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(
                asyncio.get_running_loop().sock_connect(sock, (host, port)), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError) as e:
            sock.close()
            why = f"{host}: {getattr(e, 'strerror', None) or e.__class__.__name__}"
        else:
            _nodelay(sock)
            return sock
    raise ApiError(
        502,
        ErrorCode.not_listening,
        f"job {job.id} has nothing listening on port {port} ({why})",
        {"port": port},
    )


def _nodelay(sock: socket.socket) -> None:
    # Without it, Nagle holds each small write (a gRPC frame) until the peer's delayed ACK.
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)


def _from_relay(path: Path, job: JobRecord, port: int) -> socket.socket:
    """The relay's connection to `port` in the job's private network (blocking; in a
    thread). The relay hands over the connected socket itself; an older one answers
    without it and then moves the bytes, so its own connection is the one to use."""
    where = f"job {job.id} (in its private network)"
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(CONNECT_TIMEOUT)
    try:
        conn.connect(str(path))
    except OSError as e:
        conn.close()
        raise ApiError(
            502,
            ErrorCode.not_listening,
            f"{where} cannot be reached: its relay does not answer"
            f" ({e.strerror or e.__class__.__name__}); it may be starting",
            {"port": port},
        ) from None
    fds: list[int] = []
    try:
        conn.sendall(struct.pack("!H", port))
        # The relay tries IPv4 then IPv6 loopback, each bounded by its own timeout.
        conn.settimeout(2 * CONNECT_TIMEOUT + 1)
        answer, fds, _, _ = socket.recv_fds(conn, 1, 1)
    except OSError as e:
        conn.close()
        raise ApiError(
            502,
            ErrorCode.not_listening,
            f"{where}: its relay failed ({e.__class__.__name__})",
            {"port": port},
        ) from None
    if answer != b"\x00":
        conn.close()
        for fd in fds:
            os.close(fd)
        if not answer:
            why = "the relay closed the connection"
        else:
            code = answer[0]
            why = os.strerror(code) if code in errno.errorcode else f"error {code}"
        raise ApiError(
            502,
            ErrorCode.not_listening,
            f"{where} has nothing listening on port {port} ({why})",
            {"port": port},
        )
    if not fds:
        conn.settimeout(None)
        return conn
    conn.close()
    return _stream_socket(fds[0], where)


def _stream_socket(fd: int, where: str) -> socket.socket:
    """The socket a relay handed over, if it is what a relay hands over: a connected TCP
    socket (the leader runs beside the job's code, so check what it sent)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        sock = None
    if (
        sock is None
        or sock.family not in (socket.AF_INET, socket.AF_INET6)
        or sock.type != socket.SOCK_STREAM
        or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    ):
        if sock is not None:
            sock.close()
        raise ApiError(
            502,
            ErrorCode.not_listening,
            f"{where}: its relay handed over something not a TCP connection",
        )
    _nodelay(sock)
    return sock
