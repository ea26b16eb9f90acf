"""Runs on the user's machine: sending a scanned directory to the agent: the files it lacks,
in the framed upload stream (see `gpuhop.api.framing`), then the tree that lists them.

Files are read from disk in 1 MiB pieces, so memory stays flat whatever their size. A scan
that hashes much (a first upload) sends what it has hashed while it hashes the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from gpuhop.api.framing import FRAME_HEADER
from gpuhop.client.errors import GpuhopError
from gpuhop.client.session import Session
from gpuhop.client.sync.workdir import FileEntry, ScanResult, SyncError
from gpuhop.client.sync.workdir import scan as scan_tree
from gpuhop.client.transport.unixhttp import Timeout

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

CHUNK = 1 << 20
# Upload in batches so a dropped connection costs at most one batch.
UPLOAD_BATCH_BYTES = 64 * 1024 * 1024

Progress = Callable[[int], None]
UploadProgress = Callable[[int, int], None]


def scan(session: Session, root: Path, on_hash: Progress | None) -> ScanResult:
    """Scan `root` (see `gpuhop.client.sync.workdir`) with the session's hash cache. Once the files
    it hashed pass UPLOAD_BATCH_BYTES, those the agent lacks are sent while it hashes on
    (`result.uploaded`); a small edit is left to go with its tree, as before."""
    early = EarlySender(session)
    try:
        result = scan_tree(root, session.cache_dir, on_hash, early.hashed)
    except SyncError as e:
        early.abandon()
        raise GpuhopError(str(e), code="bad_request") from None
    except BaseException:
        early.abandon()
        raise
    result.uploaded = early.finish()
    return result


class EarlySender:
    """Files sent while a scan hashes the rest: the agent receives (and hashes, and writes)
    while this machine hashes, instead of after it. One batch at a time, in order, each
    once UPLOAD_BATCH_BYTES of files are hashed; the rest stay for the usual path, which
    sends only what the agent still lacks. Hashing waits while AHEAD batches wait to be
    sent, so the scan's progress is the upload's, and it ends soon after the hashing."""

    AHEAD = 2

    def __init__(self, session: Session, batch_bytes: int | None = None):
        self.session = session
        self.batch_bytes = batch_bytes or UPLOAD_BATCH_BYTES
        self._batch: list[FileEntry] = []
        self._size = 0
        self._lock = threading.Lock()
        self._room = threading.BoundedSemaphore(self.AHEAD)
        self._failed = False
        self._pool: ThreadPoolExecutor | None = None
        self._sends: list[Future[tuple[int, int]]] = []

    def hashed(self, entry: FileEntry) -> None:
        """One more file hashed (called from the scan's hashing threads)."""
        with self._lock:
            self._batch.append(entry)
            self._size += entry.size
            if self._size < self.batch_bytes or self._failed:
                return
            batch, self._batch, self._size = self._batch, [], 0
        self._room.acquire()
        with self._lock:
            if self._pool is None:
                # Only once a batch is hashed: concurrent.futures (with logging) stays out
                # of a `run` whose files the agent has.
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuhop-send")
            send = self._pool.submit(send_files, self.session, batch)
            self._sends.append(send)
        send.add_done_callback(self._sent)

    def _sent(self, send: Future[tuple[int, int]]) -> None:
        if send.cancelled() or send.exception() is not None:
            self._failed = True  # no more: the error is raised by `finish`
        self._room.release()

    def finish(self) -> tuple[int, int]:
        """(files, bytes) sent, once every batch is; the first batch's error is raised."""
        if self._pool is None:
            return 0, 0
        try:
            done = [send.result() for send in self._sends]
        finally:
            self.abandon()
        return sum(d[0] for d in done), sum(d[1] for d in done)

    def abandon(self) -> None:
        """Send no more; wait for the batch under way (its error, if any, is dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def send_files(
    session: Session, files: list[FileEntry], on_upload: UploadProgress | None = None
) -> tuple[int, int]:
    """Send the files the agent lacks. Returns (files sent, bytes sent)."""
    if not files:
        return 0, 0
    by_digest = {f.digest: f for f in files}
    check_body = {"digests": list(by_digest)}
    # `BlobCheckResult`, read as JSON: no pydantic on `run`'s path.
    missing = session.request("POST", "/v1/blobs/missing", json=check_body).json()["missing"]
    todo = [by_digest[d] for d in missing]
    total = sum(f.size for f in todo)
    sent = 0
    for batch in batches(todo, UPLOAD_BATCH_BYTES):

        def progress(n: int) -> None:
            nonlocal sent
            sent += n
            if on_upload is not None:
                on_upload(sent, total)

        try:
            session.request(
                "POST",
                "/v1/blobs/upload",
                content=frames(batch, progress),
                headers={"content-length": str(body_size(batch))},
                timeout=Timeout(600.0, connect=5.0),
            )
        except GpuhopError as e:
            raise changed_while_sent(e) from None
    return len(todo), total


def changed_while_sent(e: GpuhopError) -> GpuhopError:
    """The agent refused a file's bytes as not matching their hash: most often the file
    changed after it was hashed. Say so; any other error is returned as it is."""
    if e.code != "bad_blob":
        return e
    return GpuhopError(
        f"{e.message} (a file changed while it was being sent? run again)",
        code=e.code,
        status=e.status,
    )


def send_tree(
    session: Session,
    tree_bytes: bytes,
    files: list[FileEntry],
    on_upload: UploadProgress | None,
) -> tuple[int, int]:
    """Send a tree (see `spec.tree_of`) whose files the agent should have. Where it lacks
    some after all, send those and the tree again. Returns (files, bytes) sent for that."""
    headers = {"content-type": "application/json"}
    try:
        session.request("POST", "/v1/trees", content=tree_bytes, headers=headers)
    except GpuhopError as e:
        if e.code != "missing_blobs":
            raise
        # Files the agent was never asked about (the hash cache knew them from a sync to
        # another agent), or blobs collected since they were checked: once more.
        sent = send_files(session, files, on_upload)
        session.request("POST", "/v1/trees", content=tree_bytes, headers=headers)
        return sent
    return 0, 0


def frames(
    files: list[FileEntry], progress: Callable[[int], None] | None = None
) -> Iterator[bytes]:
    """The upload body, exactly `body_size(files)` bytes: a file's bytes as read (1 MiB at
    a time, not copied again), small files and the frame headers gathered into pieces of
    about 1 MiB, so a tree of many small files is not sent as thousands of tiny writes.
    A file that shrank since it was hashed is padded to its size with zeros: the agent
    refuses that blob for its digest (bad_blob), and the length stays as declared."""
    buf = bytearray()
    for f in files:
        buf += FRAME_HEADER.pack(bytes.fromhex(f.digest), f.size)
        remaining = f.size
        with open(f.abspath, "rb", buffering=0) as fh:
            while remaining > 0:
                data = fh.read(min(CHUNK, remaining)) or bytes(min(CHUNK, remaining))
                remaining -= len(data)
                if progress is not None:
                    progress(len(data))
                if len(data) >= CHUNK // 2:
                    if buf:
                        yield bytes(buf)
                        buf.clear()
                    yield data
                    continue
                buf += data
                if len(buf) >= CHUNK:
                    yield bytes(buf)
                    buf.clear()
    if buf:
        yield bytes(buf)


def body_size(files: list[FileEntry]) -> int:
    """The length of `frames(files)`: sent as Content-Length, so no chunked framing (and no
    copy of every piece to frame it) is needed."""
    return sum(FRAME_HEADER.size + f.size for f in files)


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
