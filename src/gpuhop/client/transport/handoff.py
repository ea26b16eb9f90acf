"""Runs on the GPU host, in a client of the agent there: a forwarded connection handed over
as a socket, so that its bytes go straight between this process and the job.

The agent on this host answers on its handoff socket (see `gpuhop.agent.server.handoff`
for the protocol and why): it makes the same checks as for a forward's WebSocket, connects
to the job's port and passes the connected socket over the Unix socket (`SCM_RIGHTS`).
Only a local agent's endpoint has one; through SSH or TLS a forward takes the WebSocket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket

from gpuhop.client.errors import GpuhopError

TIMEOUT = 20.0  # the agent's own connect takes at most 2 x 5 s (a relay's two loopbacks)
CHUNK = 256 * 1024


def connect(path: str, job: str, port: int, timeout: float = TIMEOUT) -> socket.socket | None:
    """The job's port `port`, connected (a blocking socket), from the agent's handoff socket
    at `path`; None if there is none (an agent older than the handoff). Blocking: call it
    off the event loop."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    fds: list[int] = []
    with conn:
        try:
            conn.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        try:
            conn.sendall(json.dumps({"job": job, "port": port}).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk, got, _, _ = socket.recv_fds(conn, 65536, 1)
                fds += got
                if not chunk:
                    break
                data += chunk
        except OSError as e:
            _close_all(fds)
            raise GpuhopError(
                f"the agent at {path} did not hand over the connection: {e.strerror or e}",
                code="unreachable",
            ) from None
    try:
        answer = json.loads(data)
        status = int(answer["status"])
    except (ValueError, KeyError, TypeError):
        _close_all(fds)
        raise GpuhopError(
            f"the agent at {path} answered a handoff with {data[:200]!r}", code="unreachable"
        ) from None
    if status != 200:
        _close_all(fds)
        raise GpuhopError(
            str(answer.get("message", f"the agent refused the connection: {status}")),
            str(answer.get("code") or "error"),
            status,
            answer.get("detail"),
        )
    if len(fds) != 1:
        _close_all(fds)
        raise GpuhopError(f"the agent at {path} answered a handoff without a connection")
    sock = socket.socket(fileno=fds[0])
    sock.setblocking(True)  # the agent's non-blocking mode came with it
    return sock


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


async def pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sock: socket.socket
) -> bool:
    """Move bytes between a local connection and the job's socket until both directions
    have ended (half-closes passed on). True if both ended cleanly; False if either side
    failed (then the other direction is stopped too)."""
    sock.setblocking(False)
    job_reader, job_writer = await asyncio.open_connection(sock=sock, limit=CHUNK)

    async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while data := await src.read(CHUNK):
            write(dst, data)
            await dst.drain()  # the receiver is behind: stop reading the sender
        if dst.can_write_eof():
            dst.write_eof()

    tasks = [
        asyncio.create_task(copy(reader, job_writer)),
        asyncio.create_task(copy(job_reader, writer)),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        return all(t.done() and not t.cancelled() and t.exception() is None for t in tasks)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task
        job_writer.close()


def write(dst: asyncio.StreamWriter, data: bytes) -> None:
    """`dst.write(data)`; ConnectionResetError where the peer has ended the connection
    already. uvloop closes a transport as soon as a read fails (a local client that reset)
    and tells its stream a loop turn later: a write in between raises RuntimeError there."""
    if dst.is_closing():
        raise ConnectionResetError("the connection was closed by its other end")
    dst.write(data)
