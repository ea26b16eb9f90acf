"""Runs in the agent: stored work-dir trees (manifests), named by the sha256 of their bytes.

A tree is checked once, when it arrives: safe unique paths, no file that is also a
directory, every blob present; a re-sync checks each entry's own fields only where it differs
from the last tree stored. A re-sync may also come as a delta (`TreeDelta`): the changes
from a tree the agent holds, which the agent applies and writes out itself. Jobs then name
a tree by digest, so an unchanged project is never re-sent or re-checked. Trees, like
blobs, are written by atomic rename, and like blobs are protected from garbage collection
for a while after anyone asked about or stored them (see `BlobStore.remove`), so a job
submitted right after its tree arrived finds it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpuhop.agent.errors import ApiError, describe_errors
from gpuhop.agent.storage import settle
from gpuhop.agent.storage.blobs import BlobStore
from gpuhop.agent.storage.treefile import TreeFileError, read_entries
from gpuhop.api import ErrorCode
from gpuhop.api.models import MAX_MANIFEST_FILES, SHA256_RE, ManifestEntry, TreeDelta
from gpuhop.api.trees import MAX_DELTA_PARENT_FILES, tree_bytes

TREE_TOO_LARGE = (
    "the tree (the list of the work dir's files) is over {mib} MiB, the most the agent"
    " takes: leave generated or bulky files out of the work dir (.gpuhopignore) and push data"
    " as a dataset (gpuhop data push)"
)


class TreeError(ValueError):
    """A tree that is malformed; the message names the offending path."""


class MissingTree(LookupError):
    """The tree a delta is against is not stored (any more), or is too large to take one:
    the client sends the whole tree."""

    def __init__(self, digest: str, why: str = "not on the agent"):
        super().__init__(f"tree {digest} is {why}; send the whole tree")
        self.digest = digest


class MissingBlobs(LookupError):
    def __init__(self, missing: list[str]):
        super().__init__(f"{len(missing)} file(s) of the tree have not been uploaded")
        self.missing = missing


class TreeStore:
    def __init__(self, root: Path, tmp: Path, blobs: BlobStore):
        self.root = root
        self.tmp = tmp
        self.blobs = blobs
        self._touched: dict[str, float] = {}
        self._lock = threading.Lock()
        # The entries of the trees stored (or read for a delta) last, each checked then, by
        # tree digest, newest last: the next tree (a re-sync of the same project) checks
        # only the entries that are not among the newest's, and a delta against one of them
        # needs no read of its file. At most REMEMBER_ENTRIES entries in all.
        self._recent: OrderedDict[str, Entries] = OrderedDict()

    def path(self, digest: str) -> Path:
        if not SHA256_RE.match(digest):
            raise TreeError(f"{digest!r} is not a sha256 hex digest")
        return self.root / f"{digest}.json"

    def has(self, digest: str) -> bool:
        """Whether the tree is stored. Asking protects it from collection for a while."""
        path = self.path(digest)
        with self._lock:
            self._touched[digest] = time.time()
            return path.is_file()

    def digests(self) -> list[str]:
        return [p.stem for p in self.root.glob("*.json") if SHA256_RE.match(p.stem)]

    def remove(self, digest: str, untouched_since: float, dry_run: bool = False) -> int | None:
        """Remove a tree unless it was asked about or stored at or after `untouched_since`.
        Returns the bytes freed, or None if it was kept."""
        path = self.path(digest)
        with self._lock:
            if self._touched.get(digest, 0.0) >= untouched_since:
                return None
            try:
                st = path.stat()
            except FileNotFoundError:
                return None
            if st.st_mtime >= untouched_since:
                return None
            if not dry_run:
                self._touched.pop(digest, None)
                path.unlink(missing_ok=True)
            return st.st_size

    def entries(self, digest: str) -> Iterator[dict[str, Any]]:
        """The entries of a stored tree, read one at a time (checked on arrival; not
        re-validated here)."""
        with open(self.path(digest), "rb") as f:
            yield from read_entries(f)

    def receive(self, limit: int, refusal: str = TREE_TOO_LARGE) -> TreeUpload:
        """A temp file for a tree arriving (see TreeUpload); `store` it, then `close` it."""
        return TreeUpload(self.tmp, limit, refusal)

    def store(
        self, upload: TreeUpload, unclaimed: Callable[[list[str]], list[str]] | None = None
    ) -> tuple[str, TreeSummary]:
        """Check and keep an uploaded tree, read from its file one entry at a time. An entry
        the last stored tree had, as it had it, was checked then and is not again (a re-sync
        of the same project checks only what changed). Raises TreeError, MissingBlobs, or
        pydantic's ValidationError for a body that is not a tree.

        `unclaimed` (for a user who is not an admin) names the blobs of those given that
        the user never sent: missing as much as those stored by no one (see
        gpuhop.agent.storage.claims), and refused alike, so that the answer never tells
        which of them another user stored."""
        upload.file.flush()
        upload.file.seek(0)
        with self._lock:
            checked = next(reversed(self._recent.values()), {})
        kept: Entries = {}
        paths: list[str] = []
        digests: set[str] = set()
        size = 0
        for index, item in enumerate(read_entries(upload.file)):
            if index >= MAX_MANIFEST_FILES:
                raise TreeFileError(f"entries: a tree lists at most {MAX_MANIFEST_FILES} files")
            key = _plain_key(item)
            if key is None or checked.get(key[0]) != key:
                try:
                    key = _key(ManifestEntry.model_validate(item))
                except ValidationError as e:
                    raise TreeFileError(describe_errors(_at(e, index))) from None
            if index < REMEMBER_ENTRIES:
                kept[key[0]] = key
            paths.append(key[0])
            digests.add(key[1])
            size += key[2]
        files = len(paths)
        check_paths(paths)
        del paths
        missing = self.blobs.missing(sorted(digests))
        if unclaimed is not None:
            missing = sorted({*missing, *unclaimed(sorted(digests))})
        if missing:
            raise MissingBlobs(missing)
        digest = upload.sha256.hexdigest()
        dest = self.path(digest)
        with self._lock:
            self._touched[digest] = time.time()
            if not dest.exists():
                settle.durable(upload.file)
                os.replace(upload.name, dest)
        if files <= REMEMBER_ENTRIES:
            self._remember(digest, kept)
        return digest, TreeSummary(files, size, sorted(digests))

    def store_delta(
        self, delta: TreeDelta, limit: int, inline: dict[str, bytes] | None = None
    ) -> tuple[str, TreeSummary]:
        """Apply `delta` to its parent (which the caller may read: the caller checks) and keep
        the tree that makes, if it is the one the client named, with `inline`, the content of
        new files by digest (each checked against its digest already). The changed entries
        were checked as the request was parsed; the parent's were when it arrived; the whole
        tree's paths are checked again where the delta adds one. Every blob the tree names
        must be present or inline. Nothing is stored unless all of that holds. Raises
        MissingTree, TreeError, TreeFileError, TreeTooLarge, MissingBlobs."""
        inline = inline or {}
        entries = self._applied(delta)
        raw = tree_bytes(entries.values())
        if len(raw) > limit:
            raise TreeTooLarge(TREE_TOO_LARGE.format(mib=limit >> 20))
        digest = hashlib.sha256(raw).hexdigest()
        if digest != delta.digest:
            raise TreeFileError(
                f"digest: the delta against {delta.parent} makes tree {digest}, not"
                f" {delta.digest}; send the whole tree"
            )
        digests = list({e[1] for e in entries.values()})
        missing = [d for d in self.blobs.missing(digests) if d not in inline]
        if missing:
            raise MissingBlobs(missing)
        # The new files are flushed (in the blob store's settling threads) while the tree is
        # written and flushed here; the tree is named only once they are.
        pending = [self.blobs.put_later(d, data) for d, data in inline.items()]
        self._keep(digest, raw, pending)
        if len(entries) <= REMEMBER_ENTRIES:
            self._remember(digest, entries)
        size = sum(e[2] for e in entries.values())
        return digest, TreeSummary(len(entries), size, digests)

    def _applied(self, delta: TreeDelta) -> Entries:
        """The entries of the tree `delta` makes from its parent, in path order."""
        entries = dict(self._entries_of(delta.parent))
        removed = set(delta.removed)
        if len(removed) != len(delta.removed):
            raise TreeError(f"the delta removes {_twice(delta.removed)} twice")
        changed = [e.path for e in delta.changed]
        if len(set(changed)) != len(changed):
            raise TreeError(f"the delta lists {_twice(changed)} twice")
        for path in delta.removed:
            if entries.pop(path, None) is None:
                raise TreeError(f"the delta removes {path}, which its parent tree does not have")
        added = False
        for e in delta.changed:
            if e.path in removed:
                raise TreeError(f"the delta both removes and changes {e.path}")
            added = added or e.path not in entries
            entries[e.path] = (e.path, e.digest, e.size, e.executable)
        if len(entries) > MAX_MANIFEST_FILES:
            raise TreeFileError(f"entries: a tree lists at most {MAX_MANIFEST_FILES} files")
        if added:
            check_paths(list(entries))
            # A dict keeps its order: the parent's (by path) as long as no path was added.
            entries = dict(sorted(entries.items()))
        return entries

    def _keep(self, digest: str, raw: bytes, blobs: list[Future[int]]) -> None:
        """Write the tree `raw` under its digest, on disk before it is named, and after
        `blobs` (being stored) are."""
        dest = self.path(digest)
        with self._lock:
            self._touched[digest] = time.time()
            exists = dest.exists()
        if exists:
            for blob in blobs:
                blob.result()
            return
        fd, name = tempfile.mkstemp(dir=self.tmp, prefix="tree-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(raw)
                settle.durable(f)
            for blob in blobs:
                blob.result()
            os.replace(name, dest)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)
            raise

    def _entries_of(self, digest: str) -> Entries:
        """A stored tree's entries: from memory if it is a recent one, else from its file
        (checked when it arrived). Raises MissingTree if it is not stored."""
        with self._lock:
            hit = self._recent.get(digest)
            if hit is not None:
                self._recent.move_to_end(digest)
                return hit
        entries: Entries = {}
        try:
            for e in self.entries(digest):
                if len(entries) >= MAX_DELTA_PARENT_FILES:
                    raise MissingTree(digest, "too large to take a delta against")
                path = e["path"]
                entries[path] = (path, e["digest"], e["size"], e.get("executable", False))
        except FileNotFoundError:
            raise MissingTree(digest) from None
        if len(entries) <= REMEMBER_ENTRIES:
            self._remember(digest, entries)
        return entries

    def _remember(self, digest: str, entries: Entries) -> None:
        with self._lock:
            self._recent.pop(digest, None)
            self._recent[digest] = entries
            held = sum(map(len, self._recent.values()))
            while held > REMEMBER_ENTRIES and len(self._recent) > 1:
                held -= len(self._recent.popitem(last=False)[1])


@dataclass(frozen=True)
class TreeSummary:
    """What the agent keeps of a tree it checked: its figures, not its entries (on disk)."""

    files: int
    bytes: int
    digests: list[str]  # each once


class TreeTooLarge(Exception):
    """A body past its cap; the message (`refusal` with the cap in MiB) says what to do."""


class TreeUpload:
    """A manifest's bytes (a tree's, a dataset version's) as they arrive: written to a temp
    file and hashed, never held whole. Raises TreeTooLarge once they pass `limit`, with
    `refusal` (a format string of `mib`) as its message."""

    def __init__(self, tmp: Path, limit: int, refusal: str = TREE_TOO_LARGE):
        self.limit = limit
        self.refusal = refusal
        self.size = 0
        self.sha256 = hashlib.sha256()
        fd, self.name = tempfile.mkstemp(dir=tmp, prefix="tree-")
        self.file = os.fdopen(fd, "w+b")

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            raise TreeTooLarge(self.refusal.format(mib=self.limit >> 20))
        self.sha256.update(data)
        self.file.write(data)

    def read(self) -> bytes:
        """All of it (for a manifest that is parsed whole)."""
        self.file.flush()
        self.file.seek(0)
        return self.file.read()

    def close(self) -> None:
        """Drop the temp file (gone already if the tree was stored)."""
        self.file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.name)


def _at(error: ValidationError, index: int) -> list[dict[str, Any]]:
    """pydantic's errors for one entry, placed at `entries.INDEX` as for the whole tree."""
    return [{**e, "loc": ("entries", index, *e["loc"])} for e in error.errors()]


