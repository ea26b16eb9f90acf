"""Runs in the agent: reads one bucket object into its partial file in the user's object
cache (`objectdownloads`), through obstore, with a `Reader` of `buckets` (the user's own
credentials): a small object in one piece, a larger one in one stream continued where an
earlier read stopped, a large one in ranged parts read in parallel, each noted once on the
disk. Errors come back as `buckets.BucketError`, in the bucket's own words.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from gpuhop.agent.storage import settle
from gpuhop.agent.storage.buckets import PART_THREADS, BucketError, Reader, translated
from gpuhop.agent.storage.objectdownloads import PART, ObjectId, parts_done

# Objects up to this size are read in one GET; larger ones in ranged parts (objectdownloads.PART
# bytes each), PART_THREADS at once.
ONE_GET_BYTES = 16 << 20
CHUNK = 1 << 20


class Came(NamedTuple):
    """An object's bytes that came in one stream from its first byte: their sha256 (hashed
    as they came) and how many."""

    sha: str
    size: int


def download(
    reader: Reader, oid: ObjectId, part: Path, progress: Callable[[int], None]
) -> Came | None:
    """Fetch the object `oid` names into its partial file `part`, continuing where an
    earlier download stopped; call `progress` with each number of bytes that came. Every
    read names the listed version (If-Match on the ETag, and the VersionId where there is
    one), so a changed object fails (PreconditionFailed) rather than mixing two versions.
    Up to ONE_GET_BYTES in one stream (continued by a ranged GET from the partial's size);
    larger ones in parts of PART bytes read in parallel, each noted once on the disk (see
    `_parts`).

    Returns the bytes' sha256 and size where they came from the first byte in this call:
    hashed as they came, or for parts as each lands in order (`ObjectCache.commit` reads the
    file again otherwise: a download continued from an earlier one's bytes).
    An object of one CHUNK at most with no partial yet is read in one piece (`_small`). A
    whole object is not flushed here: the cache flushes a batch of objects together before
    it names them."""
    with translated():
        store = reader.store(oid.bucket)
        if oid.size <= ONE_GET_BYTES:
            return _stream(store, oid, part, progress)
        return _parts(store, oid, part, progress)


def _get(store: Any, oid: ObjectId, first: int, last: int | None) -> Iterator[bytes]:
    """The object's bytes `first` to `last` (inclusive; None: to its end), in chunks of
    CHUNK bytes or more (the last may be less)."""
    import obstore

    options = _options(oid)
    if last is not None:
        options["range"] = (first, last + 1)
    elif first:
        options["range"] = {"offset": first}
    got = obstore.get(store, oid.key, options=options)  # type: ignore[arg-type]
    return iter(_listed(got, oid).stream(min_chunk_size=CHUNK))


def _get_whole(store: Any, oid: ObjectId) -> Any:
    """The whole object's bytes in one piece (a buffer)."""
    import obstore

    got = obstore.get(store, oid.key, options=_options(oid))  # type: ignore[arg-type]
    return _listed(got, oid).bytes()


def _listed(got: Any, oid: ObjectId) -> Any:
    """`got`, once its answer names the ETag listed. The read asks for that ETag (If-Match),
    which the bucket's server heeds; but obstore follows a redirect to any host, where the
    answer may be another server's: the cloud's metadata service (the GPU host's own
    credentials), or anything the host's network reaches, which a user's own server could
    send the agent to. An answer without the listed ETag is no part of the object."""
    tag = str(got.meta.get("e_tag") or "").removeprefix("W/").strip('"')
    if tag != oid.etag.strip('"'):
        raise BucketError(
            f"the server's answer for {oid.key} is not the object it listed (not its ETag):"
            " refused, as an answer from another server (a redirect) would be"
        )
    return got


def _options(oid: ObjectId) -> dict[str, Any]:
    """A read's options that name the listed version (see `download`)."""
    options: dict[str, Any] = {"if_match": f'"{oid.etag}"'}
    if oid.version:
        options["version"] = oid.version
    return options


def _stream(store: Any, oid: ObjectId, part: Path, progress: Callable[[int], None]) -> Came | None:
    if oid.size <= CHUNK:
        try:
            return _small(store, oid, part, progress)
        except FileExistsError:  # an earlier download's bytes: gone on from below
            pass
    try:
        have = part.stat().st_size
    except FileNotFoundError:
        have = 0
    if have > oid.size:
        part.unlink()
        have = 0
    if have == oid.size:
        return None
    body = _get(store, oid, have, None)
    sha = hashlib.sha256() if have == 0 else None
    size = 0
    try:
        with open(part, "ab") as out:
            for chunk in body:
                out.write(chunk)
                size += len(chunk)
                if sha is not None:
                    sha.update(chunk)
                progress(len(chunk))
    finally:
        del body  # its connection goes back to the pool, or is dropped if cut short
    return None if sha is None else Came(sha.hexdigest(), size)


def _small(store: Any, oid: ObjectId, part: Path, progress: Callable[[int], None]) -> Came:
    """A small object (one CHUNK at most) with no partial yet: its partial made (it is not
    there: FileExistsError otherwise), and the bytes read in one piece, written in one call
    and hashed at once; no look at the file before or after. Most of a prefix of many small
    objects comes this way, and the agent's CPU for each is what bounds its rate."""
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    written = 0
    try:
        data = memoryview(_get_whole(store, oid))
        while written < len(data):
            written += os.write(fd, data[written:])
    except BaseException:
        if not written:  # no partial left of a read that failed before its bytes
            part.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    progress(len(data))
    return Came(hashlib.sha256(data).hexdigest(), len(data))


class _InOrder:
    """The sha256 of an object read in parts, hashed from the first part on as the parts
    land, out of order, beside the reads (one thread, the page cache's copy of each part in
    CHUNKs) rather than in one pass over the whole file after the last: a large object's
    commit then waits for the hash of its last parts only."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size
        self.sha = hashlib.sha256()
        self.hashed = 0  # bytes hashed: parts 0 .. hashed // PART - 1, all of them
        self.landed: set[int] = set()
        self.changed = threading.Condition()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="fetch-hash", daemon=True)
        self.thread.start()

    def land(self, index: int) -> None:
        with self.changed:
            self.landed.add(index)
            self.changed.notify()

    def stop(self) -> None:
        with self.changed:
            self.stopped = True
            self.changed.notify()
        self.thread.join()

    def came(self) -> Came | None:
        """The whole object's hash, once the parts not hashed yet are (all have landed);
        None where the file could not be read to its end (the commit reads it again, and
        says what is wrong)."""
        self.thread.join()
        return Came(self.sha.hexdigest(), self.size) if self.hashed == self.size else None

    def _run(self) -> None:
        try:
            while self.hashed < self.size:
                with self.changed:
                    while not self.stopped and self.hashed // PART not in self.landed:
                        self.changed.wait()
                    if self.stopped:
                        return
                end = min(self.size, self.hashed + PART)
                while self.hashed < end:
                    chunk = os.pread(self.fd, min(CHUNK, end - self.hashed), self.hashed)
                    if not chunk:
                        return  # cut short under us
                    self.sha.update(chunk)
                    self.hashed += len(chunk)
        except OSError:
            return  # not readable: `came` gives None


def _parts(store: Any, oid: ObjectId, part: Path, progress: Callable[[int], None]) -> Came | None:
    """Download the parts of `oid` not yet noted in `<partial>.parts`, PART_THREADS at once, each
    written at its place in the partial file (made of the object's size at once: the parts
    not written are holes, zeros).

    The order, for each part: its bytes written (each chunk handed to the disk as it comes,
    `settle.write_back`), then the partial file flushed (`os.fdatasync`: the part's bytes,
    and the blocks that hold them, are on the disk once it returns), and only then the
    part's index appended to the note. A resumed download skips every part the note names
    and `ObjectCache.commit` hashes what the file holds, so a note that reached the disk
    before its part's bytes (a power loss, a host crash) would have a job read zeros in
    place of that part, under the hash of those wrong bytes, with no error. The note itself
    is not flushed: one lost in a crash costs that part's download again, nothing more.
    A partial is never in a job's view whatever it holds: only `ObjectCache.commit` names
    it, once it is whole, and the cache flushes it again before that.

    A download from the first part (no note) hashes the parts as they land (`_InOrder`) and
    returns their sha256; one continued from an earlier download's parts returns None."""

    log = part.with_name(part.name + ".parts")
    done = parts_done(part)
    if done is None or not part.exists():
        done = set()
        log.write_text("")
    with open(part, "ab") as f:
        f.truncate(oid.size)
    count = (oid.size + PART - 1) // PART
    lock = threading.Lock()
    fd = os.open(part, os.O_RDWR)
    hasher = None if done else _InOrder(fd, oid.size)

    def one(index: int) -> None:
        first = index * PART
        last = min(oid.size, first + PART) - 1
        body = _get(store, oid, first, last)
        offset = first
        try:
            for chunk in body:
                if offset + len(chunk) > last + 1:
                    raise BucketError(f"{oid.key}: more bytes came than the range asked")
                os.pwrite(fd, chunk, offset)
                settle.write_back(fd, offset, len(chunk))  # on its way while the rest comes
                offset += len(chunk)
                progress(len(chunk))
        finally:
            del body
        if offset != last + 1:
            raise BucketError(f"{oid.key}: part {index} ended early ({offset - first} bytes)")
        os.fdatasync(fd)  # the bytes on the disk before the note says they are (above)
        with lock, open(log, "a") as noted:
            noted.write(f"{index}\n")
        if hasher is not None:
            hasher.land(index)

    try:
        with ThreadPoolExecutor(max_workers=PART_THREADS, thread_name_prefix="fetch-part") as pool:
            for future in [pool.submit(one, i) for i in range(count) if i not in done]:
                future.result()
        return None if hasher is None else hasher.came()
    finally:
        if hasher is not None:
            hasher.stop()
        os.close(fd)
