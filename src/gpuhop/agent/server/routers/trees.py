"""Runs in the agent: /v1/trees (work-dir manifests, stored once, named by digest), sent
whole or, for a re-sync, as the changes from a tree the caller already stored."""

from __future__ import annotations

import asyncio
import base64
import binascii

from fastapi import APIRouter, Request

from gpuhop.agent.callers import caller_of
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError
from gpuhop.agent.server.routers.blobs import drain
from gpuhop.agent.storage.blobs import BlobError
from gpuhop.agent.storage.trees import TreeTooLarge, TreeUpload, manifest_errors
from gpuhop.api import ErrorCode, TreeStored
from gpuhop.api.treedelta import TreeDelta

router = APIRouter(prefix="/v1/trees", tags=["trees"])

# 200,000 files at about 150 bytes each, with room to spare.
MAX_TREE_BYTES = 64 * 1024 * 1024
# A tree goes to a temp file as it arrives (a piece at a time in memory, so a slow sender
# holds up no one else) and is then checked from there an entry at a time (see
# TreeStore.store), which holds its paths and distinct digests: some tens of MB at the cap.
# One check at a time, so that many uploads at once cost the agent no more than one.
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
    try:
        await receive(request, upload)
        async with _ONE_TREE:
            with manifest_errors():
                digest, tree = await asyncio.to_thread(ctx.trees.store, upload)
    finally:
        upload.close()
    if not caller.admin:
        await _claim(ctx, caller.user, digest, tree.digests)
    return TreeStored(digest=digest, files=tree.files, bytes=tree.bytes)


@router.post("/delta", status_code=201)
async def upload_delta(delta: TreeDelta, request: Request) -> TreeStored:
    """A tree as its changes from `delta.parent`. The parent must be one this caller may
    read (stored by them, for a user who is not an admin): knowing a tree's digest is not
    holding its files. Else 409 missing_tree, and the client sends the whole tree."""
    ctx = request.app.state.ctx
    caller = caller_of(request)
    parent = delta.parent
    if not ctx.trees.has(parent) or (
        not caller.admin
        and await asyncio.to_thread(ctx.claims.unclaimed, caller.user, "tree", [parent])
    ):
        raise ApiError(
            409,
            ErrorCode.missing_tree,
            f"tree {parent} is not on the agent; send the whole tree",
            {"tree": parent},
        )
    if delta.blobs:
        stored = await asyncio.to_thread(_store_inline, ctx, delta.blobs)
        if not caller.admin:  # their bytes matched: proof of holding them
            await asyncio.to_thread(ctx.claims.claim, caller.user, "blob", stored)
    async with _ONE_TREE:
        with manifest_errors():
            try:
                digest, tree = await asyncio.to_thread(ctx.trees.store_delta, delta, MAX_TREE_BYTES)
            except TreeTooLarge as e:
                raise ApiError(413, ErrorCode.too_large, str(e)) from None
    if not caller.admin:
        # The parent's blobs were this user's when they stored it (a tree is claimed only
        # then), and stay stored while it does: only the changed entries' need a look.
        await _claim(ctx, caller.user, digest, [e.digest for e in delta.changed])
    return TreeStored(digest=digest, files=tree.files, bytes=tree.bytes)


def _store_inline(ctx: AgentContext, blobs: dict[str, str]) -> list[str]:
    """Store the files a delta carries; each must hash to its digest."""
    for digest, text in blobs.items():
        try:
            data = base64.b64decode(text, validate=True)
        except binascii.Error:
            raise ApiError(422, ErrorCode.bad_request, f"blobs.{digest}: not base64") from None
        try:
            ctx.blobs.put(digest, data)
        except BlobError as e:
            raise ApiError(400, ErrorCode.bad_blob, str(e)) from None
    return list(blobs)


async def _claim(ctx: AgentContext, user: str, tree: str, blobs: list[str]) -> None:
    """Give `user` the tree, if they hold every blob of `blobs` (see
    gpuhop.agent.storage.claims: a tree may name only blobs its user has uploaded)."""
    unclaimed = await asyncio.to_thread(ctx.claims.unclaimed, user, "blob", blobs)
    if unclaimed:
        raise ApiError(
            409,
            ErrorCode.missing_blobs,
            f"{len(unclaimed)} blob(s) of this tree are not on the agent; upload them first",
            {"missing": unclaimed},
        )
    await asyncio.to_thread(ctx.claims.claim, user, "tree", [tree])
