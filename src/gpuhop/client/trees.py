"""Runs on the user's machine: sending a work dir's tree to the agent, as the changes from
the tree this work dir last sent where the agent holds that one, else whole.

A re-sync after an edit then costs one request whatever the tree's size: the job's, with
the delta inside (a few entries, not 5,000, with the content of the files the last tree did
not have, up to 1 MiB of them; more are uploaded first). The agent applies the delta to its
own copy of the last tree, checks every blob the new tree names, and keeps it only if it
hashes to the digest this side computed (see `gpuhop.api.trees`), before it looks at the
job. An agent without that tree, or one the caller may not read, answers 409 missing_tree,
and the tree goes whole.

The last tree sent is kept per work dir under the cache dir (`trees/KEY`), beside the hash
cache: its digest (first, so that an unchanged tree reads only that), then its entries.
"""

from __future__ import annotations

import base64
import hashlib
import marshal
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from gpuhop.api.trees import (
    MAX_DELTA_ENTRIES,
    MAX_DELTA_PARENT_FILES,
    MAX_INLINE_BYTES,
    EntryTuple,
)
from gpuhop.client.errors import GpuhopError
from gpuhop.client.session import Session
from gpuhop.client.sync import FileEntry
from gpuhop.client.upload import UploadProgress, changed_while_sent, send_files, send_tree

R = TypeVar("R")
# The record's first bytes: a new format gets a new one, and an old record is ignored.
MAGIC = b"gpuhop-tree-1\n"


@dataclass
class LastTree:
    """The tree a work dir sent last: its digest and its entries, in path order."""

    digest: str
    entries: list[EntryTuple]

    @staticmethod
    def path_for(cache_dir: Path, root: Path) -> Path:
        key = hashlib.sha256(os.fsencode(root.resolve())).hexdigest()[:24]
        return cache_dir / "trees" / key

    @classmethod
    def digest_of(cls, cache_dir: Path | None, root: Path) -> str | None:
        """The last tree's digest alone (a read of its first bytes)."""
        if cache_dir is None:
            return None
        try:
            with open(cls.path_for(cache_dir, root), "rb") as f:
                head = f.read(len(MAGIC) + 64)
        except OSError:
            return None
        if len(head) != len(MAGIC) + 64 or not head.startswith(MAGIC):
            return None
        return head[len(MAGIC) :].decode("ascii", "replace")

    @classmethod
    def load(cls, cache_dir: Path | None, root: Path) -> LastTree | None:
        if cache_dir is None:
            return None
        try:
            data = cls.path_for(cache_dir, root).read_bytes()
            if data.startswith(MAGIC):
                digest = data[len(MAGIC) : len(MAGIC) + 64].decode("ascii")
                entries = marshal.loads(data[len(MAGIC) + 64 :])
                # Written by this module, but a cache: anything else is no record.
                if isinstance(entries, list) and all(
                    type(e) is tuple and len(e) == 4 for e in entries
                ):
                    return cls(digest, entries)
        except (OSError, ValueError, EOFError, TypeError):
            pass
        return None

    @classmethod
    def save(
        cls, cache_dir: Path | None, root: Path, digest: str, entries: list[EntryTuple]
    ) -> None:
        """Record the tree of `entries` as sent from `root` (best effort: it is a cache)."""
        if cache_dir is None:
            return
        path = cls.path_for(cache_dir, root)
        tmp = path.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(MAGIC + digest.encode() + marshal.dumps(entries))
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)


def delta_of(last: LastTree, entries: list[EntryTuple]) -> tuple[list[EntryTuple], list[str]]:
    """The entries of `entries` that `last` does not have as they are, and the paths of
    `last` that `entries` no longer has."""
    before, after = set(last.entries), set(entries)
    changed = [e for e in entries if e not in before]
    paths = {e[0] for e in changed}
    removed = [e[0] for e in last.entries if e not in after and e[0] not in paths]
    return changed, removed


def post_with_tree(
    session: Session,
    root: Path,
    tree: tuple[bytes, str],
    files: list[FileEntry],
    hashed: list[FileEntry],
    on_upload: UploadProgress | None,
    post: Callable[[dict[str, Any]], R],
) -> tuple[R, tuple[int, int, str]]:
    """Make sure the agent holds `tree` (its bytes and digest), the tree of `files`, of which
    `hashed` are the ones the scan hashed (new or changed, as a rule), and post the request
    that needs it: `post(fields)` with `fields` added to its body. Where this work dir sent
    a tree before, the tree goes inside that request as its delta from that one
    (`tree_delta`: one request for an edit); else, or where the agent cannot take a delta,
    whole and first. Returns what `post` returned, and the files and bytes sent for the
    tree and how it went ("delta" or "whole"). The tree is recorded as the work dir's last."""
    raw, digest = tree
    entries = entries_of(files)
    last = LastTree.load(session.cache_dir, root)
    if last is not None and last.digest != digest and len(last.entries) <= MAX_DELTA_PARENT_FILES:
        made = _delta(session, last, digest, entries, files, hashed, on_upload)
        if made is not None:
            delta, sent = made
            for attempt in (1, 2):
                try:
                    answer = post({"tree_delta": delta})
                except GpuhopError as e:
                    # An agent without the last tree, or one from before deltas in a job
                    # request (which names the field it does not know): the whole tree.
                    if e.code == "missing_tree" or (e.status == 422 and "tree_delta" in str(e)):
                        break
                    if e.code == "bad_blob":
                        raise changed_while_sent(e) from None
                    if e.code != "missing_blobs" or attempt == 2:
                        raise
                    # Files the hash cache knew that this agent lacks (or no longer has).
                    more = send_files(session, files, on_upload)
                    sent = (sent[0] + more[0], sent[1] + more[1])
                    continue
                LastTree.save(session.cache_dir, root, digest, entries)
                return answer, (*sent, "delta")
    count, size = send_files(session, hashed, on_upload)
    more = send_tree(session, raw, files, on_upload)
    answer = post({})
    LastTree.save(session.cache_dir, root, digest, entries)
    return answer, (count + more[0], size + more[1], "whole")


def entries_of(files: list[FileEntry]) -> list[EntryTuple]:
    return [(f.path, f.digest, f.size, f.executable) for f in files]


def _delta(
    session: Session,
    last: LastTree,
    digest: str,
    entries: list[EntryTuple],
    files: list[FileEntry],
    hashed: list[FileEntry],
    on_upload: UploadProgress | None,
) -> tuple[dict[str, Any], tuple[int, int]] | None:
    """The delta from `last` as the JSON of a `TreeDelta`, with the files the last tree did
    not have inside it (or uploaded first, where they are large), and the files and bytes
    that makes; None where the delta is too large to be worth it."""
    changed, removed = delta_of(last, entries)
    if len(changed) + len(removed) > min(MAX_DELTA_ENTRIES, max(64, len(files) // 4)):
        return None
    known = {d for _, d, _, _ in last.entries}
    new = list({f.digest: f for f in hashed if f.digest not in known}.values())
    size = sum(f.size for f in new)
    inline: dict[str, str] = {}
    if size <= MAX_INLINE_BYTES:
        inline = _inline(new)
        sent = (len(new), size)
    else:
        sent = send_files(session, new, on_upload)
    delta = {
        "parent": last.digest,
        "digest": digest,
        "changed": [{"path": p, "digest": d, "size": s, "executable": x} for p, d, s, x in changed],
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
