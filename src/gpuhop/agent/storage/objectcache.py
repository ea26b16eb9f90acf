"""Runs in the agent: the cache of bucket objects fetched for jobs (`--data s3://...`), under
`objects/` in the state dir: one namespace per user, the bytes kept once for all of them.

**Bytes.** A whole object's bytes are a blob of the content-addressed blob store (named by
their sha256), so two users who fetched the same bytes hold one copy on disk. A user reaches
them only through their own namespace, `objects/USER/by-id/ID` (ID: the digest of the
object's identity: endpoint, bucket, key, ETag, size, and its VersionId in a versioned
bucket), a hard link made when *their own* fetch wrote those bytes: each user's credentials
download each object version once (so the bucket says for itself what they may read), and
nothing tells them whether anyone else on this host holds the same bytes. What a download
saves across users is the disk, not the network: that is the blob store's rule too (a user
uploads what they have not shown they hold, even where the store has it).

**Views.** What a job sees of a prefix is a tree of hard links to its objects, named by the
digest of the listing it shows, in `objects/USER/views/`, bound read-only into the job as a
dataset's tree is. An unchanged listing finds its view and costs no download and no link.

**Hashed later.** A large object is named before its bytes are hashed, and joins the blob
of the same bytes afterwards (`objecthashes`); its row says LATER until then, and the cache
counts it on its own.

**Index and bounds.** `objects.db` (beside `objects/`) records, per user, each object's
blob, each view's objects, and each prefix (its source URL, its latest view, size, last use)
for `gpuhop data ls`. The whole cache is bounded (`object_cache_size`): before a fetch
downloads, the least recently used prefixes that no queued or running job needs (and no
fetch under way) go until the new bytes fit; `gpuhop gc` removes those unused for
`object_keep_days`. Every user's rows are theirs alone: answers show a user their own
prefixes only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from gpuhop.agent.storage.blobs import BlobStore
from gpuhop.agent.storage.objectdownloads import (
    LATER,
    Downloads,
    Listed,
    ObjectId,
    Whole,
    digest_of,
    drop_partial,
)
from gpuhop.agent.storage.objecthashes import LaterHashes, link_new, replace_with_link
from gpuhop.agent.storage.usage import format_bytes

log = logging.getLogger("gpuhop.agent")

# An object named unhashed counts on its own until it is hashed (see "Hashed later").
_BYTES_KEY = f"CASE sha256 WHEN '{LATER}' THEN user || ' ' || id ELSE sha256 END"

SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    user TEXT NOT NULL, id TEXT NOT NULL, sha256 TEXT NOT NULL, size INTEGER NOT NULL,
    PRIMARY KEY (user, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS objects_sha ON objects (sha256);
CREATE TABLE IF NOT EXISTS view_objects (
    user TEXT NOT NULL, view TEXT NOT NULL, id TEXT NOT NULL,
    PRIMARY KEY (user, view, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS view_objects_id ON view_objects (user, id);
CREATE TABLE IF NOT EXISTS prefixes (
    user TEXT NOT NULL, endpoint TEXT NOT NULL, url TEXT NOT NULL, view TEXT NOT NULL,
    objects INTEGER NOT NULL, bytes INTEGER NOT NULL, last_used REAL NOT NULL,
    PRIMARY KEY (user, endpoint, url)
) WITHOUT ROWID;
"""


class Prefix(NamedTuple):
    """A cached prefix, as `gpuhop data ls` shows it."""

    user: str
    endpoint: str
    url: str
    view: str
    objects: int
    bytes: int
    last_used: float


class Keep(NamedTuple):
    """What eviction must leave: the views and objects (by name: any user's of that name)
    that a queued or running job, or a fetch under way, needs."""

    views: set[str]
    objects: set[str]


class CacheFull(Exception):
    """The data cannot fit in `object_cache_size` beside what jobs need; says the figures."""


