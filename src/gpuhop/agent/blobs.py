"""Runs in the agent: the content-addressed blob store for synced files.

A blob is stored at `blobs/<first 2 hex>/<sha256>` only after its content was hashed and
matched its name, by an atomic rename from a temp file on the same filesystem, so a
half-written or wrong blob is never visible. Stored blobs are read-only (0444) and are only
ever copied out, never handed to a job directly.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from gpuhop.api.framing import FRAME_HEADER
from gpuhop.api.models import SHA256_RE

FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
REFLINK_UNSUPPORTED = {
    errno.EOPNOTSUPP,
    errno.ENOTTY,
    errno.EINVAL,
    errno.EXDEV,
    errno.ENOSYS,
    errno.EPERM,
}


class BlobError(ValueError):
    """An upload that does not match what it claims to be."""


class BlobStore:
    def __init__(self, root: Path, tmp: Path, max_blob_size: int = 1 << 40):
        self.root = root
        self.tmp = tmp
        self.max_blob_size = max_blob_size
        self._reflinks = True
        # Digests seen on disk: a blob, once stored, stays (whatever deletes blobs, such as
        # a garbage collector, must discard them here too), so each is checked once.
        self._present: set[str] = set()

    def path(self, digest: str) -> Path:
        if not SHA256_RE.match(digest):
            raise BlobError(f"{digest!r} is not a sha256 hex digest")
        return self.root / digest[:2] / digest

    def has(self, digest: str) -> bool:
        if digest in self._present:
            return True
        if self.path(digest).is_file():
            self._present.add(digest)
            return True
        return False

    def missing(self, digests: list[str]) -> list[str]:
        seen: set[str] = set()
        out = []
        for d in digests:
            if d not in seen and not self.has(d):
                out.append(d)
            seen.add(d)
        return out

    def copy_to(self, digest: str, dest: Path, executable: bool = False) -> None:
        """Copy a blob out to `dest` as a new, writable file (the blob stays untouched).

        A reflink where the filesystem has them (btrfs, XFS): a copy that shares the
        blob's blocks until either side writes, made in constant time. A plain copy
        elsewhere (ext4, tmpfs), remembered after the first refusal.
        """
        src = self.path(digest)
        if self._reflinks:
            with open(src, "rb") as s, open(dest, "wb") as d:
                try:
                    fcntl.ioctl(d.fileno(), FICLONE, s.fileno())
                except OSError as e:
                    if e.errno not in REFLINK_UNSUPPORTED:
                        raise
                    self._reflinks = False
                    shutil.copyfileobj(s, d, 1 << 20)
        else:
            shutil.copyfile(src, dest)
        os.chmod(dest, 0o755 if executable else 0o644)

    def put(self, digest: str, data: bytes) -> int:
        """Store one blob held in memory (a dataset chunk) if it is new; return the bytes
        stored. Raises BlobError if `data` does not hash to `digest`."""
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise BlobError(f"blob {digest}: its content hashes to {actual}; it was rejected")
        if self.has(digest):
            return 0
        fd, name = tempfile.mkstemp(dir=self.tmp, prefix="chunk-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(name, 0o444)
        dest = self.path(digest)
        dest.parent.mkdir(exist_ok=True)
        os.replace(name, dest)
        self._present.add(digest)
        return len(data)

    async def receive(
        self, chunks: AsyncIterator[bytes], on_blob: Callable[[str], None] = lambda d: None
    ) -> tuple[int, int]:
        """Store every framed blob in an upload stream. Returns (blobs stored, bytes).
        `on_blob` hears the digest of every blob whose bytes matched it, stored now or before.

        Blobs completed before an error stay stored, so a retried upload sends only the rest.
        Raises BlobError on a bad frame or a content/hash mismatch.
        """
        header = bytearray()  # a frame header split across network chunks
        stored = 0
        total = 0
        writer: _BlobWriter | None = None
        try:
            async for chunk in chunks:
                # Through a view: a blob's bytes go to its file without being copied first.
                view = memoryview(chunk)
                pos = 0
                while pos < len(view) or (writer is not None and writer.remaining == 0):
                    if writer is None:
                        need = FRAME_HEADER.size - len(header)
                        header += view[pos : pos + need]
                        pos += need
                        if len(header) < FRAME_HEADER.size:
                            break
                        raw, size = FRAME_HEADER.unpack(header)
                        header.clear()
                        if size > self.max_blob_size:
                            raise BlobError(
                                f"blob {raw.hex()} is {size} bytes, over the limit of"
                                f" {self.max_blob_size}"
                            )
                        writer = _BlobWriter(self, raw.hex(), size)
                    take = min(len(view) - pos, writer.remaining)
                    writer.write(view[pos : pos + take])
                    pos += take
                    if writer.remaining == 0:
                        total += writer.finish()
                        stored += 1
                        on_blob(writer.digest)
                        writer = None
        except BaseException:
            if writer is not None:
                writer.abort()  # a broken stream leaves no half-written blob behind
            raise
        if writer is not None:
            writer.abort()
            raise BlobError(
                f"upload ended inside blob {writer.digest}: {writer.remaining} bytes missing"
            )
        if header:
            raise BlobError("upload ended inside a frame header")
        return stored, total


class _BlobWriter:
    def __init__(self, store: BlobStore, digest: str, size: int):
        self.store = store
        self.digest = digest
        self.remaining = size
        self.size = size
        self.hash = hashlib.sha256()
        fd, name = tempfile.mkstemp(dir=store.tmp, prefix="upload-")
        self.tmp_path = Path(name)
        self.file = os.fdopen(fd, "wb")

    def write(self, data: bytes | memoryview) -> None:
        self.hash.update(data)
        self.file.write(data)
        self.remaining -= len(data)

    def abort(self) -> None:
        self.file.close()
        self.tmp_path.unlink(missing_ok=True)

    def finish(self) -> int:
        self.file.close()
        actual = self.hash.hexdigest()
        if actual != self.digest:
            self.tmp_path.unlink(missing_ok=True)
            raise BlobError(
                f"blob {self.digest}: its content hashes to {actual}; the upload was rejected"
            )
        dest = self.store.path(self.digest)
        if dest.exists():
            self.tmp_path.unlink(missing_ok=True)
            return 0
        dest.parent.mkdir(exist_ok=True)
        os.chmod(self.tmp_path, 0o444)
        os.replace(self.tmp_path, dest)
        self.store._present.add(self.digest)
        return self.size
