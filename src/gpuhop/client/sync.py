"""Runs on the user's machine: turns a work dir into a manifest of content-addressed files.

The walk honours `.gitignore` and `.gpuhopignore` at every level (git's rules: the deepest
file that has an opinion wins; an ignored directory is not entered). Hashes are cached per
work dir, keyed on size, mtime, ctime and inode, so re-scanning an unchanged tree costs a
stat per file. Files modified in the two seconds before a scan are not cached (git's
"racily clean" problem): their next scan hashes them again.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import stat
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

IGNORE_FILES = (".gitignore", ".gpuhopignore")
# Never worth sending; a `!pattern` in .gpuhopignore brings any of them back.
DEFAULT_IGNORES = (
    ".git/",
    ".hg/",
    ".svn/",
    "__pycache__/",
    "*.py[cod]",
    ".ipynb_checkpoints/",
    ".venv/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    "gpuhop-artifacts/",
)
RACY_WINDOW_NS = 2_000_000_000
CACHE_VERSION = 1


class SyncError(Exception):
    """The work dir cannot be synced as it is; the message names the file and what to do."""


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative, POSIX
    abspath: str
    size: int
    digest: str
    executable: bool


@dataclass
class ScanResult:
    files: list[FileEntry]
    hashed: int  # files whose hash was not in the cache
    seconds: float
    warnings: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def hash_file(path: str | os.PathLike[str]) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class HashCache:
    """relpath -> (size, mtime_ns, ctime_ns, inode, digest), stored with marshal."""

    def __init__(self, path: Path | None):
        self.path = path
        self.entries: dict[str, tuple[int, int, int, int, str]] = {}
        self.dirty = False
        if path is not None:
            try:
                data = marshal.loads(path.read_bytes())
                if isinstance(data, dict) and data.get("version") == CACHE_VERSION:
                    self.entries = data["entries"]
            except (OSError, ValueError, EOFError, TypeError, KeyError):
                self.entries = {}

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
            return
        self.entries[rel] = (*self.key(st), digest)
        self.dirty = True

    def prune(self, keep: set[str]) -> None:
        stale = self.entries.keys() - keep
        for rel in stale:
            del self.entries[rel]
        self.dirty = self.dirty or bool(stale)

    def save(self) -> None:
        if self.path is None or not self.dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(marshal.dumps({"version": CACHE_VERSION, "entries": self.entries}))
        os.replace(tmp, self.path)
        self.dirty = False


def cache_path_for(cache_dir: Path, root: Path) -> Path:
    key = hashlib.sha256(os.fsencode(root.resolve())).hexdigest()[:24]
    return cache_dir / "hashes" / f"{key}.marshal"


class IgnoreRules:
    """The ignore specs in force in one directory: (dir prefix, spec), outermost first."""

    def __init__(self, layers: tuple[tuple[str, pathspec.PathSpec], ...]):
        self.layers = layers

    @classmethod
    def root(cls, root: Path) -> IgnoreRules:
        base = cls((("", pathspec.GitIgnoreSpec.from_lines(DEFAULT_IGNORES)),))
        return base.enter(root, "")

    def enter(self, directory: Path, prefix: str) -> IgnoreRules:
        lines: list[str] = []
        for name in IGNORE_FILES:
            try:
                lines += (directory / name).read_text(errors="replace").splitlines()
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as e:
                raise SyncError(f"cannot read {directory / name}: {e.strerror}") from None
        if not lines:
            return self
        return IgnoreRules((*self.layers, (prefix, pathspec.GitIgnoreSpec.from_lines(lines))))

    def ignored(self, rel: str, is_dir: bool) -> bool:
        for prefix, spec in reversed(self.layers):
            sub = rel[len(prefix) :] + ("/" if is_dir else "")
            result = spec.check_file(sub)
            if result.include is not None:
                return bool(result.include)
        return False


def walk(root: Path, warnings: list[str]) -> Iterator[tuple[str, str, os.stat_result]]:
    """Yield (relpath, abspath, stat) for every file to send, in a stable order."""
    root = root.resolve()
    # Each directory carries the real paths of its ancestors: a link back into one of them
    # is a loop. A link to any other directory in the tree is sent as a copy at both paths.
    stack: list[tuple[Path, str, IgnoreRules, frozenset[Path]]] = [
        (root, "", IgnoreRules.root(root), frozenset({root}))
    ]
    while stack:
        directory, prefix, rules, ancestors = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name, reverse=True)
        except OSError as e:
            raise SyncError(f"cannot read directory {directory}: {e.strerror}") from None
        subdirs = []
        for entry in reversed(entries):
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
            if is_link:
                target = Path(os.path.realpath(entry.path))
                if not target.is_relative_to(root):
                    raise SyncError(
                        f"{rel} is a link to {target}, outside the work dir; add it to"
                        " .gpuhopignore (or copy what it points to into the work dir)"
                    )
            if is_dir:
                real = Path(os.path.realpath(entry.path))
                if real in ancestors:
                    warnings.append(f"skipped {rel}: a link back into its own parent (a loop)")
                    continue
                subdirs.append((Path(entry.path), rel + "/", ancestors | {real}))
            elif stat.S_ISREG(st.st_mode):
                yield rel, entry.path, st
        for path, sub_prefix, below in reversed(subdirs):
            stack.append((path, sub_prefix, rules.enter(path, sub_prefix), below))


def scan(
    root: Path,
    cache_dir: Path | None = None,
    on_hash: Callable[[int], None] | None = None,
) -> ScanResult:
    """Walk `root` and hash what changed since the last scan."""
    started = time.perf_counter()
    if not root.is_dir():
        raise SyncError(f"work dir {root} is not a directory")
    cache = HashCache(cache_path_for(cache_dir, root) if cache_dir else None)
    scan_ns = time.time_ns()
    warnings: list[str] = []
    known: list[FileEntry] = []
    todo: list[tuple[str, str, os.stat_result]] = []
    for rel, abspath, st in walk(root, warnings):
        digest = cache.lookup(rel, st)
        if digest is None:
            todo.append((rel, abspath, st))
        else:
            known.append(FileEntry(rel, abspath, st.st_size, digest, _executable(st)))

    def hash_one(item: tuple[str, str, os.stat_result]) -> FileEntry:
        rel, abspath, st = item
        try:
            digest = hash_file(abspath)
        except OSError as e:
            raise SyncError(f"cannot read {rel}: {e.strerror}") from None
        if on_hash is not None:
            on_hash(st.st_size)
        return FileEntry(rel, abspath, st.st_size, digest, _executable(st))

    # hashlib releases the GIL on large reads, so threads help on a cold cache.
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        fresh = list(pool.map(hash_one, todo)) if len(todo) > 8 else [hash_one(t) for t in todo]
    for item, entry in zip(todo, fresh, strict=True):
        cache.remember(entry.path, item[2], entry.digest, scan_ns)
    files = sorted(known + fresh, key=lambda f: f.path)
    cache.prune({f.path for f in files})
    cache.save()
    return ScanResult(files, len(fresh), time.perf_counter() - started, warnings)


def _executable(st: os.stat_result) -> bool:
    return bool(st.st_mode & stat.S_IXUSR)
