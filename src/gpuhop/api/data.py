"""Wire models for datasets (chunked, versioned, mounted read-only into jobs) and for the
Python environments the agent builds for jobs. Runs on both sides; pydantic only.

Chunks travel in the chunk framing: per chunk a 45-byte header (raw sha256 of the chunk's
bytes, its size, the size on the wire, and the encoding: 0 raw, 1 zlib; plus PART for a
chunk of a file of several, which the agent keeps in that file rather than as a blob of its
own, and CONT where it follows the chunk before it in that file), then the payload.
"""

from __future__ import annotations

import struct
from datetime import datetime

from pydantic import Field, field_validator

from gpuhop.api.base import StrictModel, WireModel
from gpuhop.api.models import MAX_MANIFEST_FILES, SHA256_RE, validate_relpath

CHUNK_HEADER = struct.Struct(">32sIIB")
# In a chunk header's encoding: one chunk of a file of several, and one that follows the
# chunk sent before it in that file (see the docstring).
PART = 0x80
CONT = 0x40
# A chunk on the wire is at most this big (the chunker cuts at 4 MiB).
MAX_CHUNK_SIZE = 8 * 1024 * 1024
# How many chunk digests one /v1/chunks/missing request may carry (BlobCheck's limit).
MISSING_BATCH = MAX_MANIFEST_FILES


class DatasetFile(StrictModel):
    path: str
    size: int = Field(ge=0)
    executable: bool = False
    # The file's content is these chunks (blob digests), in order.
    chunks: list[str] = Field(max_length=1 << 20)

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return validate_relpath(v)

    @field_validator("chunks")
    @classmethod
    def _chunks(cls, v: list[str]) -> list[str]:
        for d in v:
            if not SHA256_RE.match(d):
                raise ValueError(f"chunk {d!r} is not a sha256 hex digest")
        return v


class DatasetManifest(StrictModel):
    """One version of a dataset: every file, as a list of chunk digests."""

    files: list[DatasetFile] = Field(max_length=MAX_MANIFEST_FILES)


class CachedData(WireModel):
    """A bucket's prefix cached on the agent's host for its user's jobs (`--data s3://...`),
    as its latest fetch listed it."""

    url: str  # s3://BUCKET/PREFIX/
    endpoint: str  # the endpoint it was read from ("aws": the default one)
    objects: int
    bytes: int
    last_used: datetime
    in_use: bool = False  # a queued or running job needs it: no eviction or gc takes it


class DatasetInfo(WireModel):
    name: str
    version: int
    digest: str  # sha256 of the manifest: equal digests, equal content
    files: int
    bytes: int
    chunks: int
    created_at: datetime
    # On a push: False when the content equals the latest version's (no new version made).
    new: bool = True
    # Who pushed it (None on an agent without users); only they, or an admin, change it.
    owner: str | None = None
    # Whom its owner shares it with: user names, or "*" for every user of the agent. Nobody
    # else sees it but admins (a dataset without an owner, from before owners, is everyone's).
    shared_with: list[str] = Field(default_factory=list)


class EnvInfo(WireModel):
    """A cached Python environment on the agent, built for one set of requirements."""

    id: str
    python: str  # the interpreter it was made from
    requirements: str
    created_at: datetime | None
    last_used: datetime | None
    build_seconds: float | None
    size: int
    ready: bool
    # Queued, starting or running jobs that use it (they keep it from being removed).
    jobs: list[str] = Field(default_factory=list)
