"""Runs in the agent: receives dataset chunks (see `gpuhop.api.data` for the framing).

Each chunk is decoded (zlib, bounded by its declared size, so a small upload cannot
inflate into a large one), then checked against its sha256 and kept, on the settling
threads (`settle`): the reading thread only frames and hands over, so hashing and writing
run on every core. A chunk that is a whole file is stored in the blob store (by atomic
rename); the chunks of a file of several (flagged PART) are written one after another into
a run, staged until their version is made (see `chunkstore`). Chunks completed before an
error stay kept: a retried push sends only the rest; but not those of an upload refused for
room (507): its runs and the blobs it stored go at once, so that the room is free again now.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Callable

from gpuhop.agent.storage import settle
from gpuhop.agent.storage.blobs import BlobError, New, no_room
from gpuhop.agent.storage.chunkstore import ChunkStore, Run
from gpuhop.agent.storage.pump import pump
from gpuhop.api.data import CHUNK_HEADER, CONT, MAX_CHUNK_SIZE, PART

RAW, ZLIB = 0, 1


def decode(
    encoding: int, payload: bytes | memoryview, size: int, digest: str
) -> bytes | memoryview:
    data: bytes | memoryview
    encoding &= ~(PART | CONT)
    if encoding == RAW:
        data = payload
    elif encoding == ZLIB:
        inflater = zlib.decompressobj()
        try:
            data = inflater.decompress(payload, size + 1)
        except zlib.error as e:
            raise BlobError(f"chunk {digest}: bad zlib data ({e})") from None
        if not inflater.eof or inflater.unused_data:
            raise BlobError(f"chunk {digest}: its zlib data does not end where it says")
    else:
        raise BlobError(f"chunk {digest}: unknown encoding {encoding}")
    if len(data) != size:
        raise BlobError(f"chunk {digest}: {len(data)} bytes, but its header says {size}")
    return data


async def receive(
    store: ChunkStore,
    stream: AsyncIterator[bytes],
    on_chunk: Callable[[str], None] = lambda digest: None,
) -> tuple[int, int, int]:
    """Store every chunk of an upload. Returns (chunks, their bytes, bytes on the wire)
    received, each checked against its digest and now kept, whether it was kept before or
    not: the caller's answer must not tell another user's files from new ones. `on_chunk`
    hears the digest of every chunk whose bytes matched it, new or not (from a worker
    thread: decoding, hashing and storing happen there, see `pump`)."""
    chunks = _Chunks(store, on_chunk)
    try:
        await pump(stream, chunks.feed)
        await asyncio.to_thread(chunks.end)  # the last chunks, hashed and written
    except BaseException as e:
        await asyncio.to_thread(chunks.abandon, no_room(e))
        raise
    if chunks.buf:
        raise BlobError("the upload ended inside a chunk")
    return chunks.count, chunks.bytes, chunks.received


class _Chunks:
    """The chunks of one upload, fed to it piece by piece (in one thread at a time)."""

    def __init__(self, store: ChunkStore, on_chunk: Callable[[str], None]):
        self.store = store
        self.buf = bytearray()  # bytes of chunks not yet whole
        self.count = self.bytes = self.received = 0  # chunks, their bytes, wire bytes
        self.pending = settle.Pending(lambda digest, _size: on_chunk(digest))
        self.run: Run | None = None  # the run the chunks of the file being sent go to
        self.runs: list[Run] = []
        self.new: New = {}  # blobs this upload stored (see BlobStore.unstore)

    def end(self) -> None:
        self.pending.wait()
        self._close_runs()

    def abandon(self, discard: bool = False) -> None:
        """After an error: the chunks still on their way written (or not), then the runs
        closed (in this thread, after the last write to them), or with `discard` removed,
        with the blobs this upload stored."""
        self.pending.abandon()
        runs = list(self.runs)
        self._close_runs()
        if discard:
            for run in runs:
                self.store.discard(run)
            self.store.blobs.unstore(self.new)

    def _close_runs(self) -> None:
        for run in self.runs:
            self.store.close_run(run)
        self.runs.clear()

    def feed(self, pieces: list[bytes]) -> None:
        buf = self.buf
        for piece in pieces:
            self.received += len(piece)
            buf += piece
        pos = 0
        while len(buf) - pos >= CHUNK_HEADER.size:
            raw, size, wire, encoding = CHUNK_HEADER.unpack_from(buf, pos)
            digest = raw.hex()
            if size > MAX_CHUNK_SIZE or wire > MAX_CHUNK_SIZE:
                raise BlobError(f"chunk {digest} is over the limit of {MAX_CHUNK_SIZE} bytes")
            end = pos + CHUNK_HEADER.size + wire
            if len(buf) < end:
                break
            # A view of the batch's buffer, hashed and written where it lies (no copy) by a
            # settling thread: the buffer is never changed again (the bytes left over go on
            # in a new one), so it lives, unchanged, until the last chunk in it is stored.
            data = decode(encoding, memoryview(buf)[pos + CHUNK_HEADER.size : end], size, digest)
            self.count += 1  # the answer comes once each is checked and kept
            self.bytes += size
            # Checked even when the chunk is stored already: the bytes prove that the
            # sender holds them (see gpuhop.agent.storage.claims). A client sends a
            # stored chunk only when asked to.
            if encoding & PART:  # a chunk of a file of several: into its run
                if self.run is None or not encoding & CONT:
                    self.run = self.store.open_run()
                    self.runs.append(self.run)
                offset, self.run.size = self.run.size, self.run.size + size
                self.pending.add(self.store.stage_later(self.run, offset, digest, data), digest)
            else:
                self.run = None
                self.pending.add(self.store.blobs.put_later(digest, data, self.new), digest)
            pos = end
        self.buf = buf[pos:] if pos else buf  # at most one chunk's bytes
