"""Runs on the user's machine: turns a work dir into a manifest of content-addressed files.

The walk honours `.gitignore` and `.gpuhopignore` at every level (git's rules: the deepest
file that has an opinion wins; an ignored directory is not entered). Hashes are cached per
work dir, keyed on size, mtime, ctime and inode, so re-scanning an unchanged tree costs a
stat per file. Files modified in the two seconds before a scan are not cached (git's
"racily clean" problem): their next scan hashes them again.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from gpuhop.api.trees import tree_bytes
from gpuhop.client.errors import SyncError as SyncError
from gpuhop.client.sync.hashcache import (  # the cache's version and window, named here too
    CACHE_VERSION as CACHE_VERSION,
)
from gpuhop.client.sync.hashcache import (
    RACY_WINDOW_NS,
    HashCache,
    Listings,
    cache_path_for,
)
from gpuhop.client.sync.ignores import IgnoreRules

_FORMAT, _REGULAR = stat.S_IFMT(0o177777), stat.S_IFREG
# Kinds of kept directory entries in a cached listing.
FILE, DIR, LINKED_DIR = 0, 1, 2


class FileEntry(NamedTuple):
    """One file of a work dir (a tuple: a scan makes one per file, 5,000 on every sync)."""

    path: str  # relative, POSIX
    abspath: str
    size: int
    digest: str
    executable: bool


class Since(NamedTuple):
    """A scan's tree as a delta from the last scan's: that tree (None if unknown), the
    paths it had that this one has not, the files new or changed since (so the ones an
    agent may lack), and of those, the ones whose content the last scan did not have at
    their path."""

    previous: str | None
    removed: list[str]
    changed: list[FileEntry]
    new: list[FileEntry]


class ScanResult:
    """What a scan found (a plain class: no `dataclasses`, hence no `inspect`, on `run`)."""

    __slots__ = (
        "changed",
        "digest",
        "files",
        "hashed",
        "new",
        "previous",
        "removed",
        "seconds",
        "tree",
        "uploaded",
        "warnings",
    )

    def __init__(
        self,
        files: list[FileEntry],
        hashed: int,
        seconds: float,
        warnings: list[str] | None = None,
        tree: bytes = b"",
        digest: str = "",
        since: Since | None = None,
    ) -> None:
        self.files = files
        self.hashed = hashed  # files whose hash was not in the cache
        self.seconds = seconds
        self.warnings = [] if warnings is None else warnings
        # The tree of `files` (see `gpuhop.api.Tree`): its bytes and digest.
        self.tree = tree
        self.digest = digest
        self.previous, self.removed, self.changed, self.new = since or Since(None, [], [], [])
        # (files, bytes) sent to the agent while the scan hashed (see `upload.scan`).
        self.uploaded = (0, 0)

    def __repr__(self) -> str:
        return f"ScanResult({len(self.files)} files, hashed={self.hashed}, seconds={self.seconds})"

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def hash_file(path: str | os.PathLike[str]) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def walk(
    root: Path,
    warnings: list[str],
    cached: Listings | None = None,
    fresh: Listings | None = None,
    scan_ns: int = 0,
) -> Iterator[tuple[str, str, list[tuple[str, os.stat_result]]]]:
    """Yield (relpath prefix, path, [(name, stat)]) for each directory with the files in it
    to send (in no particular order).

    With `cached` listings from an earlier scan, a directory whose mtime, inode and ignore
    rules are unchanged is not listed again; `fresh` receives the listings worth keeping.
    """
    root = root.resolve()
    # Each directory carries its real path and its ancestors' real paths: a link back into
    # one of them is a loop. A link to any other directory in the tree is sent as a copy.
    stack: list[tuple[Path, str, IgnoreRules, Path, frozenset[Path]]] = [
        (root, "", IgnoreRules.root(root), root, frozenset({root}))
    ]
    while stack:
        directory, prefix, rules, real, ancestors = stack.pop()
        try:
            # Files are looked up from the directory's descriptor: a stat of a name, not of
            # a path the kernel walks from the root each time.
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:
            raise SyncError(f"cannot read directory {directory}: {e.strerror}") from None
        try:
            dst = os.fstat(fd)
            hit = cached.get(prefix) if cached else None
            if hit is not None and hit[:3] == (dst.st_mtime_ns, dst.st_ino, rules.key):
                kept = hit[3]
            else:
                kept = _list_dir(directory, prefix, rules, root, warnings)
                hit = (dst.st_mtime_ns, dst.st_ino, rules.key, kept)
            racy = scan_ns - max(dst.st_mtime_ns, dst.st_ctime_ns) < RACY_WINDOW_NS
            if fresh is not None and not racy:
                fresh[prefix] = hit
            files = []
            lookup = os.stat
            for name, kind in kept:
                if kind == FILE:
                    try:
                        st = lookup(name, dir_fd=fd)
                    except OSError:
                        continue  # gone since it was listed
                    if st.st_mode & _FORMAT == _REGULAR:
                        files.append((name, st))
        finally:
            os.close(fd)
        yield prefix, str(directory), files
        for name, kind in kept:
            if kind == FILE:
                continue
            path = f"{directory}/{name}"
            rel = prefix + name
            child = Path(os.path.realpath(path)) if kind == LINKED_DIR else real / name
            if child in ancestors:
                warnings.append(f"skipped {rel}: a link back into its own parent (a loop)")
                continue
            sub = Path(path)
            stack.append((sub, rel + "/", rules.enter(sub, rel + "/"), child, ancestors | {child}))


def check_name(rel: str) -> None:
    """Raise SyncError naming `rel` if it is not valid UTF-8 (Linux allows any bytes in a
    name; gpuhop sends names as text, and a job on another host could not recreate it)."""
    try:
        rel.encode()
    except UnicodeEncodeError:
        shown = os.fsencode(rel).decode("utf-8", "backslashreplace")
        raise SyncError(
            f"{shown}: the file name is not valid UTF-8; rename it, or add it to .gpuhopignore"
        ) from None


def _list_dir(
    directory: Path, prefix: str, rules: IgnoreRules, root: Path, warnings: list[str]
) -> list[tuple[str, int]]:
    """The entries of one directory that are sent: (name, kind)."""
    try:
        with os.scandir(directory) as it:
            entries = list(it)
    except OSError as e:
        raise SyncError(f"cannot read directory {directory}: {e.strerror}") from None
    kept = []
    for entry in entries:
        rel = prefix + entry.name
        is_link = entry.is_symlink()
        try:
            st = os.stat(entry.path)
        except FileNotFoundError:
            if is_link:
                warnings.append(f"skipped {rel}: a broken link")
            continue
        except OSError as e:
            warnings.append(f"skipped {rel}: {e.strerror}")  # e.g. a link to itself
            continue
        is_dir = stat.S_ISDIR(st.st_mode)
        if rules.ignored(rel, is_dir):
            continue
        check_name(rel)
        if is_link:
            target = Path(os.path.realpath(entry.path))
            if not target.is_relative_to(root):
                raise SyncError(
                    f"{rel} is a link to {target}, outside the work dir; add it to"
                    " .gpuhopignore (or copy what it points to into the work dir)"
                )
        if is_dir:
            kept.append((entry.name, LINKED_DIR if is_link else DIR))
        elif stat.S_ISREG(st.st_mode):
            kept.append((entry.name, FILE))
    return kept


def scan(
    root: Path,
    cache_dir: Path | None = None,
    on_hash: Callable[[int], None] | None = None,
    on_hashed: Callable[[FileEntry], None] | None = None,
) -> ScanResult:
    """Walk `root` and hash what changed since the last scan. `on_hashed` hears each file
    hashed, as soon as it is (from a hashing thread)."""
    started = time.perf_counter()
    if not root.is_dir():
        raise SyncError(f"work dir {root} is not a directory")
    cache = HashCache(cache_path_for(cache_dir, root) if cache_dir else None)
    scan_ns = time.time_ns()
    warnings: list[str] = []
    known: list[FileEntry] = []
    todo: list[tuple[str, str, os.stat_result]] = []
    listings: Listings = {}
    entries = cache.entries
    for prefix, directory, found in walk(root, warnings, cache.listings, listings, scan_ns):
        # HashCache.lookup, inline: this loop runs once per file of the tree on every sync.
        for name, st in found:
            rel = prefix + name
            hit = entries.get(rel)
            if (
                hit is not None
                and hit[1] == st.st_mtime_ns
                and hit[0] == st.st_size
                and hit[3] == st.st_ino
                and hit[2] == st.st_ctime_ns
            ):
                known.append(
                    FileEntry(
                        rel, f"{directory}/{name}", hit[0], hit[4], st.st_mode & stat.S_IXUSR != 0
                    )
                )
            else:
                todo.append((rel, f"{directory}/{name}", st))

    def hash_one(item: tuple[str, str, os.stat_result]) -> FileEntry:
        rel, abspath, st = item
        try:
            digest = hash_file(abspath)
        except OSError as e:
            raise SyncError(f"cannot read {rel}: {e.strerror}") from None
        if on_hash is not None:
            on_hash(st.st_size)
        entry = FileEntry(rel, abspath, st.st_size, digest, _executable(st))
        if on_hashed is not None:
            on_hashed(entry)
        return entry

    if len(todo) > 8:
        # hashlib releases the GIL on large reads, so threads help on a cold cache.
        from concurrent.futures import ThreadPoolExecutor  # loads logging: only then

        with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
            fresh = list(pool.map(hash_one, todo))
    else:
        fresh = [hash_one(t) for t in todo]
    new = []
    for item, entry in zip(todo, fresh, strict=True):
        hit = entries.get(entry.path)
        if hit is None or hit[4] != entry.digest:
            new.append(entry)
        cache.remember(entry.path, item[2], entry.digest, scan_ns)
    known += fresh
    known.sort()  # by path: FileEntry is a tuple, its path first (and each path once)
    files = known
    removed = cache.prune({f.path for f in files})
    raw = tree_bytes((f.path, f.digest, f.size, f.executable) for f in files)
    digest = hashlib.sha256(raw).hexdigest()
    previous = cache.tree
    cache.name_tree(digest)
    cache.replace_listings(listings)
    cache.save()
    seconds = time.perf_counter() - started
    return ScanResult(
        files, len(fresh), seconds, warnings, raw, digest, Since(previous, removed, fresh, new)
    )


def _executable(st: os.stat_result) -> bool:
    return bool(st.st_mode & stat.S_IXUSR)
