"""Runs on the user's machine: sending a work dir's tree to the agent, as the changes from
the tree this work dir last sent where the agent holds that one, else whole.

A re-sync after an edit then costs one request whatever the tree's size: the job's, with
the delta inside (a few entries, not 5,000, with the content of the files the last tree did
not have, up to 1 MiB of them; more are uploaded first). The agent applies the delta to its
own copy of the last tree, checks every blob the new tree names, and keeps it only if it
hashes to the digest this side computed (see `gpuhop.api.trees`), before it looks at the
job. An agent without that tree, or one the caller may not read, answers 409 missing_tree,
and the tree goes whole.

The delta is the scan's own account of what changed since the tree it made last (see
`gpuhop.client.sync.hashcache`): it is sent where that tree is the one this work dir last sent,
whose digest is kept per work dir under the cache dir (`trees/KEY`), 64 bytes written once
the agent took the tree.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gpuhop.api.trees import MAX_DELTA_ENTRIES, MAX_INLINE_BYTES
from gpuhop.client.errors import GpuhopError
from gpuhop.client.session import Session
from gpuhop.client.sync.upload import UploadProgress, changed_while_sent, send_files, send_tree
from gpuhop.client.sync.workdir import FileEntry, ScanResult

R = TypeVar("R")
# The record's first bytes; a record of the first format (which went on with the tree's
# entries) names its tree the same way.
MAGIC = b"gpuhop-tree-2\n"
FORMERLY = (b"gpuhop-tree-1\n",)


class LastTree:
    """The digest of the tree a work dir sent last."""

    @staticmethod
    def path_for(cache_dir: Path, root: Path) -> Path:
        key = hashlib.sha256(os.fsencode(root.resolve())).hexdigest()[:24]
        return cache_dir / "trees" / key

    @classmethod
    def digest_of(cls, cache_dir: Path | None, root: Path) -> str | None:
        if cache_dir is None:
            return None
        try:
            with open(cls.path_for(cache_dir, root), "rb") as f:
                head = f.read(len(MAGIC) + 65)
        except OSError:
            return None
        magic, digest = head[: len(MAGIC)], head[len(MAGIC) :]
        if (magic == MAGIC and len(digest) == 64) or (magic in FORMERLY and len(digest) == 65):
            digest = digest[:64]
            if all(c in b"0123456789abcdef" for c in digest):
                return digest.decode()
        return None

    @classmethod
    def save(cls, cache_dir: Path | None, root: Path, digest: str) -> None:
        """Record `digest` as the tree sent from `root` (best effort: it is a cache)."""
        if cache_dir is None:
            return
        path = cls.path_for(cache_dir, root)
        tmp = path.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(MAGIC + digest.encode())
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)


def post_with_tree(
    session: Session,
    root: Path,
    scanned: ScanResult,
    on_upload: UploadProgress | None,
    post: Callable[[dict[str, Any]], R],
) -> tuple[R, tuple[int, int, str]]:
    """Make sure the agent holds the tree of `scanned`, and post the request that needs it:
    `post(fields)` with `fields` added to its body. Where this work dir last sent the tree
    its previous scan made, the tree goes inside that request as its delta from that one
    (`tree_delta`: one request for an edit); else, or where the agent cannot take a delta,
    whole and first. Returns what `post` returned, and the files and bytes sent for the
    tree and how it went ("delta" or "whole"). The tree is recorded as the work dir's last."""
    last = LastTree.digest_of(session.cache_dir, root)
    made = _delta(session, scanned, on_upload) if last == scanned.previous else None
    if made is not None:
        delta, sent = made
        for attempt in (1, 2):
            try:
                answer = post({"tree_delta": delta})
            except GpuhopError as e:
                # An agent without the last tree, or one from before deltas in a job request
                # (which names the field it does not know): the whole tree.
                if e.code == "missing_tree" or (e.status == 422 and "tree_delta" in str(e)):
                    break
                if e.code == "bad_blob":
                    raise changed_while_sent(e) from None
                if e.code != "missing_blobs" or attempt == 2:
                    raise
                # Files the hash cache knew that this agent lacks (or no longer has).
                more = send_files(session, scanned.files, on_upload)
                sent = (sent[0] + more[0], sent[1] + more[1])
                continue
            LastTree.save(session.cache_dir, root, scanned.digest)
            return answer, (*sent, "delta")
    count, size = send_files(session, scanned.changed, on_upload)
    more = send_tree(session, scanned.tree, scanned.files, on_upload)
    answer = post({})
    LastTree.save(session.cache_dir, root, scanned.digest)
    return answer, (count + more[0], size + more[1], "whole")


def _delta(
    session: Session, scanned: ScanResult, on_upload: UploadProgress | None
) -> tuple[dict[str, Any], tuple[int, int]] | None:
    """The tree of `scanned` as a delta from the one its previous scan made, as the JSON of
    a `TreeDelta`, with the files new to that tree inside (or uploaded first, where they
    are large), and the files and bytes that makes; None where there is no previous tree or
    the delta is too large to be worth it."""
    changed, removed = scanned.changed, scanned.removed
    limit = min(MAX_DELTA_ENTRIES, max(64, len(scanned.files) // 4))
    if scanned.previous is None or len(changed) + len(removed) > limit:
        return None
    new = list({f.digest: f for f in scanned.new}.values())
    size = sum(f.size for f in new)
    inline: dict[str, str] = {}
    if size <= MAX_INLINE_BYTES:
        inline = _inline(new)
        sent = (len(new), size)
    else:
        sent = send_files(session, new, on_upload)
    delta = {
        "parent": scanned.previous,
        "digest": scanned.digest,
        # Files hashed again but unchanged (a touch, a racy one) are in too: no harm.
        "changed": [
            {"path": f.path, "digest": f.digest, "size": f.size, "executable": f.executable}
            for f in changed
        ],
        "removed": removed,
        "blobs": inline,
    }
    return delta, sent


def _inline(files: list[FileEntry]) -> dict[str, str]:
    """The content of `files` (a few, small), base64 by digest, read as the scan hashed
    them: one that changed since is refused by the agent (its bytes match no digest)."""
    blobs = {}
    for f in files:
        try:
            with open(f.abspath, "rb") as fh:
                blobs[f.digest] = base64.b64encode(fh.read(f.size + 1)).decode()
        except OSError as e:
            raise GpuhopError(f"cannot read {f.path}: {e.strerror}", code="bad_request") from None
    return blobs
