"""Runs in the agent: the object cache's large objects, hashed after their job starts
(`gpuhop.agent.storage.objectcache`, "Hashed later").

A large object read in parts (`objectdownloads.LATER_BYTES`) is named, in
its user's namespace, before its bytes are hashed: its job starts once the bytes are on the
disk, not after a second pass over them (sha256 and the copy out of the page cache took a
quarter of the agent's CPU in a fetch of large objects, as much again as the writes). A
thread of low priority hashes it afterwards, while no fetch downloads, and makes it a blob;
where another user's (or another key's) object holds the same bytes already, its links
(`by-id`, and each view's, view files first) are replaced with links to that blob, one
rename each, and the second copy goes once no job holds it open. Its row says LATER until
then (an agent stopped meanwhile hashes it when it starts again), and the cache counts it
on its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from gpuhop.agent.storage.blobs import BlobStore
from gpuhop.agent.storage.objectdownloads import LATER

log = logging.getLogger("gpuhop.agent")

HASH_CHUNK = 8 << 20
IDLE_CHECK_SECONDS = 0.5


class LaterHashes:
    """The objects named unhashed, hashed in turn by a thread of low priority while `busy()`
    (a fetch downloads) is false. Shares the cache's `lock` and index `db`; `user_dir(user)`
    is that user's folder in the cache."""

    def __init__(
        self,
        lock: threading.RLock,
        db: sqlite3.Connection,
        blobs: BlobStore,
        user_dir: Callable[[str], Path],
        busy: Callable[[], bool],
    ):
        self._lock = lock
        self._db = db
        self._blobs = blobs
        self._user_dir = user_dir
        self._busy = busy
        self._unhashed: deque[tuple[str, str]] = deque()
        self._hashing = threading.Condition(lock)
        self._hasher: threading.Thread | None = None
        self._closing = False

    def done(self, timeout: float) -> bool:
        """Wait until every object queued is hashed (or `close`); whether it came to that
        within `timeout` seconds."""
        with self._lock:
            return self._hashing.wait_for(lambda: not self._unhashed or self._closing, timeout)

    def close(self) -> None:
        """Stop hashing (within a chunk); what is left is hashed when the agent starts next."""
        with self._lock:
            self._closing = True
            self._hashing.notify_all()
            hasher = self._hasher
        if hasher is not None:
            hasher.join()

    def queue(self, objects: Sequence[tuple[str, str]]) -> None:
        """Queue `objects` ((user, id) each), named unhashed, for the hashing thread."""
        if not objects:
            return
        with self._lock:
            if self._closing:
                return
            self._unhashed.extend(objects)
            if self._hasher is None:
                self._hasher = threading.Thread(
                    target=self._hash_queued, name="object-hash", daemon=True
                )
                self._hasher.start()
            self._hashing.notify_all()

    def _hash_queued(self) -> None:
        with contextlib.suppress(OSError):  # this thread only: the job's and fetches' first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        while True:
            with self._lock:
                # Not while a fetch downloads (checked twice a second): its job waits for it.
                while not self._closing and (not self._unhashed or self._busy()):
                    self._hashing.wait(IDLE_CHECK_SECONDS if self._unhashed else None)
                if self._closing:
                    return
                user, oid = self._unhashed[0]
            try:
                self._hash_one(user, oid)
            except (OSError, sqlite3.Error) as e:  # hashed again when the agent starts next
                log.error("object cache: could not hash a fetched object: %s", e)
            with self._lock:
                self._unhashed.popleft()
                self._hashing.notify_all()

    def _hash_one(self, user: str, oid: str) -> None:
        """Hash `user`'s object `oid` (named unhashed) and make it a blob, or join the blob
        of the same bytes (see "Hashed later")."""
        by_id = self._user_dir(user) / "by-id" / oid
        sha = hashlib.sha256()
        try:
            with open(by_id, "rb") as f:
                inode = os.fstat(f.fileno()).st_ino
                while chunk := f.read(HASH_CHUNK):
                    if self._closing:
                        return
                    sha.update(chunk)
        except FileNotFoundError:
            return  # evicted meanwhile
        digest = sha.hexdigest()
        with self._lock:
            row = self._db.execute(
                "SELECT sha256 FROM objects WHERE user = ? AND id = ?", (user, oid)
            ).fetchone()
            if row is None or row[0] != LATER:
                return  # evicted, or fetched again (and queued again) meanwhile
            try:
                if by_id.stat().st_ino != inode:
                    return
            except FileNotFoundError:
                return
            self._blobs.adopt(digest)  # touched first: the blob store's collection leaves it
            blob = self._blobs.path(digest)
            try:
                link_new(by_id, blob)  # its bytes were counted as it was named
            except FileExistsError:  # the same bytes are here already: one copy kept
                if blob.stat().st_ino != inode:
                    self._relink(user, oid, inode, blob)
            self._db.execute(
                "UPDATE objects SET sha256 = ? WHERE user = ? AND id = ?", (digest, user, oid)
            )

    def _relink(self, user: str, oid: str, inode: int, blob: Path) -> None:
        """Point every name of `user`'s object `oid` (the file `inode`) at `blob`, the same
        bytes: each view's files first, its `by-id` last (so that an agent stopped half-way
        finds the object unhashed still, and goes on). Under the lock."""
        udir = self._user_dir(user)
        views = self._db.execute(
            "SELECT view FROM view_objects WHERE user = ? AND id = ?", (user, oid)
        ).fetchall()
        for (view,) in views:
            for path in _files_of(udir / "views" / view, inode):
                replace_with_link(blob, path, udir / "tmp")
        replace_with_link(blob, udir / "by-id" / oid, udir / "tmp")


def link_new(source: Path, target: Path) -> None:
    """Link `source` as `target`, its folder made where it is missing; FileExistsError
    where `target` is there."""
    try:
        os.link(source, target)
    except FileNotFoundError:
        target.parent.mkdir(exist_ok=True)
        os.link(source, target)


def replace_with_link(source: Path, target: Path, spare: Path) -> None:
    """Make `target` a link to `source` in one rename: a new link is made in the folder
    `spare` (on the same file system, and no folder a job sees), then renamed over it."""
    link = spare / f"link-{secrets.token_hex(8)}"
    os.link(source, link)
    try:
        os.replace(link, target)
    except BaseException:
        link.unlink(missing_ok=True)
        raise


def _files_of(tree: Path, inode: int) -> Iterator[Path]:
    """The files under `tree` that are the file `inode`."""
    try:
        entries = list(os.scandir(tree))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            yield from _files_of(Path(entry.path), inode)
        elif entry.stat(follow_symlinks=False).st_ino == inode:
            yield Path(entry.path)
