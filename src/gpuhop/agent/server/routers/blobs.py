"""Runs in the agent: /v1/blobs routes (which blobs are missing; framed uploads).

For a caller who is not an admin, a blob they have not uploaded themselves counts as
missing (see gpuhop.agent.storage.claims): knowing a digest is not holding the file. And
no answer tells whether someone stored a blob before: an upload answers what it received.
"""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, Request
from starlette.requests import ClientDisconnect

from gpuhop.agent.callers import caller_of
from gpuhop.agent.errors import ApiError
from gpuhop.agent.storage.blobs import BlobError, QuotaExceeded, no_room
from gpuhop.api import BlobCheck, BlobCheckResult, ErrorCode

router = APIRouter(prefix="/v1/blobs", tags=["blobs"])


@router.post("/missing")
def missing(req: BlobCheck, request: Request) -> BlobCheckResult:
    return missing_to(request, req.digests, request.app.state.ctx.blobs.missing(req.digests))


def missing_to(request: Request, digests: list[str], absent: list[str]) -> BlobCheckResult:
    """What the caller is to send of `digests`: those `absent`, and for a caller who is not
    an admin those they never sent themselves."""
    caller = caller_of(request)
    if caller.admin:
        return BlobCheckResult(missing=absent)
    gone = set(absent)
    present = [d for d in digests if d not in gone]
    unclaimed = set(request.app.state.ctx.claims.unclaimed(caller.user, "blob", present))
    return BlobCheckResult(missing=[d for d in digests if d in gone or d in unclaimed])


async def drain(request: Request) -> None:
    """Read and drop the rest of a body that is refused before its end, so that a client
    still sending reads the answer. A body that had all arrived already (a small one, or
    on a loaded host) has nothing left; a client that left needs no answer."""
    with contextlib.suppress(ClientDisconnect):
        try:
            async for _chunk in request.stream():
                pass
        except RuntimeError:
            pass  # Starlette: "Stream consumed", the whole body was read


async def refused_for_room(request: Request, received: list[str]) -> None:
    """An upload refused for room (507, a quota or a full disk): what it stored is gone
    already (see BlobStore.receive), and it claims nothing, not even what was stored before
    it (by another user: `missing` would tell that apart from what went). Then the rest of
    the body is read, so that the client, still sending, reads the 507."""
    received.clear()
    await drain(request)


@router.post("/upload")
async def upload(request: Request) -> dict[str, int]:
    """Store the framed blobs of the body; answer how many arrived, and their bytes, stored
    now or before alike."""
    ctx = request.app.state.ctx
    caller = caller_of(request)
    received: list[str] = []
    try:
        count, size = await ctx.blobs.receive(request.stream(), received.append)
    except BlobError as e:
        raise ApiError(400, ErrorCode.bad_blob, str(e)) from None
    except (QuotaExceeded, OSError) as e:
        if no_room(e):
            await refused_for_room(request, received)
        raise
    finally:
        # Blobs that arrived whole before an error count too: a retry sends only the rest.
        if not caller.admin:
            ctx.claims.claim(caller.user, "blob", received)
    return {"stored": count, "bytes": size}
