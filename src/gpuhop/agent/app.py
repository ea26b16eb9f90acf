"""Runs in the agent: the FastAPI application (routes, error answers, the scheduler task)."""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from gpuhop import __version__
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError, describe_errors
from gpuhop.agent.routers import agent, blobs, datasets, jobs, trees
from gpuhop.api import ErrorBody, ErrorCode


def _error(status: int, code: ErrorCode, message: str, detail: dict | None = None) -> JSONResponse:
    body = ErrorBody(code=code, message=message, detail=detail)
    return JSONResponse(status_code=status, content=body.model_dump(mode="json"))


def create_app(ctx: AgentContext) -> FastAPI:
    # pydantic >= 2.12 warns about the alias FastAPI gives a body parameter's field, although
    # it works (pydantic#12356); the warning would fill every agent log.
    warnings.filterwarnings(
        "ignore", message=r"The 'alias' attribute with value", module=r"pydantic\._internal"
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(ctx.run_scheduler(), name="scheduler")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app = FastAPI(title="gpuhop agent", version=__version__, lifespan=lifespan)
    app.state.ctx = ctx
    for router in (jobs.router, blobs.router, trees.router, agent.router, datasets.router):
        app.include_router(router)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.message, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, ErrorCode.bad_request, describe_errors(exc.errors()))

    return app
