"""Runs in the agent: blobs made durable and named in the background, several at once; the
directories of a dataset version flushed to the disk before it is named; a batch of files
flushed together (`flush_files`: the object cache's downloads); and the helpers that flush a
file (`durable`) or hand its bytes to the disk early (`write_back`).

A blob is named only once its bytes are on disk (see `blobs`): after a power loss a stored
blob is whole or absent. Waiting for each fsync before receiving the next blob made an
upload as slow as one small synchronous write after another (a dataset is chunks of about
1 MiB). Here a written blob is handed to a few threads that fsync it and then rename it
into place (a dataset chunk is handed over before it is even hashed and written: see
`BlobStore.put_later`), while the upload goes on with the next ones; the disk sees
several flushes at once (which the filesystem's journal commits together), and the upload
answers only once every blob of it is named (`Pending.wait`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

SETTLERS = 4  # fsyncs in flight at once, over all uploads
IN_FLIGHT = 32  # blobs of one upload waiting to be named, at most (open files)
FLUSHERS = 8  # directories of a new dataset version flushed at once
SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h

_sync_file_range: Callable[[int, int, int, int], int] | None = None

_pool: ThreadPoolExecutor | None = None
_flushers: ThreadPoolExecutor | None = None  # flush_files'


def settle(work: Callable[[], int]) -> Future[int]:
    """Run `work` (fsync and rename one blob; returns the bytes stored) in the background."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=SETTLERS, thread_name_prefix="blob-settle")
    return _pool.submit(work)


def done(size: int) -> Future[int]:
    """A blob that needed no settling (stored already): `size` at once."""
    future: Future[int] = Future()
    future.set_result(size)
    return future


class Pending:
    """One upload's blobs on their way to disk, reported in the order they arrived."""

    def __init__(self, on_named: Callable[[str, int], None], limit: int = IN_FLIGHT):
        self.on_named = on_named  # (digest, bytes stored: 0 if it was there before)
        self.limit = limit
        self._queue: list[tuple[Future[int], str]] = []

    def add(self, future: Future[int], digest: str) -> None:
        self._queue.append((future, digest))
        if len(self._queue) > self.limit:
            self.wait(keep=self.limit // 2)

    def wait(self, keep: int = 0) -> None:
        """Until at most `keep` blobs are on their way; raises the first one's error."""
        while len(self._queue) > keep:
            future, digest = self._queue.pop(0)
            self.on_named(digest, future.result())

    def abandon(self) -> None:
        """After an error: wait for the blobs still settling (named or not), reporting those
        named, so that the caller may clean up after all of them."""
        while self._queue:
            future, digest = self._queue.pop(0)
            with contextlib.suppress(Exception):
                self.on_named(digest, future.result())


def flush_dirs(root: Path) -> None:
    """Flush every directory under `root` (its entries: names made, linked, renamed) to the
    disk, on FLUSHERS threads (the filesystem's journal commits flushes made at once
    together)."""
    dirs = [dirpath for dirpath, _dirs, _files in os.walk(root)]
    with ThreadPoolExecutor(FLUSHERS, "gpuhop-flush") as pool:
        for _ in pool.map(flush_dir, dirs):
            pass


def flush_files(paths: Sequence[Path]) -> None:
    """Flush the bytes of these files (written, not yet named) to the disk, on FLUSHERS
    threads: flushes made at once share the journal's commits. Only these files' bytes are
    waited for (fdatasync each), not the whole filesystem's (syncfs): on this machine 2,000
    small files flush in 0.2-0.3 s this way (1 ms each one after another, 0.08 s for one
    syncfs), and a syncfs would also wait for whatever else is written there, a job's
    checkpoints on the same disk. OSError where one cannot be flushed."""
    global _flushers
    if len(paths) == 1:
        _flush_file(paths[0])
        return
    if _flushers is None:  # kept: a fetch of many small objects flushes a batch a second
        _flushers = ThreadPoolExecutor(FLUSHERS, "gpuhop-flush-files")
    # A share of the files for each thread (not a task for each file: its future cost more
    # of the agent's CPU than its flush).
    shares = [paths[i::FLUSHERS] for i in range(min(FLUSHERS, len(paths)))]
    for _ in _flushers.map(_flush_share, shares):
        pass


def _flush_share(paths: Sequence[Path]) -> None:
    for path in paths:
        _flush_file(path)


def _flush_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def flush_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory's entries (names made, linked, renamed) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_back(fd: int, offset: int, size: int) -> None:
    """Start writing these bytes of a file to the disk, without waiting (sync_file_range's
    SYNC_FILE_RANGE_WRITE), so that the flush that names it later finds them there, or on
    their way: the disk works while the upload goes on. Advice: its errors change nothing."""
    global _sync_file_range
    if _sync_file_range is None:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
        function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        _sync_file_range = function
    _sync_file_range(fd, offset, size, SYNC_FILE_RANGE_WRITE)


def durable(f: BinaryIO) -> None:
    """Flush `f` to the disk (before it is renamed into place)."""
    f.flush()
    os.fsync(f.fileno())
