"""Runs in the agent: the content-addressed blob store for synced files.

A blob is stored at `blobs/<first 2 hex>/<sha256>` only after its content was hashed and
matched its name, by an atomic rename from a temp file on the same filesystem, so a
half-written or wrong blob is never visible. Stored blobs are read-only (0444) and are only
ever copied out, never handed to a job directly.

Garbage collection (`gpuhop.agent.services.gc`) removes blobs through `remove`, under the same lock
that `has` takes: a blob that anyone asked about, uploaded or stored within the grace period
is never removed, so an upload in progress keeps its blobs until its tree arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import BinaryIO

from gpuhop.agent.storage import settle
from gpuhop.agent.storage.pump import pump
from gpuhop.api.framing import FRAME_HEADER
from gpuhop.api.models import SHA256_RE

FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
REFLINK_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL,
                       errno.EXDEV, errno.ENOSYS, errno.EPERM}  # fmt: skip


# A blob's bytes are handed to the disk as they arrive, this many at a time (see settle).
WRITE_BACK_EVERY = 8 * 1024 * 1024
# The disk (or the user's disk quota) is full.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# The blobs an upload stored new (not those stored before it): digest -> when, for `unstore`.
New = dict[str, float]


class BlobError(ValueError):
    """An upload that does not match what it claims to be."""


class QuotaExceeded(Exception):
    """Storing this would pass a disk quota; the message gives the figures."""


def no_room(e: BaseException) -> bool:
    """Whether `e` refuses an upload for room (a quota, or a full disk): a 507."""
    return isinstance(e, QuotaExceeded) or (isinstance(e, OSError) and e.errno in NO_SPACE)


class BlobStore:
    def __init__(self, root: Path, tmp: Path, max_blob_size: int = 1 << 40):
        self.root = root
        self.tmp = tmp
        self.max_blob_size = max_blob_size
        self._reflinks = True
        # Digests seen on disk, so each is checked once; `remove` discards them here too.
        self._present: set[str] = set()
        # When each digest was last asked about or stored (wall clock), for `remove`.
        self._touched: dict[str, float] = {}
        self._lock = threading.Lock()
        self._reserving = threading.Lock()
        # Called with a new blob's size before it is written; raises QuotaExceeded.
        self.check_quota: Callable[[int], None] = lambda size: None
        # Bytes stored since the last call of `take_added` (for the disk usage figures).
        self._added = 0
        # Bytes written but not yet named (see `settle`): counted against the quota too.
        self._settling = 0

    def path(self, digest: str) -> Path:
        if not SHA256_RE.match(digest):
            raise BlobError(f"{digest!r} is not a sha256 hex digest")
        return self.root / digest[:2] / digest

    def has(self, digest: str) -> bool:
        """Whether the blob is stored. Asking protects it from collection for a while."""
        path = self.path(digest)
        with self._lock:
            self._touched[digest] = time.time()
            if digest in self._present:
                return True
            if path.is_file():
                self._present.add(digest)
                return True
            return False

    def _stored(self, digest: str, size: int, new: New | None = None) -> None:
        with self._lock:
            self._touched[digest] = now = time.time()
            self._present.add(digest)
            self._added += size
            if size and new is not None:
                new[digest] = now

    def count_added(self, size: int) -> None:
        """Bytes written beside the blobs (an assembled dataset), for the usage figures."""
        with self._lock:
            self._added += size

    def take_added(self) -> int:
        """Bytes stored since the last call."""
        with self._lock:
            added, self._added = self._added, 0
            return added

    def digests(self) -> Iterator[str]:
        """Every stored blob's digest (a snapshot per directory; no order)."""
        if not self.root.is_dir():
            return
        for sub in self.root.iterdir():
            if len(sub.name) == 2 and sub.is_dir():
                for path in sub.iterdir():
                    if SHA256_RE.match(path.name):
                        yield path.name

    def remove(self, digest: str, untouched_since: float, dry_run: bool = False) -> int | None:
        """Remove a blob unless it was asked about or stored at or after `untouched_since`
        (or its file is that new). Returns the bytes freed (0 while other links to the file
        remain, as a dataset's), or None if it was kept."""
        path = self.path(digest)
        with self._lock:
            if self._touched.get(digest, 0.0) >= untouched_since:
                return None
            try:
                st = path.stat()
            except FileNotFoundError:
                self._present.discard(digest)
                return None
            if st.st_mtime >= untouched_since:
                return None
            if not dry_run:
                self._present.discard(digest)
                self._touched.pop(digest, None)
                path.unlink(missing_ok=True)
            return st.st_size if st.st_nlink == 1 else 0

    def unstore(self, stored: New) -> None:
        """Remove blobs stored at the times given, unless touched since."""
        with self._lock:
            for digest, when in stored.items():
                if self._touched.get(digest) != when:
                    continue  # asked about or sent again since: someone may need it
                self._present.discard(digest)
                self._touched.pop(digest, None)
                self.path(digest).unlink(missing_ok=True)

    def missing(self, digests: list[str]) -> list[str]:
        """The digests not stored. Asking protects each from collection for a while."""
        now = time.time()
        wanted = dict.fromkeys(digests)
        with self._lock:  # the digests seen before, at once: a large tree is mostly those
            seen = wanted.keys() & self._present
            self._touched.update(dict.fromkeys(seen, now))
        unseen = [d for d in wanted if d not in seen] if len(seen) < len(wanted) else []
        return [d for d in unseen if not self.has(d)]

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

    def put(self, digest: str, data: bytes | memoryview, new: New | None = None) -> int:
        """Store one blob held in memory (a dataset chunk) if it is new, durable and named
        before this returns; return the bytes stored (noted in `new`). Raises BlobError if
        `data` does not hash to `digest`. Checked against the quota and written even if
        stored already, as `receive` does: a 507 never tells whether it was."""
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise BlobError(f"blob {digest}: its content hashes to {actual}; it was rejected")
        with self.reserved(len(data)):
            fd, name = tempfile.mkstemp(dir=self.tmp, prefix="chunk-")
            f = os.fdopen(fd, "wb")
            try:
                f.write(data)
            except BaseException:
                f.close()
                os.unlink(name)
                raise
            return self._name(f, Path(name), digest, len(data), new)

    @contextlib.contextmanager
    def reserved(self, size: int) -> Iterator[None]:
        """`size` bytes on their way to the disk, until the block ends: checked against the
        quota with the others on their way, and counted (in one step: two never both pass)."""
        with self._reserving:
            self._check_quota(size)
            with self._lock:
                self._settling += size
        try:
            yield
        finally:
            with self._lock:
                self._settling -= size

    def adopt(self, digest: str) -> None:
        """A blob named by another store (a staged dataset chunk), its bytes counted there."""
        self._stored(digest, 0)

    def put_later(
        self, digest: str, data: bytes | memoryview, new: New | None = None
    ) -> Future[int]:
        """`put` in a settling thread (see `settle`): hashed, checked, written, flushed and
        named there, beside the caller and the other blobs on their way. The future holds
        the bytes stored, or the error (BlobError for bytes that do not hash to `digest`).
        `data` must not change until then."""
        return settle.settle(lambda: self.put(digest, data, new))

    def _check_quota(self, size: int) -> None:
        """`check_quota`, counting the blobs still on their way to disk as stored."""
        with self._lock:
            settling = self._settling
        self.check_quota(size + settling)

    def _settle(self, f: BinaryIO, tmp: Path, digest: str, size: int, new: New) -> Future[int]:
        with self._lock:
            self._settling += size

        def name() -> int:
            try:
                return self._name(f, tmp, digest, size, new)
            finally:
                with self._lock:
                    self._settling -= size

        return settle.settle(name)

    def _name(self, f: BinaryIO, tmp: Path, digest: str, size: int, new: New | None) -> int:
        """Flush a written blob to the disk, then name it (in a settling thread). On disk
        before it is named: after a power loss a stored blob is whole or absent (the store
        trusts a name once it exists)."""
        try:
            try:
                settle.durable(f)
            finally:
                f.close()
            dest = self.path(digest)
            if dest.exists():
                tmp.unlink(missing_ok=True)
                self._stored(digest, 0)  # sent again: protected again
                return 0
            dest.parent.mkdir(exist_ok=True)
            os.chmod(tmp, 0o444)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._stored(digest, size, new)
        return size

    async def receive(
        self, chunks: AsyncIterator[bytes], on_blob: Callable[[str], None] = lambda d: None
    ) -> tuple[int, int]:
        """Store every framed blob in an upload stream. Returns (blobs, bytes) received,
        stored now or before alike (an answer must not tell another user's files from new
        ones). `on_blob` hears the digest of every blob whose bytes matched it (from a worker
        thread: the hashing and writing happen there, see `pump`).

        Blobs completed before an error stay stored, so a retried upload sends only the rest;
        except after a refusal for room (`no_room`): the blobs this upload stored go at once
        (unless asked for since), so that the room is free now, as the 507 says, not after
        the GC's grace period. Raises BlobError on a bad frame or a content/hash mismatch.
        """
        frames = _Frames(self, on_blob)
        try:
            await pump(chunks, frames.feed)
            return await asyncio.to_thread(frames.end)  # waits for the last blobs' fsyncs
        except BaseException as e:
            await asyncio.to_thread(frames.abort, e)
            raise


