"""A work dir's tree as both sides write it, and the bounds of a tree sent as a delta
(`gpuhop.api.models.TreeDelta`).

Runs on both sides, with the standard library only (a submit imports no pydantic). The
client names a tree by the sha256 of its bytes; a tree sent as a delta is written out by
the agent, so both write it here, byte for byte the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from json.encoder import encode_basestring_ascii

# A delta past this many changes is refused; the client sends the whole tree instead.
MAX_DELTA_ENTRIES = 20_000
# A delta is taken only against a tree of at most this many files (the agent holds the
# parent's entries in memory to apply it); a larger tree is always sent whole.
MAX_DELTA_PARENT_FILES = 50_000
# New files up to this many bytes in all may come inside the delta (base64), so that an
# edit costs one request, not an upload and then the delta.
MAX_INLINE_BYTES = 1 << 20

# One file of a tree: path, digest, size, executable.
EntryTuple = tuple[str, str, int, bool]


def tree_bytes(entries: Iterable[EntryTuple]) -> bytes:
    """The canonical bytes of a tree of `entries` (given in path order, each digest a sha256
    in hex, as checked on both sides): what `json.dumps({"entries": [{"path": .., "digest":
    .., "size": .., "executable": ..}, ..]}, separators=(",", ":"))` gives, written without
    making a dict per entry (a tree of 5,000 files is written on every sync)."""
    quote = encode_basestring_ascii
    entry = '{"path":%s,"digest":"%s","size":%d,"executable":%s}'
    parts = [entry % (quote(p), d, s, "true" if x else "false") for p, d, s, x in entries]
    return ('{"entries":[' + ",".join(parts) + "]}").encode()
