"""Runs in the agent: what a bucket object *is* to the object cache (`ObjectId`), and its
download until the cache names it: partial objects, one download of each at a time, and the
batches in which whole ones are flushed to the disk and handed to the cache
(`gpuhop.agent.storage.objectcache`, which keeps what is named: blobs, views, the index).

**Partial objects.** A download goes to `objects/USER/partial/KEY-ID` (KEY: the digest of
endpoint, bucket and key), continued after an interruption (an agent killed, a server gone)
by ranged reads from where it stopped; large objects are read in parts, each noted in
`...parts` once its bytes are on the disk (flushed first: a note that outlived its part's
bytes in a power loss would have the part skipped, and zeros taken for it: see
`bucketreads._parts`). A partial object of the same key with another identity (the object
changed meanwhile) is dropped, and the object fetched whole. Only a whole object, of the
listed size, becomes a blob: no job ever sees part of one. One download at a time writes an
object's partial (`claim`): a second fetch of it for the same user (two jobs with the same or
overlapping data) waits for the first's, and takes the object from it, or, where that one
stopped or failed, goes on from its bytes.

**Flushed before named.** A whole object waits in its partial until a batch of them is
flushed to the disk together (`settle.flush_files`), then each is named (blob, `by-id`) and
the batch's rows written to the index in one transaction: after a power loss a named object
is whole, and one flush serves many small objects (a flush each cost a 10,000-object prefix
10,000 waits on the disk). An agent killed meanwhile leaves whole partials, which the next
fetch of them finds whole and commits without a read of the bucket.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from gpuhop.agent.storage import settle

log = logging.getLogger("gpuhop.agent")

# A large object is read in parts of this size, in parallel; each is kept once written.
PART = 8 << 20
# Committed objects are flushed to the disk, named, and their rows written to the index
# (one transaction) together, once this many wait or the oldest has waited this long, and
# when a fetch ends (`flush`): a flush of each object's file and a transaction for each row
# held a fetch of small objects to a few disk flushes per object.
FLUSH_ROWS = 256
FLUSH_SECONDS = 1.0
# An object larger than this that comes without its hash (read in parts) is named unhashed
# (`Whole.sha` is LATER) and hashed after its job has started (`ObjectCache`: "Hashed later").
LATER_BYTES = 16 << 20
LATER = ""


class _Identity(NamedTuple):
    endpoint: str
    bucket: str
    key: str
    etag: str
    size: int
    version: str = ""  # the VersionId where the bucket has versioning


class ObjectId(_Identity):
    """What makes two objects the same for the cache: where they are, their version as the
    store gives it (ETag, and VersionId in a versioned bucket), and their size. Its digests
    are made once each (a fetch names each object's files by them several times)."""

    def digest(self) -> str:
        made: str | None = self.__dict__.get("_digest")
        if made is None:
            made = self.__dict__["_digest"] = digest_of(list(self))
        return made

    def key_digest(self) -> str:
        """The digest of where the object is (not which version): its partial's prefix."""
        made: str | None = self.__dict__.get("_key_digest")
        if made is None:
            where = [self.endpoint, self.bucket, self.key]
            made = self.__dict__["_key_digest"] = digest_of(where)[:32]
        return made


class Listed(NamedTuple):
    """One object of a listing: its path in the job's view, and its identity."""

    path: str
    id: ObjectId


class Claim(NamedTuple):
    """Who downloads an object into its partial now: the caller (`mine`: it calls `release`
    when its download ends, however it ended), or another fetch, whose end sets `done`."""

    mine: bool
    done: threading.Event


class Whole(NamedTuple):
    """An object downloaded whole to its partial, waiting for the flush that names it."""

    user: str
    oid: ObjectId
    part: Path
    sha: str  # LATER: not hashed yet
    size: int


class Downloads:
    """The downloads into every user's cache: their partial objects (under `root`, a
    user's in `folder(user)`), who writes each (`claim`), and the batches of whole ones
    waiting to be named. `name(batch)` names a flushed batch (called under `lock`, the
    cache's); `has(user, oid)`: whether the cache holds `oid` named. Thread-safe."""

    def __init__(
        self,
        root: Path,
        lock: threading.RLock,
        folder: Callable[[str], Path],
        has: Callable[[str, ObjectId], bool],
        name: Callable[[Sequence[Whole]], None],
    ):
        self._root = root
        self._lock = lock
        self._folder = folder
        self._has = has
        self._name = name
        self._named = threading.Condition(lock)  # a batch of objects was flushed
        # Objects committed and not yet flushed (see FLUSH_ROWS): their partials are whole,
        # and neither named nor in the index until their batch is flushed.
        self._waiting: list[Whole] = []
        self._waiting_since = 0.0
        self._batches = 0  # batches taken to be flushed, so far
        self._flushing: set[int] = set()  # those being flushed (the lock let go meanwhile)
        # Partials that one download writes now (`claim`), and those committed whose batch
        # is not named yet: a second fetch of one waits, and neither is swept nor dropped.
        self._claims: dict[Path, threading.Event] = {}
        self._committed: set[Path] = set()

    def flush(self) -> None:
        """Flush and name the objects committed so far (see FLUSH_ROWS); returns once each
        object committed before the call is named, or was dropped (its bytes could not be
        flushed or named: the error is logged, and `lacking` still names it)."""
        self._flush_batch()
        with self._lock:
            last = self._batches
            while any(n <= last for n in self._flushing):
                self._named.wait()

    def _flush_batch(self) -> None:
        """Take the objects waiting, flush their bytes to the disk (the lock let go: commits
        go on meanwhile), then name them and write their rows."""
        with self._lock:
            batch, self._waiting = self._waiting, []
            if not batch:
                return
            self._batches += 1
            number = self._batches
            self._flushing.add(number)
        try:
            try:
                settle.flush_files([whole.part for whole in batch])
            except OSError as e:  # bytes that may not be on the disk are never named
                log.error("object cache: could not flush %d downloaded objects: %s", len(batch), e)
                for whole in batch:
                    drop_partial(whole.part, whole.oid)
                return
            with self._lock:
                self._name(batch)
        finally:
            with self._lock:
                self._committed.difference_update(whole.part for whole in batch)
                self._flushing.discard(number)
                self._named.notify_all()

    def partial(self, user: str, oid: ObjectId) -> Path:
        """Where `oid`'s download goes (and stays while incomplete). Partials of the same
        key with another identity (the object changed since) are dropped here, but for one
        that a download writes now (or that waits to be named)."""
        return self.partials(user, [oid])[oid][0]

    def partials(self, user: str, oids: Iterable[ObjectId]) -> dict[ObjectId, tuple[Path, int]]:
        """`partial` and `partial_bytes` of each of `oids`, from one look at the folder (a
        fetch of many small objects has no partial of most)."""
        folder = self._folder(user)
        here: dict[str, list[str]] = {}
        with os.scandir(folder) as entries:
            for entry in entries:
                here.setdefault(entry.name[:32], []).append(entry.name)
        busy = self._busy()
        found = {}
        for oid in oids:
            mine = f"{oid.key_digest()}-{oid.digest()}"
            names = here.get(oid.key_digest(), [])
            for name in names:
                if not name.startswith(mine) and folder / name.split(".")[0] not in busy:
                    (folder / name).unlink(missing_ok=True)
            part = folder / mine
            have = self.partial_bytes(part, oid) if mine in names else 0
            found[oid] = (part, have)
        return found

    @staticmethod
    def partial_bytes(part: Path, oid: ObjectId) -> int:
        """How many of `oid`'s bytes its partial holds already."""
        done = parts_done(part)
        if done is not None:
            return sum(min(PART, oid.size - i * PART) for i in done)
        try:
            return part.stat().st_size
        except OSError:
            return 0

    def commit(
        self,
        user: str,
        oid: ObjectId,
        part: Path,
        sha: str | None = None,
        size: int | None = None,
    ) -> None:
        """Take the whole object downloaded to `part` as `oid`'s: it is named (its bytes a
        blob, linked into `user`'s namespace) by the flush of its batch (see FLUSH_ROWS), by
        this call or a later one, or by `flush`. `sha` and `size`: the bytes' sha256 and
        count where the download hashed and counted them as they came from the first byte;
        else the file is read again here, or, past LATER_BYTES, after it is named.
        ValueError (and the partial dropped) where its size is not the listing's."""
        try:
            if size is None or sha is None:
                size = part.stat().st_size
            if size != oid.size:
                raise ValueError(
                    f"{oid.key}: {size} bytes came, the listing said {oid.size} (did it change"
                    " during the fetch?)"
                )
            if sha is None:
                sha = LATER if size > LATER_BYTES else file_sha256(part)
        except BaseException:
            drop_partial(part, oid)
            raise
        with self._lock:
            if part in self._committed:
                return  # committed already (the same partial: the same bytes)
            self._committed.add(part)
            now = time.monotonic()
            if not self._waiting:
                self._waiting_since = now
            self._waiting.append(Whole(user, oid, part, sha, size))
            due = len(self._waiting) >= FLUSH_ROWS or now - self._waiting_since >= FLUSH_SECONDS
        if due:
            self._flush_batch()

    def claim(self, user: str, oid: ObjectId) -> Claim | None:
        """Who downloads `oid` for `user`: None where nobody need (it is here, or committed
        and named at the next flush); else the caller, or another fetch under way."""
        part = self._part(user, oid)
        with self._lock:
            if part in self._committed or self._has(user, oid):
                return None
            held = self._claims.get(part)
            if held is not None:
                return Claim(False, held)
            done = self._claims[part] = threading.Event()
            return Claim(True, done)

    def release(self, user: str, oid: ObjectId) -> None:
        """The caller's download of `oid` (its `claim`) ended: committed, stopped or failed."""
        with self._lock:
            done = self._claims.pop(self._part(user, oid))
        done.set()

    def active(self) -> bool:
        """Whether a download writes now."""
        with self._lock:
            return bool(self._claims)

    def _part(self, user: str, oid: ObjectId) -> Path:
        return self._folder(user) / f"{oid.key_digest()}-{oid.digest()}"

    def _busy(self) -> set[Path]:
        """The partials a download writes now, or that wait to be named."""
        with self._lock:
            return {*self._claims, *self._committed}

    def sweep(self, untouched_since: float, dry_run: bool = False) -> list[int]:
        """Remove partial objects no download wrote to since `untouched_since` (of fetches
        never resumed); return the bytes of each."""
        freed = []
        busy = self._busy()
        for path in self._root.glob("*/partial/*"):
            if path.with_name(path.name.split(".")[0]) in busy:
                continue
            try:
                st = path.stat()
            except OSError:
                continue
            if st.st_mtime < untouched_since:
                freed.append(st.st_blocks * 512)
                if not dry_run:
                    path.unlink(missing_ok=True)
        return freed

    def bytes(self) -> int:
        """Bytes the partial objects take on the disk."""
        total = 0
        for path in self._root.glob("*/partial/*"):
            with contextlib.suppress(OSError):
                total += path.stat().st_blocks * 512 if path.suffix != ".parts" else 0
        return total


def parts_done(part: Path) -> set[int] | None:
    """The parts of a large object's partial written already (None: not read in parts)."""
    try:
        text = part.with_name(part.name + ".parts").read_text()
    except OSError:
        return None
    return {int(n) for n in text.split() if n.isdigit()}


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def drop_partial(part: Path, oid: ObjectId) -> None:
    """Remove a partial object, and the note of its parts where it has one."""
    part.unlink(missing_ok=True)
    if oid.size > PART:  # only an object read in parts has their note
        part.with_name(part.name + ".parts").unlink(missing_ok=True)


def digest_of(value: object) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=True).encode()).hexdigest()
