"""Runs in the agent: forwards on the agent's own host get the job's connected socket.

A forward through the API carries every byte over a WebSocket, through the agent's event
loop (`gpuhop.agent.proxy.bridge`): what a remote client needs, and a hop each way for every
small message (a remote TensorFlow op is many). A client on this host can be handed the
connection itself instead: it asks on a second Unix socket beside the agent's
(`AgentPaths.handoff`, mode 0600 in the same 0700 directory, so it reaches the same
callers, the agent's owner, and never a job, which does not see the agent's directory),
and gets the socket connected to the job's port, as `SCM_RIGHTS`. From then on the bytes
go between the client and the job with no agent in between.

Protocol, one request per connection: the client sends one line of JSON,
`{"job": REF, "port": PORT}`; the agent answers one line of JSON, `{"status": 200, "job":
ID}` with the socket attached, or `{"status": 4xx/5xx, "code", "message", "detail"}` (an
`ErrorBody` with its HTTP status: the same refusals, in the same words, as the WebSocket's),
and closes. Only the Unix socket's owner reaches it, so the caller is the owner, an admin,
as on the agent's socket (`auth.OwnerAuth`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from pathlib import Path

from gpuhop.agent.callers import Caller, owner_login
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError
from gpuhop.agent.proxy.jobports import open_socket
from gpuhop.agent.services import ports
from gpuhop.api import ErrorBody, ErrorCode

log = logging.getLogger("gpuhop.agent")
MAX_REQUEST = 4096
REQUEST_TIMEOUT = 5.0


def listen(path: Path) -> socket.socket:
    """The handoff socket at `path` (a stale one replaced: the agent holds its lock), 0600."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # no moment where another user could connect
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def serve(ctx: AgentContext, sock: socket.socket) -> None:
    """Answer handoff requests on `sock` until cancelled; closes it then."""
    loop = asyncio.get_running_loop()
    caller = Caller(owner_login(), admin=True)
    pending: set[asyncio.Task[None]] = set()
    try:
        while True:
            conn, _ = await loop.sock_accept(sock)
            task = asyncio.create_task(_answer(ctx, caller, conn))
            pending.add(task)
            task.add_done_callback(pending.discard)
    finally:
        for task in list(pending):
            task.cancel()
        sock.close()


async def _answer(ctx: AgentContext, caller: Caller, conn: socket.socket) -> None:
    with conn:
        conn.setblocking(False)
        try:
            ref, port = _parse(await asyncio.wait_for(_read_line(conn), REQUEST_TIMEOUT))
            job = ports.forwardable(ctx, ref, caller)
            target = await open_socket(ctx, job, port)
        except ApiError as e:
            body = ErrorBody(code=e.code, message=e.message, detail=e.detail)
            _send(conn, {"status": e.status, **body.model_dump(mode="json")})
            return
        except (OSError, TimeoutError):
            return  # the client went away
        with target:
            _send(conn, {"status": 200, "job": job.id}, target.fileno())


async def _read_line(conn: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    while b"\n" not in data:
        chunk = await loop.sock_recv(conn, MAX_REQUEST)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST:
            raise _bad(f"a handoff request is one line of at most {MAX_REQUEST} bytes")
    return data.partition(b"\n")[0]


def _parse(line: bytes) -> tuple[str, int]:
    try:
        request = json.loads(line)
    except ValueError:
        raise _bad('a handoff request is one line of JSON: {"job": REF, "port": PORT}') from None
    if not isinstance(request, dict) or not isinstance(request.get("job"), str):
        raise _bad('a handoff request names its job: {"job": REF, "port": PORT}')
    return request["job"], ports.parse_port(str(request.get("port")))


def _bad(message: str) -> ApiError:
    return ApiError(400, ErrorCode.bad_request, message)


def _send(conn: socket.socket, answer: dict[str, object], fd: int | None = None) -> None:
    data = json.dumps(answer).encode() + b"\n"
    # One short message into an empty socket buffer: it does not block.
    with contextlib.suppress(OSError):
        socket.send_fds(conn, [data], [] if fd is None else [fd])
