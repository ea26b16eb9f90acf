"""The wire model of a tree sent as its changes from another the agent holds.

Runs in the agent (the client writes the same fields as plain JSON: see
`gpuhop.client.trees`).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from gpuhop.api.base import StrictModel
from gpuhop.api.models import SHA256_RE, ManifestEntry
from gpuhop.api.trees import MAX_DELTA_ENTRIES, MAX_INLINE_BYTES


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
