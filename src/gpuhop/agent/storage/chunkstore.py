"""Runs in the agent: where the bytes of each dataset chunk are kept, once.

A chunk that is a whole file arrives as a blob (flushed to the disk and named in the blob
store before it counts as stored), and the version's file is a hard link to it. The chunks
of a file of several (flagged PART on the wire, see `gpuhop.api.data`) are *staged*
instead: each checked against its digest and written, one after another as the upload
sends them, into a *run*, `blobs/.staged/BOOT/run-ID`, without being flushed (the run's
`.idx` lists the chunks written whole). When the version is made (`datasets`), a file whose
chunks all arrived as one run *is* that run: flushed and moved into place, its bytes never
copied. Other files are their chunks copied into place (from runs, blobs, or older
versions) and flushed. From then on a version's file of several chunks is where they are
kept: each is *located* (digest -> file, offset, size; the version's record keeps the
chunk sizes of such files). So a dataset's bytes are written to the disk once and kept
once; before, every chunk was a blob of its own, flushed on arrival, beside the version's
copy of it: a first push wrote each byte twice and a dataset took twice its size.

A run's bytes are handed to the disk as they are written, and once there, dropped from the
page cache (a read later reads the disk). A push of a dataset is a stream, not a working
set: it leaves the page cache to what jobs are reading now, and on a VM that gives page
cache memory back to its host, it does not pay for fresh memory every GB (a second 2 GB push
took the agent 6.8 CPU-seconds instead of 4.1; with the pages dropped, 4.0 each).

Runs are kept apart from the blobs because they are not on the disk until a version takes
them: the blob store trusts a name once it exists, and after a power loss a run may be cut
short. So at the agent's start the runs of another boot of the host are removed, and those
of this boot (an agent restarted: its files are whole) are kept: a push goes on where it
stopped. Garbage collection removes runs that no one sent to or asked about within its
grace period (`sweep`). Located chunks go with the last version that holds them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from pathlib import Path

from gpuhop.agent.storage import settle
from gpuhop.agent.storage.blobs import BlobError, BlobStore
from gpuhop.agent.storage.checkouts import this_boot
from gpuhop.agent.storage.trees import MissingBlobs
from gpuhop.api.models import SHA256_RE

# A run's bytes this far behind the chunk being written are dropped from the page cache.
DROP_BEHIND = 16 * 1024 * 1024

# Every version's tree and its files, as kept in its record (with "sizes" where located).
Layouts = Callable[[], Iterator[tuple[Path, list[dict]]]]
# Where a chunk's bytes are: (file, offset, size; None: the whole file), and whether staged.
Source = tuple[Path, int, int | None, bool]


class Run:
    """The chunks of one file as one upload sent them, one after another in a file."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None  # open while its upload writes to it
        self.index_fd: int | None = None  # its index, as long
        self.size = 0  # bytes given out to chunks (by the upload's reading thread)
        self.dropped = 0  # bytes before this are out of the page cache
        self.chunks: dict[int, tuple[str, int]] = {}  # offset -> (digest, size), whole
        self.touched = time.time()

    @property
    def index(self) -> Path:
        return self.path.with_name(self.path.name + ".idx")


