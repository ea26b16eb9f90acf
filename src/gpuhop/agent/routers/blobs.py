"""Runs in the agent: /v1/blobs routes (which blobs are missing; framed uploads)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gpuhop.agent.blobs import BlobError
from gpuhop.agent.errors import ApiError
from gpuhop.api import BlobCheck, BlobCheckResult, ErrorCode

router = APIRouter(prefix="/v1/blobs", tags=["blobs"])


@router.post("/missing")
def missing(req: BlobCheck, request: Request) -> BlobCheckResult:
    return BlobCheckResult(missing=request.app.state.ctx.blobs.missing(req.digests))


@router.post("/upload")
async def upload(request: Request) -> dict[str, int]:
    try:
        stored, size = await request.app.state.ctx.blobs.receive(request.stream())
    except BlobError as e:
        raise ApiError(400, ErrorCode.bad_blob, str(e)) from None
    return {"stored": stored, "bytes": size}
