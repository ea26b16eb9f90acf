"""Runs in the agent: one forwarded TCP connection carried over a WebSocket, between a
client of `gpuhop forward` and a job's port (`jobports`).

The route has checked the job and connected to its port before it accepts the WebSocket
(`gpuhop.agent.server.routers.ports`), so every refusal is a plain HTTP error. Then bytes
flow both ways as binary messages until either side is done.

Wire protocol over the WebSocket, both directions: a binary message is data; the text
message "eof" says the sender will send no more data (TCP half-close: the receiver shuts
down the write side of its socket). When both sides have sent "eof" the agent closes with
1000. Close 1001 means the job ended; 1011 that the job's end of the connection failed.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from starlette.websockets import WebSocket, WebSocketDisconnect

from gpuhop.agent.context import AgentContext
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.agent.proxy.jobports import CHUNK

EOF = "eof"
# How often an open tunnel checks that its job still runs. A job's exit closes its
# sockets anyway; this catches children that outlive it and hold them open.
JOB_CHECK_SECONDS = 1.0


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
                return _Close(1001, f"job {job.id} {state.said}")

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
