"""Runs in the agent: port forwarding, a job's loopback port bridged to a WebSocket.

A client opens one WebSocket per TCP connection it forwards. The agent checks the job
(found, running) and connects to the port before it accepts, so every refusal is a plain
HTTP error with an `ErrorBody`. Then bytes flow both ways as binary messages until either
side is done. An ordinary job's port is on the host's loopback, reached only where the
job's own processes are what listens (`gpuhop.backends.listeners`). A job in a private network
namespace (`private_network`, and every multi-worker job) is reached through its leader's
relay, a Unix socket in the job's dir that connects to the port inside the namespace and
hands the connected socket over (see `gpuhop.backends.local.relay` for why a relay rather
than setns). A client on this host skips the WebSocket: the agent hands it the connected
socket in turn (`open_socket`, through `gpuhop.agent.server.handoff`), so no byte of a
forward on this host passes through the agent.

Wire protocol over the WebSocket, both directions: a binary message is data; the text
message "eof" says the sender will send no more data (TCP half-close: the receiver shuts
down the write side of its socket). When both sides have sent "eof" the agent closes with
1000. Close 1001 means the job ended; 1011 that the job's end of the connection failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from starlette.websockets import WebSocket, WebSocketDisconnect

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.agent.services import jobs
from gpuhop.api import ErrorCode, JobState
from gpuhop.backends import listeners

EOF = "eof"
# One read from the job's socket becomes one message of at most this size.
CHUNK = 256 * 1024
# How often an open tunnel checks that its job still runs. A job's exit closes its
# sockets anyway; this catches children that outlive it and hold them open.
JOB_CHECK_SECONDS = 1.0
CONNECT_TIMEOUT = 5.0


def parse_port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ApiError(400, ErrorCode.bad_request, f"a port is a number 1-65535, not {text!r}")
    return int(text)


def forwardable(rt: AgentContext, ref: str, caller: Caller) -> JobRecord:
    """The job `ref` names, if `caller` may see it (only its owner, or an admin) and it runs
    now in a way whose ports can be reached."""
    job = jobs.find(rt, ref, caller)
    if rt.backend.elsewhere(rt.supervisor.job_paths(job.id)):
        raise ApiError(
            409,
            ErrorCode.conflict,
            f"job {job.id} runs on {rt.backend.where}, not on the agent's host; gpuhop forward"
            " reaches ports on the agent's host only",
        )
    if job.state != JobState.running:
        when = "has not started yet" if not job.state.finished else "has ended"
        raise ApiError(
            409,
            ErrorCode.conflict,
            f"job {job.id} is {job.state.value}: it {when}, so it has no ports to forward",
            {"state": job.state.value},
        )
    return job


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


async def check(rt: AgentContext, ref: str, port_text: str, caller: Caller) -> JobRecord:
    """Refuse as `bridge` would, without keeping a connection: a forward's first check."""
    port = parse_port(port_text)
    job = forwardable(rt, ref, caller)
    (await open_socket(rt, job, port)).close()
    return job


@dataclass(frozen=True)
class _Close:
    """How a tunnel ends: the close code to send, or None when the client has gone."""

    code: int | None
    reason: str = ""


async def bridge(
    rt: AgentContext,
    ws: WebSocket,
    job: JobRecord,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    """Carry bytes between an accepted WebSocket and a job's socket until one side is done."""
    up_eof, down_eof = asyncio.Event(), asyncio.Event()

    async def upstream() -> _Close:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return _Close(None)
            data = message.get("bytes")
            if data is not None:
                if up_eof.is_set():
                    return _Close(1002, "data after eof")
                writer.write(data)
                await writer.drain()  # the job reads slowly: stop reading the client
            elif message.get("text") == EOF:
                if writer.can_write_eof():
                    writer.write_eof()
                up_eof.set()

    async def downstream() -> _Close | None:
        while data := await reader.read(CHUNK):
            await ws.send_bytes(data)
        await ws.send_text(EOF)
        down_eof.set()
        return None

    async def both_done() -> _Close:
        await up_eof.wait()
        await down_eof.wait()
        return _Close(1000)

    async def job_ended() -> _Close:
        while True:
            await asyncio.sleep(JOB_CHECK_SECONDS)
            state = rt.store.get(job.id).state
            if state.finished:
                return _Close(1001, f"job {job.id} has {state.value}")

    tasks = {asyncio.create_task(f()) for f in (upstream, downstream, both_done, job_ended)}
    outcome: _Close | None = None
    try:
        while outcome is None and tasks:
            done, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                # Every task that ended is read, the first outcome kept: one left unread
                # with an error would be reported as "Task exception was never retrieved".
                ended = _outcome(task)
                outcome = outcome or ended
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await _close(writer)
    if outcome is not None and outcome.code is not None:
        with contextlib.suppress(RuntimeError, WebSocketDisconnect, OSError):
            await ws.close(outcome.code, outcome.reason)


def _outcome(task: asyncio.Task[_Close | None]) -> _Close | None:
    try:
        return task.result()
    except (WebSocketDisconnect, RuntimeError):
        return _Close(None)  # the client went away mid-send
    except OSError as e:
        return _Close(1011, f"the job's end of the connection failed: {e.strerror or e}")


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
