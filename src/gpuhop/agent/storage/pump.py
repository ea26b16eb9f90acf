"""Runs in the agent: an upload's body handed from the event loop to one worker thread.

The event loop only receives (and, on the TLS listener, decrypts); hashing, checking and
writing the bytes happen in a worker thread at the same time, on another core (hashlib and
file writes release the GIL). Pieces are handed over in batches of at least `BATCH` bytes,
so a thread hop costs little per byte, and at most `AHEAD` bytes wait beside the batch in
the worker: a slow disk slows the sender, it does not fill the agent's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

BATCH = 1 << 20
AHEAD = 8 << 20


async def pump(
    pieces: AsyncIterator[bytes],
    consume: Callable[[list[bytes]], None],
    batch: int = BATCH,
    ahead: int = AHEAD,
) -> None:
    """Call `consume` with every piece of `pieces`, in order, in batches, in one worker
    thread at a time. An error of `consume` stops the reading and is raised here; when the
    reading stops early (an error, a cancel), this returns only once `consume` is no longer
    running, so the caller may clean up after it."""
    pending: list[bytes] = []
    size = 0
    busy: asyncio.Future[None] | None = None

    async def settle() -> None:
        # Shielded: a cancel of the upload does not leave the worker writing unwatched.
        nonlocal busy
        if busy is not None:
            await asyncio.shield(busy)
            busy = None

    try:
        async for piece in pieces:
            pending.append(piece)
            size += len(piece)
            if busy is not None and busy.done():
                await settle()  # raises the worker's error, if it had one
            if size < batch or (busy is not None and size < ahead):
                continue
            await settle()
            busy = asyncio.ensure_future(asyncio.to_thread(consume, pending))
            pending, size = [], 0
        await settle()
        if pending:
            busy = asyncio.ensure_future(asyncio.to_thread(consume, pending))
            await settle()
    finally:
        if busy is not None:
            # Stopped early: let the worker finish its batch before anyone cleans up.
            with contextlib.suppress(BaseException):
                await asyncio.wait([busy])
            if busy.done() and not busy.cancelled():
                busy.exception()  # retrieved: the error that stopped us is the one raised
