"""Runs in the agent: /v1/trees (work-dir manifests, stored once, named by digest), sent
whole or, for a re-sync, as the changes from a tree the caller already stored."""

from __future__ import annotations

import asyncio
from functools import partial

from fastapi import APIRouter, Request

from gpuhop.agent.callers import caller_of
from gpuhop.agent.errors import ApiError
from gpuhop.agent.server.routers.blobs import drain
from gpuhop.agent.services import trees
from gpuhop.agent.services.trees import MAX_TREE_BYTES
from gpuhop.agent.storage.trees import TreeTooLarge, TreeUpload, manifest_errors
from gpuhop.api import ErrorCode, TreeDelta, TreeStored

router = APIRouter(prefix="/v1/trees", tags=["trees"])

# A tree goes to a temp file as it arrives (a piece at a time in memory, so a slow sender
# holds up no one else) and is then checked from there an entry at a time (see
# TreeStore.store), which holds its paths and distinct digests: some tens of MB at the cap.
# One check at a time, so that many uploads at once cost the agent no more than one (and a
# delta, applied one at a time too: see `services.trees`).
_ONE_TREE = asyncio.Semaphore(1)


async def receive(request: Request, upload: TreeUpload) -> None:
    """Write the request's body to `upload`; past its cap, drain the rest and answer 413."""
    try:
        async for chunk in request.stream():
            upload.write(chunk)
    except TreeTooLarge as e:
        await drain(request)  # so that the client, still sending, reads the answer
        raise ApiError(413, ErrorCode.too_large, str(e)) from None


@router.post("", status_code=201)
async def upload(request: Request) -> TreeStored:
    ctx = request.app.state.ctx
    caller = caller_of(request)
    upload = ctx.trees.receive(MAX_TREE_BYTES)
    # A blob the caller never sent is missing to them (see gpuhop.agent.storage.claims).
    unclaimed = None if caller.admin else partial(ctx.claims.unclaimed, caller.user, "blob")
    try:
        await receive(request, upload)
        async with _ONE_TREE:
            with manifest_errors():
                digest, tree = await asyncio.to_thread(ctx.trees.store, upload, unclaimed)
    finally:
        upload.close()
    if not caller.admin:  # who holds every blob it names (checked as it was stored)
        await asyncio.to_thread(ctx.claims.claim, caller.user, "tree", [digest])
    return TreeStored(digest=digest, files=tree.files, bytes=tree.bytes)


@router.post("/delta", status_code=201)
async def upload_delta(delta: TreeDelta, request: Request) -> TreeStored:
    """A tree as its changes from `delta.parent` (see `services.trees`)."""
    ctx, caller = request.app.state.ctx, caller_of(request)
    return await asyncio.to_thread(trees.store_delta, ctx, delta, caller)
