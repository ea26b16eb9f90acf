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
    (a job from an older agent) the job's copy of the tree is hashed to find it.

    A retry continues in the work dir the earlier attempt left, as a process restarted on
    the same machine would: what that attempt wrote (a CSVLogger's rows, a ModelCheckpoint's
    best model) is there, and what it changed or removed of its tree stays so. So a work
    dir made once (`JobPaths.materialised`) is not made again: a copy is not copied over, an
    overlay's upper layer is the same dir, and the mark keeps its first time."""
    made = jp.materialised.exists()
    for d in (jp.work, jp.artifacts, jp.checkpoints):
        d.mkdir(parents=True, exist_ok=True)
    if not jp.tree.exists():
        view = None
    elif made and (checkouts is None or no_view is not None):
        view = None  # the copy the earlier attempt ran in, with what it wrote
    else:
        view = _files(jp, blobs, checkouts, no_view, digest)
    if not made:
        # After the last copy: what the job writes later is newer (see services/workdir.py).
        jp.materialised.touch()
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