# An entry as its JSON gives it: path, digest, size, executable.
EntryKey = tuple[str, str, int, bool]
# A tree's entries by path.
Entries = dict[str, EntryKey]
ENTRY_FIELDS = frozenset(ManifestEntry.model_fields)
# The entries of trees up to this many in all are remembered (as checked) for the next
# tree; a bigger tree is checked in full each time rather than held in memory.
REMEMBER_ENTRIES = 50_000


def _key(e: ManifestEntry) -> EntryKey:
    return (e.path, e.digest, e.size, e.executable)


def _plain_key(item: object) -> EntryKey | None:
    """The entry's key if it is plainly an entry (a dict of entry fields of the right
    types), else None: the full check then refuses (or accepts) it in its own words."""
    if type(item) is not dict or not item.keys() <= ENTRY_FIELDS:
        return None
    key = (item.get("path"), item.get("digest"), item.get("size"), item.get("executable", False))
    if tuple(map(type, key)) != (str, str, int, bool):
        return None
    return key  # type: ignore[return-value]


def _twice(items: list[str]) -> str:
    seen: set[str] = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    return ""


def check_paths(paths: list[str], what: str = "tree") -> None:
    """No path twice, and no path that is both a file and a directory (of a tree, or of
    another listing of files: `what` names it in the error)."""
    files: set[str] = set()
    for path in paths:
        if path in files:
            raise TreeError(f"the {what} lists {path} twice")
        files.add(path)
    for path in files:
        parts = path.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in files:
                raise TreeError(f"the {what} has {parent} as both a file and a directory")


@contextlib.contextmanager
def manifest_errors() -> Iterator[None]:
    """What storing a manifest (a tree, a dataset version) raises, as the API's answers."""
    try:
        yield
    except ValidationError as e:
        raise ApiError(422, ErrorCode.bad_request, describe_errors(e.errors())) from None
    except TreeFileError as e:
        raise ApiError(422, ErrorCode.bad_request, str(e)) from None
    except TreeError as e:
        raise ApiError(400, ErrorCode.bad_path, str(e)) from None
    except MissingBlobs as e:
        raise ApiError(409, ErrorCode.missing_blobs, str(e), {"missing": e.missing}) from None
    except MissingTree as e:
        raise ApiError(409, ErrorCode.missing_tree, str(e), {"tree": e.digest}) from None
