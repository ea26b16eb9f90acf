"""Runs on the user's machine: the framed upload stream (see `gpuhop.api.framing`).

Files are read from disk in 1 MiB pieces, so memory stays flat whatever their size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from gpuhop.api.framing import FRAME_HEADER
from gpuhop.client.sync import FileEntry

CHUNK = 1 << 20
# Upload in batches so a dropped connection costs at most one batch.
UPLOAD_BATCH_BYTES = 64 * 1024 * 1024


def frames(
    files: list[FileEntry], progress: Callable[[int], None] | None = None
) -> Iterator[bytes]:
    """The upload body, in pieces of about 1 MiB: small files share a piece, so a tree of
    many small files is not sent as thousands of tiny writes."""
    buf = bytearray()
    for f in files:
        buf += FRAME_HEADER.pack(bytes.fromhex(f.digest), f.size)
        remaining = f.size
        with open(f.abspath, "rb") as fh:
            while remaining > 0:
                data = fh.read(min(CHUNK, remaining))
                if not data:
                    break  # shrank since it was hashed: the agent will report the blob short
                remaining -= len(data)
                buf += data
                if progress is not None:
                    progress(len(data))
                if len(buf) >= CHUNK:
                    yield bytes(buf)
                    buf.clear()
    if buf:
        yield bytes(buf)


def batches(files: list[FileEntry], limit: int) -> Iterator[list[FileEntry]]:
    batch: list[FileEntry] = []
    size = 0
    for f in files:
        if batch and size + f.size > limit:
            yield batch
            batch, size = [], 0
        batch.append(f)
        size += f.size
    if batch:
        yield batch
