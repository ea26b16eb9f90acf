"""Runs in the agent: a work dir's tree sent as its changes from a tree the caller stored
(a re-sync), alone (POST /v1/trees/delta) or inside the job request it is for
(`SubmitRequest.tree_delta`): one code path for both.

Everything is checked before anything is stored: the parent is the caller's, each inline
file hashes to its digest, the caller holds every other new file, and the tree the delta
makes hashes to the digest the client named and names only files the agent has.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError
from gpuhop.agent.storage.trees import TreeTooLarge, manifest_errors
from gpuhop.api import ErrorCode, TreeStored
from gpuhop.api.models import TreeDelta

# 200,000 files at about 150 bytes each, with room to spare.
MAX_TREE_BYTES = 64 * 1024 * 1024
# One delta applied at a time (it holds its parent's entries, up to 50,000, in memory), so
# that many at once cost the agent no more than one.
_ONE_DELTA = threading.Lock()


def store_delta(rt: AgentContext, delta: TreeDelta, caller: Caller) -> TreeStored:
    """Store the tree `delta` makes, or raise ApiError naming what is wrong (nothing stored).
    The parent must be one this caller may read (stored by them, for a user who is not an
    admin): knowing a tree's digest is not holding its files. Else 409 missing_tree, and
    the client sends the whole tree."""
    parent = delta.parent
    if not rt.trees.has(parent) or (
        not caller.admin and rt.claims.unclaimed(caller.user, "tree", [parent])
    ):
        raise ApiError(
            409,
            ErrorCode.missing_tree,
            f"tree {parent} is not on the agent; send the whole tree",
            {"tree": parent},
        )
    inline = _decoded(delta.blobs)
    if not caller.admin:
        # The parent's blobs were this user's when they stored it (a tree is claimed only
        # then), and stay stored while it does: only the changed entries' need a look, and
        # those inline are proven by their bytes.
        named = list({e.digest for e in delta.changed if e.digest not in inline})
        unclaimed = rt.claims.unclaimed(caller.user, "blob", named)
        if unclaimed:
            raise missing_blobs(unclaimed)
    with _ONE_DELTA, manifest_errors():
        try:
            digest, tree = rt.trees.store_delta(delta, MAX_TREE_BYTES, inline)
        except TreeTooLarge as e:
            raise ApiError(413, ErrorCode.too_large, str(e)) from None
    if not caller.admin:
        rt.claims.claim(caller.user, "blob", list(inline))
        rt.claims.claim(caller.user, "tree", [digest])
    return TreeStored(digest=digest, files=tree.files, bytes=tree.bytes)


def missing_blobs(unclaimed: list[str]) -> ApiError:
    """The refusal of a tree that names files the caller has not uploaded."""
    return ApiError(
        409,
        ErrorCode.missing_blobs,
        f"{len(unclaimed)} blob(s) of this tree are not on the agent; upload them first",
        {"missing": unclaimed},
    )


def _decoded(blobs: dict[str, str]) -> dict[str, bytes]:
    """The files a delta carries, by digest; each must be base64 and hash to its digest."""
    decoded = {}
    for digest, text in blobs.items():
        try:
            data = base64.b64decode(text, validate=True)
        except binascii.Error:
            raise ApiError(422, ErrorCode.bad_request, f"blobs.{digest}: not base64") from None
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise ApiError(
                400,
                ErrorCode.bad_blob,
                f"blob {digest}: its content hashes to {actual}; it was rejected",
            )
        decoded[digest] = data
    return decoded
