"""Runs in the agent: stored work-dir trees (manifests), named by the sha256 of their bytes.

A tree is checked once, when it arrives: safe unique paths, no file that is also a
directory, every blob present; a re-sync checks each entry's own fields only where it differs
from the last tree stored. Jobs then name a tree by digest, so an unchanged project is never
re-sent or re-checked. Trees, like blobs, are written by atomic rename, and like
blobs are protected from garbage collection for a while after anyone asked about or stored
them (see `BlobStore.remove`), so a job submitted right after its tree arrived finds it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpuhop.agent.errors import ApiError, describe_errors
from gpuhop.agent.storage.blobs import BlobStore, durable
from gpuhop.agent.storage.treefile import TreeFileError, read_entries
from gpuhop.api import ErrorCode
from gpuhop.api.models import MAX_MANIFEST_FILES, SHA256_RE, ManifestEntry

TREE_TOO_LARGE = (
    "the tree (the list of the work dir's files) is over {mib} MiB, the most the agent"
    " takes: leave generated or bulky files out of the work dir (.gpuhopignore) and push data"
    " as a dataset (gpuhop data push)"
)


class TreeError(ValueError):
    """A tree that is malformed; the message names the offending path."""


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
        # The entries of the last tree stored, each checked then: the next tree (a re-sync
        # of the same project) checks only the entries that are not among them.
        self._checked: set[EntryKey] = set()

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

    def store(self, upload: TreeUpload) -> tuple[str, TreeSummary]:
        """Check and keep an uploaded tree, read from its file one entry at a time. An entry
        the last stored tree had, as it had it, was checked then and is not again (a re-sync
        of the same project checks only what changed). Raises TreeError, MissingBlobs, or
        pydantic's ValidationError for a body that is not a tree."""
        upload.file.flush()
        upload.file.seek(0)
        checked = self._checked
        keys: list[EntryKey] = []
        paths: list[str] = []
        digests: set[str] = set()
        size = 0
        for index, item in enumerate(read_entries(upload.file)):
            if index >= MAX_MANIFEST_FILES:
                raise TreeFileError(f"entries: a tree lists at most {MAX_MANIFEST_FILES} files")
            key = _plain_key(item)
            if key is None or key not in checked:
                try:
                    key = _key(ManifestEntry.model_validate(item))
                except ValidationError as e:
                    raise TreeFileError(describe_errors(_at(e, index))) from None
            if len(keys) < REMEMBER_ENTRIES:
                keys.append(key)
            paths.append(key[0])
            digests.add(key[1])
            size += key[2]
        files = len(paths)
        check_paths(paths)
        del paths
        missing = self.blobs.missing(sorted(digests))
        if missing:
            raise MissingBlobs(missing)
        self._checked = set(keys) if files <= REMEMBER_ENTRIES else set()
        digest = upload.sha256.hexdigest()
        dest = self.path(digest)
        with self._lock:
            self._touched[digest] = time.time()
            if not dest.exists():
                durable(upload.file)
                os.replace(upload.name, dest)
        return digest, TreeSummary(files, size, sorted(digests))


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
ENTRY_FIELDS = frozenset(ManifestEntry.model_fields)
# The entries of a tree up to this many are remembered (as checked) for the next tree; a
# bigger one is checked in full each time rather than held in memory.
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
