"""What a job wrote, as the agent lists it: artifacts (`ArtifactEntry`) and the files it
created or changed in its work dir (`WorkdirEntry`).

Runs on both sides. Pydantic and the standard library only.
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from gpuhop.api.base import WireModel


class ArtifactEntry(WireModel):
    """A file a job left in its artifacts dir. Linux allows any bytes in a name, and JSON
    carries only text: a name that is not UTF-8 comes as `raw`, its exact bytes
    percent-encoded, with `path` showing them as `\\xNN` for people. Either way the file is
    fetched at `artifacts/` + `quote(name_bytes())`."""

    path: str
    size: int
    mtime: float
    raw: str | None = None

    def name_bytes(self) -> bytes:
        return unquote_to_bytes(self.raw) if self.raw is not None else self.path.encode()


class WorkdirEntry(ArtifactEntry):
    """A file the job created or changed in its work dir. `base` is the sha256 of the synced
    file it replaced (None for a new file): a pull replaces only a local file still equal to
    it, never local edits."""

    base: str | None = None
