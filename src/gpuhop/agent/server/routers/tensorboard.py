"""Runs in the agent: /v1/jobs/{ref}/tensorboard, a TensorBoard server for a job's logs.

    POST starts one (201), or hands back the one already running for that job (200)
    GET  the one that runs, or 404

Either answers a `TensorBoardInfo`; the server's port is reached through
/v1/jobs/{server}/ports/{port} (see `routers.ports`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from gpuhop.agent.callers import caller_of
from gpuhop.agent.context import AgentContext
from gpuhop.agent.services import tensorboard as service
from gpuhop.api import TensorBoardInfo

router = APIRouter(prefix="/v1/jobs", tags=["tensorboard"])


def ctx(request: Request) -> AgentContext:
    c: AgentContext = request.app.state.ctx
    return c


@router.post("/{ref}/tensorboard", status_code=201)
def start(ref: str, request: Request, response: Response) -> TensorBoardInfo:
    info = service.start(ctx(request), ref, caller_of(request))
    if info.reused:
        response.status_code = 200
    return info


@router.get("/{ref}/tensorboard")
def show(ref: str, request: Request) -> TensorBoardInfo:
    return service.info(ctx(request), ref, caller_of(request))
