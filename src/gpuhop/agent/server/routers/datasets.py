"""Runs in the agent: /v1/datasets (versions of named trees), /v1/chunks (their uploads) and
/v1/envs (cached Python environments)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Query, Request

from gpuhop.agent.callers import caller_of
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError
from gpuhop.agent.server.routers.blobs import missing_to, refused_for_room
from gpuhop.agent.server.routers.trees import MAX_TREE_BYTES, receive
from gpuhop.agent.services import datasets as service
from gpuhop.agent.services import envs as envs_service
from gpuhop.agent.storage import chunks
from gpuhop.agent.storage.blobs import BlobError, QuotaExceeded, no_room
from gpuhop.api import BlobCheck, BlobCheckResult, ErrorCode
from gpuhop.api.data import CachedData, DatasetInfo, EnvInfo

router = APIRouter(tags=["datasets"])


def ctx(request: Request) -> AgentContext:
    return request.app.state.ctx


@router.post("/v1/chunks/missing")
def missing_chunks(req: BlobCheck, request: Request) -> BlobCheckResult:
    """Which of a push's chunks to send: those kept nowhere (not a blob, not staged, not in
    a version's file; see gpuhop.agent.storage.chunkstore), and those the caller has not
    sent before."""
    return missing_to(request, req.digests, ctx(request).datasets.chunks.missing(req.digests))


@router.post("/v1/chunks/upload")
async def upload_chunks(request: Request) -> dict[str, int]:
    """Keep the chunks of the body; answer how many arrived, their bytes and the bytes on
    the wire, kept now or before alike (see /v1/blobs/upload)."""
    caller = caller_of(request)
    verified: list[str] = []
    try:
        count, size, received = await chunks.receive(
            ctx(request).datasets.chunks, request.stream(), verified.append
        )
    except BlobError as e:
        raise ApiError(400, ErrorCode.bad_blob, str(e)) from None
    except (QuotaExceeded, OSError) as e:
        if no_room(e):
            await refused_for_room(request, verified)
        raise
    finally:
        # Chunks that arrived whole before an error count too (see gpuhop.agent.storage.claims).
        if not caller.admin:
            ctx(request).claims.claim(caller.user, "blob", verified)
    return {"stored": count, "bytes": size, "received": received}


# A manifest is parsed whole, and its version's record keeps every file: some hundreds of
# MB at the cap. One push at a time, so that many at once cost the agent no more than one;
# the others wait with their manifests on disk.
_ONE_PUSH = asyncio.Semaphore(1)
MANIFEST_TOO_LARGE = (
    "the dataset's manifest (the list of its files) is over {mib} MiB, the most the agent"
    " takes: push its directories as datasets of their own, or pack small files into larger"
    " ones (tar, TFRecord)"
)


@router.post("/v1/datasets/{name}", status_code=201)
async def push(name: str, request: Request, shared: bool = False) -> DatasetInfo:
    upload = ctx(request).trees.receive(MAX_TREE_BYTES, MANIFEST_TOO_LARGE)
    try:
        await receive(request, upload)
        async with _ONE_PUSH:
            raw = await asyncio.to_thread(upload.read)
            # Assembling the version copies its bytes: off the event loop.
            return await asyncio.to_thread(
                service.push, ctx(request), name, raw, caller_of(request), shared
            )
    finally:
        upload.close()


@router.get("/v1/datasets")
def list_datasets(request: Request) -> list[DatasetInfo]:
    return service.list_all(ctx(request), caller_of(request))


@router.get("/v1/cached-data")
def cached_data(request: Request) -> list[CachedData]:
    return service.cached(ctx(request), caller_of(request))


@router.get("/v1/datasets/{name}")
def versions(name: str, request: Request) -> list[DatasetInfo]:
    return service.versions(ctx(request), name, caller_of(request))


@router.get("/v1/datasets/{name}/files")
def files(
    name: str, request: Request, version: int | None = Query(default=None, ge=1)
) -> list[dict[str, object]]:
    return service.files(ctx(request), name, version, caller_of(request))


@router.put("/v1/datasets/{name}/readers/{user}")
def share(name: str, user: str, request: Request) -> DatasetInfo:
    """Share a dataset with `user` (`*`: every user of the agent): its owner or an admin."""
    return service.share(ctx(request), name, user, caller_of(request), shared=True)


@router.delete("/v1/datasets/{name}/readers/{user}")
def unshare(name: str, user: str, request: Request) -> DatasetInfo:
    return service.share(ctx(request), name, user, caller_of(request), shared=False)


@router.delete("/v1/datasets/{name}")
def remove(
    name: str, request: Request, version: int | None = Query(default=None, ge=1)
) -> dict[str, list[int]]:
    return {"removed": service.remove(ctx(request), name, version, caller_of(request))}


@router.get("/v1/envs")
def list_envs(request: Request) -> list[EnvInfo]:
    return envs_service.list_all(ctx(request), caller_of(request))


@router.delete("/v1/envs")
def remove_envs(
    request: Request,
    id: str | None = Query(default=None, max_length=64),
    unused: bool = False,
    older_than: float | None = Query(default=None, ge=0),
) -> dict[str, list[str]]:
    if not caller_of(request).admin:
        # A cache shared by every user of the agent: only an admin clears it.
        raise ApiError(403, ErrorCode.forbidden, "only an admin may remove cached environments")
    return {"removed": envs_service.remove(ctx(request), id, unused, older_than)}
