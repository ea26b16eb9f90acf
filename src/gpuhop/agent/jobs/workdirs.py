"""Runs in the agent: a job's files made ready before it starts, from its copy of the tree
(`tree.json` in its job dir)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

from gpuhop.agent.storage.blobs import BlobStore
from gpuhop.agent.storage.checkouts import CheckoutStore, placed
from gpuhop.agent.storage.treefile import read_entries
from gpuhop.api import ManifestEntry
from gpuhop.home import JobPaths


def materialise(
    jp: JobPaths,
    blobs: BlobStore,
    checkouts: CheckoutStore | None,
    no_view: str | None,
    digest: str | None = None,
) -> Path | None:
    """Give the job its files: the tree's shared checkout, which the backend shows the job
    through a writable overlay (returned), or, where the backend has no such view (`no_view`
    says why), a copy of every file in the job's work dir (None). Either way the job can
    never modify the stored blobs. `digest` is the tree's, as recorded at submit; without it
    (a job from an older agent) the job's copy of the tree is hashed to find it."""
    for d in (jp.work, jp.artifacts, jp.checkpoints):
        d.mkdir(parents=True, exist_ok=True)
    view = _files(jp, blobs, checkouts, no_view, digest) if jp.tree.exists() else None
    # After the last copy: what the job writes later is newer (see services/workdir.py).
    jp.materialised.touch()  # sets the mtime to now on a retry's second making too
    return view


def _entries(jp: JobPaths) -> Iterator[ManifestEntry]:
    # The tree is read an entry at a time: a big one is never in memory whole.
    with open(jp.tree, "rb") as f:
        for item in read_entries(f):
            yield ManifestEntry.model_validate(item)


def _files(
    jp: JobPaths,
    blobs: BlobStore,
    checkouts: CheckoutStore | None,
    no_view: str | None,
    digest: str | None,
) -> Path | None:
    if checkouts is not None and no_view is None:
        if digest is None:
            with open(jp.tree, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
        return checkouts.ensure(digest, lambda: _entries(jp))
    # The files are copied one after another: on a 2-core ext4 host, 8 copying threads took
    # 5x longer.
    for entry, target in placed(jp.work, _entries(jp)):
        blobs.copy_to(entry.digest, target, entry.executable)
    return None
