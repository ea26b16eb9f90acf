"""Runs in the agent: /v1/jobs/{ref}/ports/{port}, a job's loopback port over the API.

GET checks that the port can be forwarded now (the client's first check); the WebSocket
on the same path carries one forwarded TCP connection (see `gpuhop.agent.proxy.bridge`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, WebSocket

from gpuhop.agent.callers import caller_of
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, error_response
from gpuhop.agent.proxy.bridge import bridge
from gpuhop.agent.proxy.jobports import connect
from gpuhop.agent.services import ports as service

router = APIRouter(prefix="/v1/jobs", tags=["ports"])


def ctx(conn: Request | WebSocket) -> AgentContext:
    c: AgentContext = conn.app.state.ctx
    return c


@router.get("/{ref}/ports/{port}")
async def check(ref: str, port: str, request: Request) -> dict[str, object]:
    job = await service.check(ctx(request), ref, port, caller_of(request))
    return {"job": job.id, "port": int(port)}


@router.websocket("/{ref}/ports/{port}")
async def forward(websocket: WebSocket, ref: str, port: str) -> None:
    c = ctx(websocket)
    try:
        job = service.forwardable(c, ref, caller_of(websocket))
        reader, writer = await connect(c, job, service.parse_port(port))
    except ApiError as e:
        # Refused before the handshake: the client reads a plain HTTP error, as for any route.
        await websocket.send_denial_response(error_response(e.status, e.code, e.message, e.detail))
        return
    await websocket.accept()
    await bridge(c, websocket, job, reader, writer)
