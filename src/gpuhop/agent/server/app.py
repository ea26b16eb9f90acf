"""Runs in the agent: the FastAPI application (routes, error answers, the scheduler task).

The app knows nothing of listeners: the daemon serves it behind one auth middleware per
listener (see `gpuhop.agent.server.auth`), which tells each route who is calling.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import sqlite3
import warnings
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from gpuhop.agent.context import AgentContext
from gpuhop.agent.duties.runner import run_duties
from gpuhop.agent.errors import ApiError, describe_errors, error_response
from gpuhop.agent.proxy.modelserver import ModelProxy
from gpuhop.agent.server import handoff
from gpuhop.agent.server.limits import BodyLimit
from gpuhop.agent.server.routers import (
    agent,
    blobs,
    datasets,
    fastjobs,
    images,
    jobs,
    metrics,
    ports,
    secrets,
    serving,
    sweeps,
    tensorboard,
    tokens,
    trees,
    ui,
)
from gpuhop.agent.services.doctor import ProbeRuns
from gpuhop.agent.services.listing import Listing
from gpuhop.agent.services.logwatch import LogWatch
from gpuhop.agent.services.longcalls import LongCalls
from gpuhop.agent.storage.blobs import QuotaExceeded
from gpuhop.agent.ui import api as ui_api
from gpuhop.agent.ui import pages as ui_pages
from gpuhop.agent.ui.gate import UiGate
from gpuhop.agent.ui.sessions import UiSessions
from gpuhop.api import ErrorCode
from gpuhop.version import __version__

log = logging.getLogger("gpuhop.agent")
# The disk (or the user's disk quota) is full: the answer is 507, as for our own quotas.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)

_HTTP_CODES = {
    401: ErrorCode.unauthorized,
    403: ErrorCode.forbidden,
    404: ErrorCode.not_found,
    413: ErrorCode.too_large,
}
# FastAPI's answer to a JSON body its parser failed on other than by the syntax (bytes that
# are not UTF-8, nesting past the recursion limit).
_UNPARSED = "There was an error parsing the body"


def create_app(ctx: AgentContext) -> FastAPI:
    # pydantic >= 2.12 warns about the alias FastAPI gives a body parameter's field, although
    # it works (pydantic#12356); the warning would fill every agent log.
    warnings.filterwarnings(
        "ignore", message=r"The 'alias' attribute with value", module=r"pydantic\._internal"
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tasks = [
            asyncio.create_task(ctx.scheduler.run_scheduler(), name="scheduler"),
            asyncio.create_task(run_duties(ctx), name="duties"),
            asyncio.create_task(
                handoff.serve(ctx, handoff.listen(ctx.paths.handoff)), name="handoff"
            ),
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await app.state.model_proxy.aclose()
            await app.state.log_watch.aclose()

    app = FastAPI(title="gpuhop agent", version=__version__, lifespan=lifespan)
    app.state.ctx = ctx
    # Requests that wait on the outside world: a bound on those at once (see `longcalls`).
    app.state.long_calls = LongCalls()
    # The model-server proxy's connections and lookups, shared (see `proxy.modelserver`).
    app.state.model_proxy = ModelProxy()
    # `doctor`'s TensorFlow probe: one at a time, its report reused briefly.
    app.state.probes = ProbeRuns()
    # The dashboard's login codes and browser sessions (in memory; see gpuhop.agent.ui.sessions).
    app.state.ui_sessions = UiSessions()
    # `ps`'s answer, each job's JSON kept until it changes (see `services.listing`).
    app.state.listing = Listing()
    # The `logs -f` streams' shared watches of their logs (see `services.logwatch`).
    app.state.log_watch = LogWatch(ctx.store)
    routers = (jobs.router, ports.router, blobs.router, trees.router, agent.router)
    extra = (tokens.router, datasets.router, serving.router, tensorboard.router, ui.router)
    for router in (*routers, *extra, secrets.router, images.router, sweeps.router):
        app.include_router(router)
    app.include_router(metrics.router)
    app.include_router(ui_pages.router)
    app.include_router(ui_api.router)
    app.add_middleware(BodyLimit)
    # Every /ui path but the login and the static files needs a session (gpuhop.agent.ui.gate).
    app.add_middleware(UiGate, sessions=app.state.ui_sessions)
    # `ps` and `logs` skip the routing (see routers.fastjobs).
    app.add_middleware(fastjobs.FastJobs)
    # Requests to model servers skip the routing (see routers.serving).
    app.add_middleware(serving.Proxy)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.detail)

    @app.exception_handler(QuotaExceeded)
    async def over_quota(request: Request, exc: QuotaExceeded) -> JSONResponse:
        return error_response(507, ErrorCode.insufficient_storage, str(exc))

    @app.exception_handler(OSError)
    async def os_error(request: Request, exc: OSError) -> JSONResponse:
        if exc.errno in NO_SPACE:
            return error_response(
                507,
                ErrorCode.insufficient_storage,
                f"the GPU host's disk is full ({exc.strerror}: {exc.filename or 'a write'});"
                " free space there (gpuhop gc) and try again",
            )
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, ErrorCode.internal, f"the agent failed: {exc}")

    @app.exception_handler(sqlite3.OperationalError)
    async def db_error(request: Request, exc: sqlite3.OperationalError) -> JSONResponse:
        # Not an OSError: SQLite says "database or disk is full" (SQLITE_FULL) on its own.
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            return error_response(
                507,
                ErrorCode.insufficient_storage,
                "the GPU host's disk is full (the agent cannot record this in its job store);"
                " free space there (gpuhop gc) and try again",
            )
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, ErrorCode.internal, f"the agent failed: {exc}")

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, exc: ClientDisconnect) -> Response:
        # The client went away while it sent a body (an upload given up on): nothing failed
        # here, and no one reads the answer (nginx's "client closed request").
        log.info(
            "%s %s: the client went away before its body ended", request.method, request.url.path
        )
        return Response(status_code=499)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, ErrorCode.bad_request, describe_errors(exc.errors()))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # Starlette's own answers (no such route, wrong method, body too large) in the same
        # shape as every other error.
        if exc.status_code == 404:
            message = f"no such route: {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"{request.url.path} does not take {request.method}"
        elif exc.status_code == 400 and exc.detail == _UNPARSED:
            # FastAPI's words where JSON's parser failed other than on the syntax.
            message = "the request body is not valid JSON (not UTF-8 text, or nested too deep)"
        else:
            message = str(exc.detail)
        return error_response(
            exc.status_code, _HTTP_CODES.get(exc.status_code, ErrorCode.bad_request), message
        )

    return app
