"""Runs in the agent: /v1/trees (work-dir manifests, stored once, named by digest)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from pydantic import ValidationError

from gpuhop.agent.errors import ApiError, describe_errors
from gpuhop.agent.trees import MissingBlobs, TreeError
from gpuhop.api import ErrorCode, TreeStored

router = APIRouter(prefix="/v1/trees", tags=["trees"])

# 200,000 files at about 150 bytes each, with room to spare.
MAX_TREE_BYTES = 64 * 1024 * 1024


@router.post("", status_code=201)
async def upload(request: Request) -> TreeStored:
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_TREE_BYTES:
            raise ApiError(
                413, ErrorCode.too_large, f"a tree may be at most {MAX_TREE_BYTES} bytes"
            )
    trees = request.app.state.ctx.trees
    try:
        digest, tree = await asyncio.to_thread(trees.store, bytes(raw))
    except ValidationError as e:
        raise ApiError(422, ErrorCode.bad_request, describe_errors(e.errors())) from None
    except TreeError as e:
        raise ApiError(400, ErrorCode.bad_path, str(e)) from None
    except MissingBlobs as e:
        raise ApiError(409, ErrorCode.missing_blobs, str(e), {"missing": e.missing}) from None
    return TreeStored(
        digest=digest, files=len(tree.entries), bytes=sum(e.size for e in tree.entries)
    )
