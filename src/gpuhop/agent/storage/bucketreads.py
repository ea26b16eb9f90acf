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

    Returns the bytes' sha256 and size where they came in one stream from the first byte in
    this call, hashed as they came; else None (`Downloads.commit` hashes a continued
    download's file, and leaves a large object's for after its job starts).
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

    Returns None: the bytes are not hashed here (the cache hashes a large object after the
    job that waits for it has started: `ObjectCache`'s "Hashed later")."""

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

    try:
        with ThreadPoolExecutor(max_workers=PART_THREADS, thread_name_prefix="fetch-part") as pool:
            for future in [pool.submit(one, i) for i in range(count) if i not in done]:
                future.result()
        return None
    finally:
        os.close(fd)