class _Frames:
    """The blob frames of one upload, fed to it piece by piece (in one thread at a time)."""

    def __init__(self, store: BlobStore, on_blob: Callable[[str], None]):
        self.store = store
        self.on_blob = on_blob
        self.header = bytearray()  # a frame header split across network chunks
        self.writer: _BlobWriter | None = None
        self.received = self.total = 0  # blobs, their bytes
        self.new: New = {}
        self.pending = settle.Pending(lambda digest, _size: on_blob(digest))

    def feed(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            self._feed(memoryview(piece))

    def _feed(self, view: memoryview) -> None:
        # Through a view: a blob's bytes go to its file without being copied first.
        store = self.store
        pos = 0
        while pos < len(view) or (self.writer is not None and self.writer.remaining == 0):
            if self.writer is None:
                need = FRAME_HEADER.size - len(self.header)
                self.header += view[pos : pos + need]
                pos += need
                if len(self.header) < FRAME_HEADER.size:
                    return
                raw, size = FRAME_HEADER.unpack(self.header)
                self.header.clear()
                if size > store.max_blob_size:
                    raise BlobError(
                        f"blob {raw.hex()} is {size} bytes, over the limit of {store.max_blob_size}"
                    )
                store._check_quota(size)  # stored before or not (then dropped): alike
                self.writer = _BlobWriter(store, raw.hex(), size)
            writer = self.writer
            take = min(len(view) - pos, writer.remaining)
            writer.write(view[pos : pos + take])
            pos += take
            if writer.remaining == 0:
                self.writer = None
                self.pending.add(writer.finish(self.new), writer.digest)
                self.received += 1  # counted once checked: the answer comes once named
                self.total += writer.size

    def abort(self, e: BaseException) -> None:
        if self.writer is not None:
            self.writer.abort()  # a broken stream leaves no half-written blob behind
            self.writer = None
        self.pending.abandon()
        if no_room(e):
            self.store.unstore(self.new)

    def end(self) -> tuple[int, int]:
        self.pending.wait()
        if self.writer is not None:
            writer, self.writer = self.writer, None
            writer.abort()
            raise BlobError(
                f"upload ended inside blob {writer.digest}: {writer.remaining} bytes missing"
            )
        if self.header:
            raise BlobError("upload ended inside a frame header")
        return self.received, self.total


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
        self.started = 0  # bytes whose writing to the disk has been started

    def write(self, data: bytes | memoryview) -> None:
        self.hash.update(data)
        self.file.write(data)
        self.remaining -= len(data)
        written = self.size - self.remaining
        if written - self.started >= WRITE_BACK_EVERY or not self.remaining:
            self.file.flush()
            settle.write_back(self.file.fileno(), self.started, written - self.started)
            self.started = written

    def abort(self) -> None:
        self.file.close()
        self.tmp_path.unlink(missing_ok=True)

    def finish(self, new: New) -> Future[int]:
        """The blob checked, then made durable and named in the background (see `settle`):
        the bytes stored, 0 if it was stored already."""
        actual = self.hash.hexdigest()
        if actual != self.digest:
            self.abort()
            raise BlobError(
                f"blob {self.digest}: its content hashes to {actual}; the upload was rejected"
            )
        return self.store._settle(self.file, self.tmp_path, self.digest, self.size, new)
