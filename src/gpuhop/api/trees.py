"""A work dir's tree as both sides write it, and a tree given as its changes from another.

Runs on both sides. The client names a tree by the sha256 of its bytes; a tree sent as a
delta is written out by the agent, so both write it here, byte for byte the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from json.encoder import encode_basestring_ascii

from pydantic import Field, field_validator

from gpuhop.api.base import StrictModel
from gpuhop.api.models import SHA256_RE, ManifestEntry

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
    """The canonical bytes of a tree of `entries` (given in path order): what
    `json.dumps({"entries": [{"path": .., "digest": .., "size": .., "executable": ..}, ..]},
    separators=(",", ":"))` gives, written without making a dict per entry (a tree of
    5,000 files is written on every sync)."""
    quote = encode_basestring_ascii
    parts = [
        f'{{"path":{quote(p)},"digest":{quote(d)},"size":{int(s)},'
        f'"executable":{"true" if x else "false"}}}'
        for p, d, s, x in entries
    ]
    return ('{"entries":[' + ",".join(parts) + "]}").encode()


class TreeDelta(StrictModel):
    """A new tree as its changes from `parent`, a tree the agent holds and the caller may
    read: entries added or changed, paths removed. The agent writes the new tree out
    (`tree_bytes`) and keeps it only if it hashes to `digest`, the client's own name for it.
    `blobs`: the content of new files (digest -> base64), up to MAX_INLINE_BYTES in all,
    each checked against its digest as it is stored."""

    parent: str
    digest: str
    changed: list[ManifestEntry] = Field(default_factory=list, max_length=MAX_DELTA_ENTRIES)
    removed: list[str] = Field(default_factory=list, max_length=MAX_DELTA_ENTRIES)
    blobs: dict[str, str] = Field(default_factory=dict)

    @field_validator("blobs")
    @classmethod
    def _blobs(cls, v: dict[str, str]) -> dict[str, str]:
        for digest in v:
            if not SHA256_RE.match(digest):
                raise ValueError(f"{digest[:80]!r} is not a sha256 hex digest")
        if sum(map(len, v.values())) * 3 // 4 > MAX_INLINE_BYTES:
            raise ValueError(
                f"more than {MAX_INLINE_BYTES >> 20} MiB of files inline; upload them first"
            )
        return v

    @field_validator("parent", "digest")
    @classmethod
    def _sha256(cls, v: str) -> str:
        if not SHA256_RE.match(v):
            raise ValueError(f"{v[:80]!r} is not a sha256 hex digest")
        return v