class ObjectCache:
    """The agent's object cache. Thread-safe: files change by renames of whole files or
    trees, and the index and eviction go under one lock."""

    def __init__(self, root: Path, index: Path, blobs: BlobStore):
        """The cache in `root`, its index the database `index` (outside `root`: what the
        storage quota counts is the objects)."""
        self.root = root
        self.blobs = blobs
        root.mkdir(mode=0o700, exist_ok=True)
        self._lock = threading.RLock()
        self._dirs: dict[str, Path] = {}  # users whose dirs exist, and where
        self.downloads = Downloads(
            root, self._lock, lambda user: self.user_dir(user) / "partial", self.has, self._name
        )
        self._db = sqlite3.connect(index, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)
        index.chmod(0o600)
        self.hashes = LaterHashes(self._lock, self._db, blobs, self.user_dir, self.downloads.active)
        self.hashes.queue(
            self._db.execute("SELECT user, id FROM objects WHERE sha256 = ?", (LATER,)).fetchall()
        )

    def close(self) -> None:
        self.downloads.flush()
        self.hashes.close()
        with self._lock:
            self._db.close()

    def hashed_all(self, timeout: float) -> bool:
        """Wait until every object named unhashed is hashed (or the cache closes); whether
        it came to that within `timeout` seconds."""
        return self.hashes.done(timeout)

    def _name(self, batch: Sequence[Whole]) -> None:
        """Name each object of `batch`, flushed: its bytes become a blob (or join the same
        bytes stored already), linked into its user's namespace; then the batch's rows in
        one transaction, then its partials go. Under the lock."""
        rows = []
        for whole in batch:
            by_id = self.path(whole.user, whole.oid)
            spare = self.user_dir(whole.user) / "tmp"
            try:
                os.chmod(whole.part, 0o444)
                if whole.sha == LATER:  # its name now, its blob later (`objecthashes`)
                    replace_with_link(whole.part, by_id, spare)
                    self.blobs.count_added(whole.size)
                else:
                    self.blobs.adopt(whole.sha)  # touched first: the blob store's gc leaves it
                    blob = self.blobs.path(whole.sha)
                    try:
                        link_new(whole.part, blob)
                        self.blobs.count_added(whole.size)
                    except FileExistsError:
                        pass  # the same bytes are here already
                    try:
                        os.link(blob, by_id)
                    except FileExistsError:  # an earlier copy's name: replaced
                        replace_with_link(blob, by_id, spare)
            except OSError as e:
                log.error("object cache: could not store %s: %s", whole.oid.key, e)
                continue
            rows.append((whole.user, whole.oid.digest(), whole.sha, whole.size))
        # The rows after the files: the index names an object only while its file is there.
        self._db.execute("BEGIN")
        self._db.executemany("INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?)", rows)
        self._db.execute("COMMIT")
        for whole in batch:
            drop_partial(whole.part, whole.oid)
        self.hashes.queue([(user, oid) for user, oid, sha, _ in rows if sha == LATER])

    # -- one user's files --------------------------------------------------------------------

    def user_dir(self, user: str) -> Path:
        path = self._dirs.get(user)
        if path is None:
            path = self.root / hashlib.sha256(user.encode()).hexdigest()[:32]
            for d in (path, path / "by-id", path / "views", path / "partial", path / "tmp"):
                d.mkdir(mode=0o700 if d == path else 0o755, exist_ok=True)
            self._dirs[user] = path
        return path

    def path(self, user: str, oid: ObjectId) -> Path:
        return self.user_dir(user) / "by-id" / oid.digest()

    def has(self, user: str, oid: ObjectId) -> bool:
        try:
            return self.path(user, oid).stat().st_size == oid.size
        except OSError:
            return False

    def lacking(self, user: str, ids: Iterable[str]) -> set[str]:
        """Those of the object ids (`ObjectId.digest`s) that `user`'s cache lacks (an
        object committed but not yet flushed too): one query of the index, which names an
        object only while its file is there (a flush links the file before the row,
        eviction drops the row before the file)."""
        wanted = list(dict.fromkeys(ids))
        with self._lock:
            rows = self._db.execute(
                "SELECT value FROM json_each(?) WHERE value NOT IN"
                " (SELECT id FROM objects WHERE user = ?)",
                (json.dumps(wanted), user),
            ).fetchall()
        return {row[0] for row in rows}

    # -- views -------------------------------------------------------------------------------

    @staticmethod
    def view_name(listing: Sequence[Listed]) -> str:
        """The name of the view that shows `listing`: the digest of its paths and identities."""
        return digest_of(sorted((e.path, list(e.id)) for e in listing))

    def view(self, user: str, name: str) -> Path | None:
        """`user`'s view named `name` (`view_name`), if it is here: then every object of
        its listing is too (its files are links to them, its rows in the index name them,
        written before the view was renamed into place)."""
        path = self.user_dir(user) / "views" / name
        return path if path.is_dir() else None

    def make_view(self, user: str, listing: Sequence[Listed], name: str) -> Path:
        """The view of `listing` (`name`: its `view_name`), made of `user`'s cached objects
        (each must be here) if it is not already; returns its path."""
        udir = self.user_dir(user)
        path = udir / "views" / name
        with self._lock:
            if path.is_dir():
                return path
            # Its rows first: a view on disk is always one the index names (see `view`).
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT OR IGNORE INTO view_objects VALUES (?, ?, ?)",
                [(user, name, e.id.digest()) for e in listing],
            )
            self._db.execute("COMMIT")
            building = udir / "tmp" / f"view-{secrets.token_hex(8)}"
            try:
                building.mkdir(mode=0o755)
                by_id, into = f"{udir}/by-id/", f"{building}/"  # (a Path each: slower)
                folders = {""}
                for entry in listing:
                    folder = entry.path.rpartition("/")[0]
                    if folder not in folders:
                        (building / folder).mkdir(mode=0o755, parents=True, exist_ok=True)
                        folders.add(folder)
                    os.link(by_id + entry.id.digest(), into + entry.path)
                os.rename(building, path)
            finally:
                if building.exists():
                    _remove(building)
        return path

    def used(
        self, user: str, url: str, endpoint: str, listing: Sequence[Listed], view: str
    ) -> None:
        """`user`'s prefix `url` was just listed as `listing` (its view, named `view`,
        made) for a job. Written without waiting for the disk (the next write that does
        takes it along): a row lost to a power cut says the prefix was used a little
        earlier, and costs nothing else, where the wait was a tenth of an unchanged
        prefix's re-fetch."""
        with self._lock:
            self._db.execute("PRAGMA synchronous=NORMAL")
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO prefixes VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        user,
                        endpoint,
                        url,
                        view,
                        len(listing),
                        sum(e.id.size for e in listing),
                        time.time(),
                    ),
                )
            finally:
                self._db.execute("PRAGMA synchronous=FULL")

    def prefixes(self, user: str | None = None) -> list[Prefix]:
        """The cached prefixes, most recently used first: `user`'s, or everyone's."""
        query = "SELECT * FROM prefixes"
        args: tuple[str, ...] = ()
        if user is not None:
            query, args = query + " WHERE user = ?", (user,)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY last_used DESC", args).fetchall()
        return [Prefix(*row) for row in rows]

    # -- size, eviction and collection -------------------------------------------------------

    def size(self) -> int:
        """Bytes the cache holds: each distinct blob once, and the partial objects."""
        with self._lock:
            (whole,) = self._db.execute(
                "SELECT COALESCE(SUM(size), 0) FROM"
                f" (SELECT MAX(size) AS size FROM objects GROUP BY {_BYTES_KEY})"
            ).fetchone()
        return int(whole) + self.downloads.bytes()

    def make_room(
        self, need: int, limit: int, keep: Keep, blob_users: Callable[[], set[str]]
    ) -> None:
        """Evict least recently used prefixes (not in `keep`) until `need` more bytes fit
        in `limit`; CacheFull where they cannot."""
        with self._lock:
            if self.size() + need <= limit:
                return
            held = self._held(keep)
            if held + need > limit:  # evicting all else would not do: evict nothing
                raise CacheFull(
                    f"its data needs {_bytes(need)} more and the agent's object cache"
                    f" (object_cache_size {_bytes(limit)}) holds {_bytes(held)} that queued"
                    " or running jobs need: raise object_cache_size in the agent's agent.toml"
                    + (", or run the job when those have ended" if held else "")
                )
            self._drop_unlisted(keep, blob_users, time.time())
            for prefix in reversed(self.prefixes()):
                if self.size() + need <= limit:
                    return
                if prefix.view not in keep.views:
                    self._drop_prefix(prefix)
                    self._drop_unlisted(keep, blob_users, time.time())

    def _held(self, keep: Keep) -> int:
        """Bytes of the distinct blobs that `keep` needs, and of the partial objects."""
        rows = self._db.execute(
            "SELECT o.user, o.id, o.sha256, o.size, v.view FROM objects o LEFT JOIN"
            " view_objects v ON v.user = o.user AND v.id = o.id"
        ).fetchall()
        needed = {
            sha or (user, oid): size
            for user, oid, sha, size, view in rows
            if oid in keep.objects or view in keep.views
        }
        return sum(needed.values()) + self.downloads.bytes()

    def collect(
        self,
        keep: Keep,
        unused_since: float,
        blob_users: Callable[[], set[str]],
        dry_run: bool = False,
    ) -> tuple[int, int]:
        """Remove the prefixes last used before `unused_since` that `keep` does not name,
        and what no prefix needs any more; return (prefixes, bytes) removed (or that would
        be, with `dry_run`)."""
        with self._lock:
            stale = [
                p
                for p in self.prefixes()
                if p.last_used < unused_since and p.view not in keep.views
            ]
            if dry_run:
                shas = self._shas_only_in(stale, keep)
                return len(stale), self._blob_bytes(shas, blob_users)
            before = self.size()
            for prefix in stale:
                self._drop_prefix(prefix)
            self._drop_unlisted(keep, blob_users, time.time())
            return len(stale), max(0, before - self.size())

    def shas(self) -> set[str]:
        """The blobs the cache holds (kept by the blob store's collection)."""
        with self._lock:
            return {
                row[0]
                for row in self._db.execute(
                    "SELECT DISTINCT sha256 FROM objects WHERE sha256 != ?", (LATER,)
                )
            }

    def _drop_prefix(self, prefix: Prefix) -> None:
        self._db.execute(
            "DELETE FROM prefixes WHERE user = ? AND endpoint = ? AND url = ?",
            (prefix.user, prefix.endpoint, prefix.url),
        )

    def _drop_unlisted(
        self, keep: Keep, blob_users: Callable[[], set[str]], untouched_since: float
    ) -> None:
        """Drop the views no prefix names (and `keep` does not), then the objects no view
        holds (nor `keep`), then the blobs of those that no one else holds."""
        db = self._db
        views = db.execute(
            "SELECT DISTINCT user, view FROM view_objects v WHERE NOT EXISTS"
            " (SELECT 1 FROM prefixes p WHERE p.user = v.user AND p.view = v.view)"
        ).fetchall()
        for user, view in views:
            if view in keep.views:
                continue
            udir = self.user_dir(user)
            # Renamed away whole first: a view on disk is always a whole one (see `view`).
            away = udir / "tmp" / f"gone-{secrets.token_hex(8)}"
            with contextlib.suppress(FileNotFoundError):
                os.rename(udir / "views" / view, away)
                _remove(away)
            db.execute("DELETE FROM view_objects WHERE user = ? AND view = ?", (user, view))
        loose = db.execute(
            "SELECT user, id, sha256 FROM objects o WHERE NOT EXISTS (SELECT 1 FROM"
            " view_objects v WHERE v.user = o.user AND v.id = o.id)"
        ).fetchall()
        gone: set[str] = set()
        for user, oid, sha in loose:
            if oid in keep.objects:
                continue
            # The row first: the index never names an object whose file is gone (`lacking`).
            db.execute("DELETE FROM objects WHERE user = ? AND id = ?", (user, oid))
            (self.user_dir(user) / "by-id" / oid).unlink(missing_ok=True)
            if sha != LATER:  # one not hashed yet is no blob
                gone.add(sha)
        if not gone:
            return
        held = self.shas()
        gone -= held
        if gone:
            others = blob_users()
            for sha in gone - others:
                self.blobs.remove(sha, untouched_since)

    def _shas_only_in(self, prefixes: Iterable[Prefix], keep: Keep) -> set[str | tuple[str, str]]:
        """The blobs that would go with `prefixes` (for a dry run), and the objects not
        hashed yet ((user, id) each)."""
        dropped = {(p.user, p.view) for p in prefixes}
        rows = self._db.execute(
            "SELECT v.user, v.view, o.id, o.sha256 FROM view_objects v JOIN objects o"
            " ON o.user = v.user AND o.id = v.id"
        ).fetchall()
        going: set[str | tuple[str, str]] = set()
        staying: set[str | tuple[str, str]] = set()
        for user, view, oid, sha in rows:
            key = sha if sha != LATER else (user, oid)
            if (user, view) in dropped and oid not in keep.objects:
                going.add(key)
            else:
                staying.add(key)
        return going - staying

    def _blob_bytes(
        self, shas: set[str | tuple[str, str]], blob_users: Callable[[], set[str]]
    ) -> int:
        total = 0
        for key in shas - (blob_users() if shas else set()):
            if isinstance(key, tuple):
                path = self.user_dir(key[0]) / "by-id" / key[1]
            else:
                path = self.blobs.path(key)
            with contextlib.suppress(OSError):
                total += path.stat().st_size
        return total


def _bytes(n: int) -> str:
    return format_bytes(n)


def _remove(tree: Path) -> None:
    shutil.rmtree(tree, ignore_errors=True)
