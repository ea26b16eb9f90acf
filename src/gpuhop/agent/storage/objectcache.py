"""Runs in the agent: the cache of bucket objects fetched for jobs (`--data s3://...`), one per
user, under `objects/` in the state dir.

An object is kept by its identity (endpoint, bucket, key, ETag, size) as one read-only file
in `objects/USER/by-id/`, so an unchanged object is never fetched twice and a changed one
(a new ETag or size) is a new entry. It is downloaded into `tmp/` and renamed into place only
when whole, so no job ever sees part of one. What a job sees of a prefix is a *view*: a tree
of hard links to those files, named by the digest of the listing it shows, in `views/` (built
in `tmp/`, renamed into place whole), and bound read-only into the job as a dataset's tree is.
An unchanged listing finds its view and costs no download and no link.

Each user's cache is their own (dirs named by a digest of the user): no user's listing,
names or bytes answer another's. The sandbox hides the whole dir from every job.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple


class ObjectId(NamedTuple):
    """What makes two objects the same bytes for the cache: where they are and their
    version as the store gives it (ETag), and their size."""

    endpoint: str
    bucket: str
    key: str
    etag: str
    size: int

    def digest(self) -> str:
        text = json.dumps(list(self), ensure_ascii=True)
        return hashlib.sha256(text.encode()).hexdigest()


class Listed(NamedTuple):
    """One object of a listing: its path in the job's view, and its identity."""

    path: str
    id: ObjectId


class ObjectCache:
    """One user's cache (`for_user`). Thread-safe: every change is a rename of a whole file
    or tree, and two fetches of one object write the same bytes."""

    def __init__(self, root: Path):
        self.root = root
        self.objects = root / "by-id"
        self.views = root / "views"
        self.tmp = root / "tmp"
        for d in (root.parent, root, self.objects, self.views, self.tmp):
            d.mkdir(mode=0o700, exist_ok=True)

    @classmethod
    def for_user(cls, home: Path, user: str) -> ObjectCache:
        """`user`'s cache under the state dir `home`."""
        return cls(home / "objects" / hashlib.sha256(user.encode()).hexdigest()[:32])

    def path(self, oid: ObjectId) -> Path:
        return self.objects / oid.digest()

    def has(self, oid: ObjectId) -> bool:
        try:
            return self.path(oid).stat().st_size == oid.size
        except OSError:
            return False

    def temp(self) -> Path:
        """A fresh name in `tmp/` to download one object to."""
        return self.tmp / f"part-{secrets.token_hex(8)}"

    def commit(self, oid: ObjectId, part: Path) -> None:
        """Take the whole object downloaded to `part` as `oid`'s; ValueError (and `part`
        removed) where its size is not the listing's."""
        try:
            size = part.stat().st_size
            if size != oid.size:
                raise ValueError(
                    f"{oid.key}: {size} bytes came, the listing said {oid.size} (did it change"
                    " during the fetch?)"
                )
            os.chmod(part, 0o444)
            os.replace(part, self.path(oid))
        finally:
            with contextlib.suppress(FileNotFoundError):
                part.unlink()

    @staticmethod
    def view_name(listing: Sequence[Listed]) -> str:
        """The name of the view that shows `listing`: the digest of its paths and identities."""
        text = json.dumps(sorted((e.path, list(e.id)) for e in listing), ensure_ascii=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def view(self, listing: Sequence[Listed]) -> Path | None:
        """The view of `listing` if it was made already."""
        path = self.views / self.view_name(listing)
        return path if path.is_dir() else None

    def make_view(self, listing: Sequence[Listed]) -> Path:
        """The view of `listing`, made of its cached objects (each must be here) if it is
        not already; returns its path."""
        path = self.views / self.view_name(listing)
        if path.is_dir():
            return path
        building = self.tmp / f"view-{secrets.token_hex(8)}"
        try:
            building.mkdir(mode=0o755)
            for entry in listing:
                target = building / entry.path
                target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                os.link(self.path(entry.id), target)
            try:
                os.rename(building, path)
            except OSError:
                if not path.is_dir():  # another fetch of the same listing won the race
                    raise
        finally:
            if building.exists():
                _remove(building)
        return path


def _remove(tree: Path) -> None:
    shutil.rmtree(tree, ignore_errors=True)
