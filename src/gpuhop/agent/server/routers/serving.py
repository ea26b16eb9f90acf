"""Runs in the agent: /v1/serve, model server jobs and the proxy to them.

    POST /v1/serve              start a model server job (`ServeRequest` -> `JobInfo`)
    GET  /v1/serve/{ref}        what the agent knows of it (`ServingInfo`)
    ANY  /v1/serve/{ref}/{path} the request passed to its server, e.g.
                                POST /v1/serve/digits/v1/models/digits:predict

so `https://agent/v1/serve/digits` works as a TF Serving base URL with the caller's token.

A predict request is the agent's hottest path, so `Proxy` answers GET and POST to the
last of these as soon as the request reaches the app, before FastAPI's routing and its
middleware (which cost as much as the proxying itself: bench: serving, with py-spy on the
agent); the route below stays for the API's schema and any other method.
"""

from __future__ import annotations

import logging
import re

from fastapi import APIRouter, Request, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gpuhop.agent.callers import caller_of
from gpuhop.agent.context import AgentContext
from gpuhop.agent.proxy.modelserver import ModelProxy, error
from gpuhop.agent.services import serving as service
from gpuhop.api import ErrorCode, JobInfo, ServeRequest, ServingInfo

log = logging.getLogger("gpuhop.agent")

router = APIRouter(prefix="/v1/serve", tags=["serving"])


def ctx(request: Request) -> AgentContext:
    c: AgentContext = request.app.state.ctx
    return c


@router.post("", status_code=201)
def start(req: ServeRequest, request: Request) -> JobInfo:
    return service.start(ctx(request), req, caller_of(request))


@router.get("/{ref}")
def show(ref: str, request: Request) -> ServingInfo:
    return service.info(ctx(request), ref, caller_of(request))


# One route per method, so that each has its own OpenAPI operation id (one route with two
# methods gives both the same id, and FastAPI warns of the duplicate).
@router.get("/{ref}/{path:path}")
@router.post("/{ref}/{path:path}")
async def proxy(ref: str, path: str, request: Request) -> Response:
    model_proxy: ModelProxy = request.app.state.model_proxy
    return await service.proxy(ctx(request), model_proxy, ref, path, request, caller_of(request))


PROXIED = re.compile(r"/v1/serve/(?P<ref>[^/]+)/(?P<path>.*)", re.DOTALL)


class Proxy:
    """ASGI middleware: GET and POST to /v1/serve/{ref}/{path} go to `proxy` directly."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("GET", "POST"):
            match = PROXIED.fullmatch(scope["path"])
            if match is not None:
                request = Request(scope, receive)
                try:
                    response = await proxy(match["ref"], match["path"], request)
                except Exception as e:  # the app's handlers sit in the routing skipped here
                    log.exception("%s %s failed", scope["method"], scope["path"])
                    response = error(500, ErrorCode.internal, f"the agent failed: {e}")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
