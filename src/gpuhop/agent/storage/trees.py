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
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from gpuhop.agent.errors import ApiError, describe_errors
from gpuhop.agent.storage.blobs import BlobStore, durable
from gpuhop.api import ErrorCode, ManifestEntry, Tree
from gpuhop.api.models import MAX_MANIFEST_FILES, SHA256_RE


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

    def entries(self, digest: str) -> list[dict]:
        """The entries of a stored tree (checked on arrival; not re-validated here)."""
        entries: list[dict] = json.loads(self.path(digest).read_bytes())["entries"]
        return entries

    def store(self, raw: bytes) -> tuple[str, Tree]:
        """Check and keep an uploaded tree. Raises TreeError, MissingBlobs, or pydantic's
        ValidationError for a body that is not a tree."""
        checked = self._checked
        tree = _unchanged_checked(raw, checked) or Tree.model_validate_json(raw)
        check_paths([e.path for e in tree.entries])
        missing = self.blobs.missing([e.digest for e in tree.entries])
        if missing:
            raise MissingBlobs(missing)
        self._checked = {_key(e) for e in tree.entries}
        digest = hashlib.sha256(raw).hexdigest()
        dest = self.path(digest)
        with self._lock:
            self._touched[digest] = time.time()
            if not dest.exists():
                fd, name = tempfile.mkstemp(dir=self.tmp, prefix="tree-")
                with os.fdopen(fd, "wb") as f:
                    f.write(raw)
                    durable(f)
                os.replace(name, dest)
        return digest, tree


# An entry as its JSON gives it: path, digest, size, executable.
EntryKey = tuple[str, str, int, bool]
ENTRY_FIELDS = frozenset(ManifestEntry.model_fields)


def _key(e: ManifestEntry) -> EntryKey:
    return (e.path, e.digest, e.size, e.executable)


def _unchanged_checked(raw: bytes, checked: set[EntryKey]) -> Tree | None:
    """The tree in `raw`, if it is plainly a tree whose entries were each checked before,
    or are valid now; None for anything else, which the full check then refuses (or
    accepts) with its own words."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if type(body) is not dict or body.keys() != {"entries"} or type(body["entries"]) is not list:
        return None
    if len(body["entries"]) > MAX_MANIFEST_FILES:
        return None
    entries = []
    for e in body["entries"]:
        if type(e) is not dict or not e.keys() <= ENTRY_FIELDS:
            return None
        key = (e.get("path"), e.get("digest"), e.get("size"), e.get("executable", False))
        if tuple(map(type, key)) == (str, str, int, bool) and key in checked:
            entries.append(ManifestEntry.model_construct(None, **e))
            continue
        try:
            entries.append(ManifestEntry.model_validate(e))
        except ValidationError:
            return None
    return Tree.model_construct(None, entries=entries)


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
    except TreeError as e:
        raise ApiError(400, ErrorCode.bad_path, str(e)) from None
    except MissingBlobs as e:
        raise ApiError(409, ErrorCode.missing_blobs, str(e), {"missing": e.missing}) from None
