"""Runs on the user's machine: what the last scan of a work dir learned (see
`gpuhop.client.sync.workdir`), kept under the cache dir: each file's hash keyed on its size, mtime,
ctime and inode, each directory's filtered listing, and the digest of the tree it made.

A file changed in the two seconds before a scan (git's "racily clean" problem) is recorded
with a key no stat matches: the next scan hashes it again, and still knows it was there.
So the record lists exactly the files of the tree it names, and the next scan tells what
changed since that tree from what it hashed and what is gone (`gpuhop.client.sync.trees` sends
that as the tree's delta).
"""

from __future__ import annotations

import hashlib
import marshal
import os
import threading
from pathlib import Path
from typing import Any

RACY_WINDOW_NS = 2_000_000_000
CACHE_VERSION = 2
# A file's key: size, mtime_ns, ctime_ns, inode; then its digest.
Hashed = tuple[int, int, int, int, str]
# A directory's listing: mtime_ns, inode, ignore-rules key, [(name, kind)].
Listings = dict[str, tuple[int, int, str, list[tuple[str, int]]]]


class HashCache:
    """What the last scan learned, stored with marshal:

    - `entries`: relpath -> (size, mtime_ns, ctime_ns, inode, digest) for each file;
    - `listings`: dir relpath -> (mtime_ns, inode, ignore-rules key, [(name, kind)]), the
      directory's entries that survived the ignore rules. A directory whose mtime and rules
      are unchanged has the same entries, so it is not listed or matched again;
    - `tree`: the digest of the tree of exactly those files (None if not known).
    """

    def __init__(self, path: Path | None):
        self.path = path
        self.entries: dict[str, Hashed] = {}
        self.listings: Listings = {}
        self.tree: str | None = None
        self.dirty = False
        if path is not None:
            try:
                self._load(path)
            except (OSError, ValueError, EOFError, TypeError, KeyError):
                self.entries, self.listings, self.tree = {}, {}, None

    def _load(self, path: Path) -> None:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            version = (st.st_ino, st.st_size, st.st_mtime_ns)
            known = _read.get(path)
            if known is not None and known[0] == version:
                data = known[1]
            else:
                data = marshal.loads(f.read())
                if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
                    return
                _keep(path, version, data)
        # Copies: this scan changes them, and the file may yet stay as it is.
        self.entries = dict(data["entries"])
        self.listings = dict(data["listings"])
        tree = data.get("tree")
        self.tree = tree if isinstance(tree, str) else None

    @staticmethod
    def key(st: os.stat_result) -> tuple[int, int, int, int]:
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    def lookup(self, rel: str, st: os.stat_result) -> str | None:
        hit = self.entries.get(rel)
        if hit is not None and hit[:4] == self.key(st):
            return hit[4]
        return None

    def remember(self, rel: str, st: os.stat_result, digest: str, scan_ns: int) -> None:
        if scan_ns - max(st.st_mtime_ns, st.st_ctime_ns) < RACY_WINDOW_NS:
            self.entries[rel] = (st.st_size, -1, -1, -1, digest)  # hashed again next time
        else:
            self.entries[rel] = (*self.key(st), digest)
        self.dirty = True

    def replace_listings(self, listings: Listings) -> None:
        if listings != self.listings:
            self.listings = listings
            self.dirty = True

    def prune(self, keep: set[str]) -> list[str]:
        """Forget the files not in `keep`; returns their paths."""
        stale = list(self.entries.keys() - keep)
        for rel in stale:
            del self.entries[rel]
        self.dirty = self.dirty or bool(stale)
        return stale

    def name_tree(self, digest: str) -> None:
        if digest != self.tree:
            self.tree = digest
            self.dirty = True

    def save(self) -> None:
        if self.path is None or not self.dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Named per thread too: two submits of one work dir from one process save at once.
        tmp = self.path.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")
        data = {
            "version": CACHE_VERSION,
            "entries": self.entries,
            "listings": self.listings,
            "tree": self.tree,
        }
        with open(tmp, "wb") as f:
            f.write(marshal.dumps(data))
            st = os.fstat(f.fileno())
        os.replace(tmp, self.path)
        _keep(self.path, (st.st_ino, st.st_size, st.st_mtime_ns), data)
        self.dirty = False


# The caches this process read or wrote last, by path, with the file's inode, size and
# mtime then: a process that scans a work dir again (the SDK's `submit`) reads its cache
# again only if another process wrote it since.
# (A stale one costs only hashing: each file's hash still needs its stat to match.)
_read: dict[Path, tuple[tuple[int, int, int], dict[str, Any]]] = {}
_read_lock = threading.Lock()
_KEPT = 4


def _keep(path: Path, version: tuple[int, int, int], data: dict[str, Any]) -> None:
    with _read_lock:
        _read.pop(path, None)
        _read[path] = (version, data)
        while len(_read) > _KEPT:
            del _read[next(iter(_read))]


def cache_path_for(cache_dir: Path, root: Path) -> Path:
    key = hashlib.sha256(os.fsencode(root.resolve())).hexdigest()[:24]
    return cache_dir / "hashes" / f"{key}.marshal"