class ChunkStore:
    def __init__(self, blobs: BlobStore, layouts: Layouts):
        self.blobs = blobs
        self.layouts = layouts
        self.root = blobs.root / ".staged" / (this_boot() or "boot")
        self._lock = threading.Lock()
        self._staged: dict[str, tuple[Run, int, int]] = {}  # digest -> run, offset, size
        self._runs: dict[Path, Run] = {}
        self._located: dict[str, tuple[str, int, int]] | None = None  # built when needed
        self._forget_other_boots()

    def _forget_other_boots(self) -> None:
        """At the agent's start: remove the runs of other boots, take up this boot's."""
        self.root.mkdir(parents=True, exist_ok=True)
        for other in self.root.parent.iterdir():
            if other != self.root:
                shutil.rmtree(other, ignore_errors=True)
        for path in self.root.iterdir():
            if path.name.startswith("run-") and not path.name.endswith(".idx"):
                self._take_up(path)
        for path in self.root.iterdir():  # an index without its run, an interrupted write
            if not (path in self._runs or path.with_suffix("") in self._runs):
                path.unlink(missing_ok=True)

    def _take_up(self, path: Path) -> None:
        run = Run(path)
        try:
            size = path.stat().st_size
            lines = run.index.read_text().splitlines()
        except OSError:
            return
        for line in lines:
            digest, offset, length = [*line.split(), "", "", ""][:3]
            if not (SHA256_RE.match(digest) and offset.isdigit() and length.isdigit()):
                continue  # a line cut short
            if int(offset) + int(length) <= size:
                self._register(run, digest, int(offset), int(length))
        if run.chunks:
            run.size = size
            self._runs[path] = run

    # -- finding ----------------------------------------------------------------------------

    def missing(self, digests: list[str]) -> list[str]:
        """The chunks kept nowhere: neither a blob, nor staged, nor in a version's file.
        Asking protects each from collection for a while."""
        now = time.time()
        with self._lock:  # in memory: those of files of several chunks, most of a dataset
            located = self._locator()
            rest = []
            for digest in digests:
                if digest in self._staged:
                    self._staged[digest][0].touched = now
                elif digest not in located:
                    rest.append(digest)
        return self.blobs.missing(rest) if rest else rest

    def held(self) -> set[str]:
        """Every chunk kept here (staged or located), not counting blobs."""
        with self._lock:
            return self._staged.keys() | self._locator().keys()

    def linkable(self, digest: str) -> bool:
        """Whether the chunk is, or can be made, a blob of its own (a file's hard link)."""
        with self._lock:
            staged = digest in self._staged
        return staged or self.blobs.has(digest)

    def source(self, digest: str) -> Source:
        """Where to read a chunk's bytes from. Raises MissingBlobs."""
        if self.blobs.has(digest):
            return self.blobs.path(digest), 0, None, False
        with self._lock:
            if digest in self._staged:
                run, offset, size = self._staged[digest]
                run.touched = time.time()
                return run.path, offset, size, True
            found = self._locator().get(digest)
        if found is None:
            raise MissingBlobs([digest])
        return Path(found[0]), found[1], found[2], False

    def _locator(self) -> dict[str, tuple[str, int, int]]:
        """Every located chunk (with the lock held): read from the versions' records once."""
        if self._located is None:
            located: dict[str, tuple[str, int, int]] = {}
            for tree, files in self.layouts():
                for f in files:
                    _locate(located, tree, f)
            self._located = located
        return self._located

    # -- staging ----------------------------------------------------------------------------

    def open_run(self) -> Run:
        """A new run, for the chunks an upload sends of one file."""
        run = Run(self.root / f"run-{uuid.uuid4().hex}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        run.fd = os.open(run.path, flags, 0o644)
        try:
            run.index_fd = os.open(run.index, flags | os.O_APPEND, 0o644)
        except BaseException:
            os.close(run.fd)
            run.path.unlink()
            raise
        with self._lock:
            self._runs[run.path] = run
        return run

    def close_run(self, run: Run) -> None:
        """Its upload ended: no more chunks come (those written whole stay)."""
        if run.fd is not None:
            os.close(run.fd)
            run.fd = None
        if run.index_fd is not None:
            os.close(run.index_fd)
            run.index_fd = None
        if not run.chunks:
            self.discard(run)

    def stage(self, run: Run, offset: int, digest: str, data: bytes | memoryview) -> int:
        """Write a chunk at `offset` of its run (given out by `Run.size`); return the bytes
        stored new. Raises BlobError if `data` does not hash to `digest` (checked in any
        case: the bytes prove that the sender holds them)."""
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise BlobError(f"chunk {digest}: its content hashes to {actual}; it was rejected")
        size = len(data)
        if run.fd is None or run.index_fd is None:
            raise BlobError(f"chunk {digest}: its upload has ended")  # cannot happen
        with self.blobs.reserved(size):
            view, at = memoryview(data), offset
            while view:
                written = os.pwrite(run.fd, view, at)
                view, at = view[written:], at + written
            self.blobs.count_added(size)
        settle.write_back(run.fd, offset, size)  # a run is mostly on the disk when taken
        # What was written a while before is on the disk now: out of the page cache with it
        # (see the module's docstring). Advice, as is the write-back; races change nothing.
        behind = offset - DROP_BEHIND
        if behind > run.dropped:
            os.posix_fadvise(run.fd, run.dropped, behind - run.dropped, os.POSIX_FADV_DONTNEED)
            run.dropped = behind
        os.write(run.index_fd, f"{digest} {offset} {size}\n".encode())  # appended whole
        with self._lock:
            self._register(run, digest, offset, size)
        return size

    def stage_later(
        self, run: Run, offset: int, digest: str, data: bytes | memoryview
    ) -> Future[int]:
        """`stage` on a settling thread, beside the caller; `data` must not change until
        the future is done."""
        return settle.settle(lambda: self.stage(run, offset, digest, data))

    def _register(self, run: Run, digest: str, offset: int, size: int) -> None:
        run.chunks[offset] = (digest, size)
        run.touched = time.time()
        self._staged.setdefault(digest, (run, offset, size))

    # -- making versions --------------------------------------------------------------------

    def whole_run(self, chunks: list[str], size: int) -> Run | None:
        """The run that holds exactly this file (these chunks, in order, and nothing else),
        if one does and its upload has ended."""
        with self._lock:
            first = self._staged.get(chunks[0]) if chunks else None
            if first is None or first[1] != 0:
                return None
            run, offset = first[0], 0
            if run.fd is not None or run.size != size or len(run.chunks) != len(chunks):
                return None
            for digest in chunks:
                held = run.chunks.get(offset)
                if held is None or held[0] != digest:
                    return None
                offset += held[1]
            return run if offset == size else None

    def take(self, run: Run) -> Path:
        """A run taken out of staging (its file, for the caller to flush and move into a
        version: from now on its chunks are there, or, if that fails, sent again)."""
        with self._lock:
            self._unregister(run)
            self._runs.pop(run.path, None)
        run.index.unlink(missing_ok=True)
        return run.path

    def settle(self, digest: str) -> Path:
        """The chunk as a blob of its own (copied out of its run and flushed first if it was
        staged); its path, for a hard link."""
        dest = self.blobs.path(digest)
        if self.blobs.has(digest):
            return dest
        path, offset, size, _staged = self.source(digest)
        fd, name = tempfile.mkstemp(dir=self.blobs.tmp, prefix="chunk-")
        try:
            with open(path, "rb") as src:
                data = os.pread(src.fileno(), size or 0, offset)
            os.write(fd, data)
            os.fsync(fd)
            os.close(fd)
            os.chmod(name, 0o444)
            dest.parent.mkdir(exist_ok=True)
            os.replace(name, dest)
        except BaseException:
            os.unlink(name)
            raise
        self.blobs.adopt(digest)
        return dest

    def add_version(self, tree: Path, files: list[dict], staged: Iterable[str]) -> None:
        """A version was named: its files' chunks are located there now, and the `staged`
        ones copied into them leave their runs (a run left with none goes)."""
        with self._lock:
            if self._located is not None:
                for f in files:
                    _locate(self._located, tree, f)
            emptied = []
            for digest in staged:
                held = self._staged.pop(digest, None)
                if held is not None:
                    held[0].chunks.pop(held[1], None)
                    if not held[0].chunks and held[0].fd is None:
                        emptied.append(held[0])
            for run in emptied:
                self._forget(run)

    def forget_versions(self) -> None:
        """Versions were removed: where chunks are is read again when next needed."""
        with self._lock:
            self._located = None

    def sweep(self, untouched_since: float, dry_run: bool = False) -> list[int]:
        """Remove the runs no one sent to or asked about since `untouched_since` (of pushes
        never finished); return the bytes of each."""
        freed = []
        with self._lock:
            for run in list(self._runs.values()):
                if run.fd is not None or run.touched >= untouched_since:
                    continue
                try:
                    freed.append(run.path.stat().st_size)
                except OSError:
                    freed.append(0)
                if not dry_run:
                    self._forget(run)
        return freed

    def discard(self, run: Run) -> None:
        """Remove a closed run and what it holds."""
        with self._lock:
            self._forget(run)

    def _forget(self, run: Run) -> None:
        """Remove a run and its chunks from staging (with the lock held)."""
        self._unregister(run)
        self._runs.pop(run.path, None)
        run.path.unlink(missing_ok=True)
        run.index.unlink(missing_ok=True)

    def _unregister(self, run: Run) -> None:
        for offset, (digest, _size) in run.chunks.items():
            if self._staged.get(digest, (None, -1))[:2] == (run, offset):
                del self._staged[digest]


def _locate(located: dict[str, tuple[str, int, int]], tree: Path, f: dict) -> None:
    sizes = f.get("sizes")
    if not isinstance(sizes, list) or len(sizes) != len(f["chunks"]):
        return  # a file linked to its one blob, or made before chunks were located
    path = str(tree / f["path"])
    offset = 0
    for digest, size in zip(f["chunks"], sizes, strict=True):
        located.setdefault(digest, (path, offset, size))
        offset += size
